"""Common tensor idioms on emulated CUDA tensors give what they give on the CPU: indexing and
setitem forms (a CUDA or host value into a view), `.data` assignment, in-place operators with
scalars and host 0-d tensors, joins, views, scatter/gather, sorting, reductions, nn modules moved
with `.to("cuda")`, state_dict round trips, legacy `.type(...)` conversions, printing, comparisons,
and host reads (`bool(t.any())`, `.item()`).

Each idiom is a function of a device name, run on "cpu" (plain torch) and on "cuda" under the
emulation; their results, read on the host, must agree. The `.data` and setitem idioms crashed the
emulation once (a CPU-only build's CUDA device guard, a Parameter left on the host).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from streamcheck.device import Device
from streamcheck.emulation.torch_cuda import Emulation

IDIOMS = {}


def idiom(fn):
    IDIOMS[fn.__name__] = fn
    return fn


def T(d, *shape, dtype=torch.float32):
    """A small tensor of distinct values, positive and negative, on device `d`."""
    n = math.prod(shape)
    return (torch.arange(n, dtype=torch.float32) * 0.37 - 1.1).reshape(shape).to(dtype).to(d)


# --- indexing ---
@idiom
def getitem_int(d):
    return T(d, 4, 3)[1]


@idiom
def getitem_slice(d):
    return T(d, 4, 3)[1:3, ::2]


@idiom
def getitem_ellipsis_none(d):
    return T(d, 2, 3, 4)[..., None, 1]


@idiom
def getitem_neg(d):
    return T(d, 5)[-1]


@idiom
def getitem_long_tensor(d):
    return T(d, 5, 2)[torch.tensor([0, 3, 3], device=d)]


@idiom
def getitem_host_long_tensor(d):
    return T(d, 5, 2)[torch.tensor([0, 3])]


@idiom
def getitem_list(d):
    return T(d, 5, 2)[[4, 1]]


@idiom
def getitem_bool_mask(d):
    x = T(d, 6)
    return x[x > 0]


@idiom
def getitem_mixed(d):
    return T(d, 4, 5)[1:, torch.tensor([0, 2], device=d)]


@idiom
def getitem_two_tensors(d):
    x = T(d, 4, 5)
    return x[torch.tensor([0, 1], device=d), torch.tensor([2, 3], device=d)]


@idiom
def getitem_0d_tensor_index(d):
    return T(d, 5)[torch.tensor(2, device=d)]


@idiom
def getitem_bool_scalar(d):
    return T(d, 3)[True]


# --- setitem ---
@idiom
def setitem_slice_scalar(d):
    x = T(d, 6)
    x[1:3] = 7.0
    return x


@idiom
def setitem_slice_cuda_value(d):
    x = torch.zeros(8, dtype=torch.long, device=d)
    ids = torch.full((4, 3), -1, device=d)
    ids[:, 0] = 5
    x[:4] = (ids != -1).sum(dim=1)
    return x


@idiom
def setitem_slice_host_value(d):
    x = T(d, 6)
    x[2:4] = torch.tensor([9.0, 8.0])
    return x


@idiom
def setitem_int_cuda_0d(d):
    x = T(d, 6)
    x[0] = x[5]
    return x


@idiom
def setitem_broadcast(d):
    x = T(d, 3, 4)
    x[:, 1] = torch.ones(3, device=d)
    return x


@idiom
def setitem_dtype_convert(d):
    x = torch.zeros(4, device=d)
    x[:2] = torch.tensor([1, 2], device=d)
    return x


@idiom
def setitem_mask_scalar(d):
    x = T(d, 6)
    x[x < 0] = 0.0
    return x


@idiom
def setitem_mask_tensor(d):
    x = T(d, 6)
    m = x > 0
    x[m] = x[m] * 2
    return x


@idiom
def setitem_index_tensor(d):
    x = T(d, 6)
    x[torch.tensor([0, 2], device=d)] = torch.tensor([5.0, 6.0], device=d)
    return x


@idiom
def setitem_ellipsis(d):
    x = T(d, 2, 3)
    x[...] = 1.5
    return x


@idiom
def setitem_list_values(d):
    x = T(d, 4)
    x[1:3] = torch.tensor([3.0, 4.0], device=d)
    return x


@idiom
def setitem_host_0d(d):
    x = T(d, 4)
    x[1] = torch.tensor(3.0)
    return x


# --- data ---
@idiom
def data_assign_param_cuda(d):
    lin = nn.Linear(3, 2, bias=False)
    pinned = T("cpu", 2, 3)
    if d == "cuda": pinned = pinned.pin_memory()
    lin.weight.data = pinned.to(d, non_blocking=True)
    x = T(d, 2, 3)
    with torch.no_grad():
        return x * lin.weight, lin.weight.device.type == d, isinstance(lin.weight, nn.Parameter)


@idiom
def data_assign_param_grad(d):
    lin = nn.Linear(3, 2, bias=False)
    lin.weight.data = T(d, 2, 3)
    return lin.weight.detach() + 1, lin.weight.requires_grad


@idiom
def data_assign_back_to_cpu(d):
    p = nn.Parameter(T(d, 3))
    p.data = p.data.cpu()
    return p.device.type, p.detach() + 1, isinstance(p, nn.Parameter)


@idiom
def data_read(d):
    p = nn.Parameter(T(d, 3))
    return p.data * 2


@idiom
def data_assign_plain(d):
    t = torch.zeros(3)
    t.data = T(d, 3)
    return t + 1


@idiom
def module_to_cuda_then_data(d):
    torch.manual_seed(0)
    m = nn.Linear(3, 3).to(d)
    m.weight.data.fill_(0.5)
    with torch.no_grad(): return m(T(d, 2, 3))


# --- in place, scalars ---
@idiom
def add_scalar_inplace(d):
    x = T(d, 4)
    x += 2
    x *= 0.5
    x -= 1
    x /= 3
    return x


@idiom
def add_host_0d_inplace(d):
    x = T(d, 4)
    x.add_(torch.tensor(2.0))
    return x


@idiom
def mul_host_0d(d):
    return T(d, 4) * torch.tensor(3.0)


@idiom
def host_0d_lhs(d):
    return torch.tensor(3.0) - T(d, 4)


@idiom
def clamp_(d):
    x = T(d, 5)
    x.clamp_(min=-0.5, max=0.5)
    return x


@idiom
def pow_scalar(d):
    return T(d, 4) ** 2


@idiom
def rpow(d):
    return 2 ** T(d, 4)


@idiom
def floordiv(d):
    return T(d, 4) // 0.5


@idiom
def int_ops(d):
    x = torch.arange(10, device=d)
    return x % 3, x // 3, x & 5, x >> 1


@idiom
def zero_and_fill(d):
    x = T(d, 4)
    x.zero_()
    y = T(d, 4)
    y.fill_(3)
    return x, y


@idiom
def fill_cuda_0d(d):
    x = T(d, 4)
    x.fill_(T(d, 3)[2])
    return x


@idiom
def copy_broadcast(d):
    x = torch.zeros(3, 4, device=d)
    x.copy_(T(d, 4))
    return x


# --- joins ---
@idiom
def cat(d):
    return torch.cat([T(d, 2, 3), T(d, 1, 3)])


@idiom
def cat_dim1(d):
    return torch.cat((T(d, 2, 3), T(d, 2, 1)), dim=1)


@idiom
def stack(d):
    return torch.stack([T(d, 3), T(d, 3) + 1], dim=1)


@idiom
def cat_empty(d):
    return torch.cat([T(d, 2), torch.empty(0, device=d)])


@idiom
def split_chunk(d):
    x = T(d, 6)
    return x.split(2), x.chunk(3), x.unbind()


@idiom
def clone(d):
    x = T(d, 3)
    y = x.clone()
    x.add_(1)
    return y


@idiom
def view_reshape(d):
    x = T(d, 2, 6)
    return x.view(3, 4), x.reshape(-1), x.t().reshape(12), x.flatten()


@idiom
def transpose_contig(d):
    return T(d, 2, 3).t().contiguous()


@idiom
def permute_expand(d):
    return T(d, 2, 3).permute(1, 0), T(d, 1, 3).expand(4, 3).sum(0)


@idiom
def squeeze_unsqueeze(d):
    return T(d, 3).unsqueeze(0).unsqueeze(-1).squeeze()


@idiom
def masked_fill_(d):
    x = T(d, 5)
    x.masked_fill_(x > 0, -1.0)
    return x


@idiom
def masked_fill(d):
    x = T(d, 5)
    return x.masked_fill(x < 0, float("-inf"))


@idiom
def scatter_(d):
    x = torch.zeros(3, 4, device=d)
    x.scatter_(1, torch.tensor([[0], [2], [3]], device=d), 1.0)
    return x


@idiom
def scatter_add(d):
    return torch.zeros(5, device=d).scatter_add(0, torch.tensor([0, 1, 1, 4], device=d), T(d, 4))


@idiom
def index_select(d):
    return T(d, 4, 3).index_select(0, torch.tensor([3, 0], device=d))


@idiom
def gather(d):
    return T(d, 3, 4).gather(1, torch.tensor([[0, 1], [2, 3], [1, 1]], device=d))


@idiom
def index_add_(d):
    x = torch.zeros(4, device=d)
    x.index_add_(0, torch.tensor([1, 1, 3], device=d), T(d, 3))
    return x


@idiom
def sort(d):
    v, i = T(d, 6).flip(0).sort()
    return v, i


@idiom
def sort_desc(d):
    return torch.sort(T(d, 2, 3), dim=1, descending=True)


@idiom
def topk(d):
    return T(d, 8).topk(3)


@idiom
def argmax(d):
    x = T(d, 3, 4)
    return x.argmax(), x.argmax(dim=1), x.max(dim=0)


@idiom
def argmax_item(d):
    return int(T(d, 7).argmax())


@idiom
def einsum(d):
    return torch.einsum("ij,jk->ik", T(d, 2, 3), T(d, 3, 4))


@idiom
def matmul(d):
    return T(d, 2, 3) @ T(d, 3, 2), torch.bmm(T(d, 2, 2, 3), T(d, 2, 3, 2))


@idiom
def softmax(d):
    return F.softmax(T(d, 2, 5), dim=-1), T(d, 5).log_softmax(0)


@idiom
def layer_norm(d):
    return F.layer_norm(T(d, 2, 4), (4,))


@idiom
def layer_norm_affine(d):
    return F.layer_norm(T(d, 2, 4), (4,), torch.ones(4, device=d), torch.zeros(4, device=d))


@idiom
def gelu_relu_silu(d):
    x = T(d, 5)
    return F.gelu(x), F.relu(x), F.silu(x), torch.tanh(x), torch.sigmoid(x)


@idiom
def dropout_eval(d):
    return F.dropout(T(d, 5), p=0.5, training=False)


@idiom
def cross_entropy(d):
    return F.cross_entropy(T(d, 3, 4), torch.tensor([0, 3, 1], device=d))


@idiom
def mse(d):
    return F.mse_loss(T(d, 4), torch.zeros(4, device=d))


@idiom
def linear_module(d):
    torch.manual_seed(0)
    m = nn.Linear(4, 2)
    m = m.to(d)
    with torch.no_grad(): return m(T(d, 3, 4))


@idiom
def linear_module_cuda(d):
    torch.manual_seed(0)
    m = nn.Linear(4, 2)
    if d == "cuda": m = m.cuda()
    with torch.no_grad(): return m(T(d, 3, 4))


@idiom
def embedding_module(d):
    torch.manual_seed(0)
    m = nn.Embedding(10, 3).to(d)
    with torch.no_grad(): return m(torch.tensor([[1, 2], [9, 0]], device=d))


@idiom
def layernorm_module(d):
    m = nn.LayerNorm(4).to(d)
    with torch.no_grad(): return m(T(d, 2, 4))


@idiom
def sequential_module(d):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(d)
    with torch.no_grad(): return m(T(d, 3, 4))


@idiom
def module_half(d):
    torch.manual_seed(0)
    m = nn.Linear(4, 2).to(d).half()
    return m.weight.dtype, m.weight.float().sum()


@idiom
def module_to_dtype_device(d):
    torch.manual_seed(0)
    m = nn.Linear(4, 2).to(device=d, dtype=torch.float64)
    return m.weight.dtype, m.weight.device.type == d == d


@idiom
def state_dict_roundtrip(d):
    torch.manual_seed(0)
    a = nn.Linear(3, 2).to(d)
    b = nn.Linear(3, 2).to(d)
    b.load_state_dict(a.state_dict())
    return b.weight.detach(), b.bias.detach()


@idiom
def state_dict_cpu_into_cuda(d):
    torch.manual_seed(0)
    a = nn.Linear(3, 2)
    b = nn.Linear(3, 2).to(d)
    b.load_state_dict(a.state_dict())
    return b.weight.detach(), b.weight.device.type == d == ("cpu" if d == "cpu" else "cuda")


@idiom
def state_dict_cuda_to_cpu(d):
    torch.manual_seed(0)
    a = nn.Linear(3, 2).to(d)
    b = nn.Linear(3, 2)
    b.load_state_dict({k: v.cpu() for k, v in a.state_dict().items()})
    return b.weight.detach()


@idiom
def new_tensor(d):
    x = T(d, 2)
    y = x.new_tensor([1.0, 2.0])
    return y, y.device.type == d


@idiom
def new_zeros_full(d):
    x = T(d, 2)
    return x.new_zeros(3), x.new_full((2,), 4.0), x.new_ones(2, dtype=torch.long), x.new_empty(2).fill_(1)


@idiom
def as_tensor_device(d):
    t = torch.as_tensor([1.0, 2.0], device=d)
    return t, t.device.type == d


@idiom
def as_tensor_from_tensor(d):
    t = torch.as_tensor(T("cpu", 3), device=d)
    return t, t.device.type == d


@idiom
def as_tensor_numpy(d):
    import numpy as np
    t = torch.as_tensor(np.arange(3.0), device=d)
    return t, t.device.type == d


@idiom
def from_numpy_to(d):
    import numpy as np
    return torch.from_numpy(np.arange(4.0)).to(d)


@idiom
def type_legacy(d):
    x = torch.arange(3)
    if d == "cuda": y = x.type(torch.cuda.FloatTensor)
    else: y = x.type(torch.FloatTensor)
    return y, y.dtype, y.device.type == d


@idiom
def type_string(d):
    x = T(d, 3)
    return (x.type().replace("cuda.", ""), x.type(torch.float64).dtype, x.type("torch.LongTensor").device.type,
            x.long().type(x.type()).dtype)


@idiom
def tensor_type_dtype(d):
    return T(d, 3).double().dtype, T(d, 3).long(), T(d, 3).bool(), T(d, 3).half().float()


@idiom
def printing(d):
    s = str(T(d, 3))
    return s.replace(", device='cuda:0'", "")


@idiom
def printing_scalar(d):
    return f"{T(d, 3).sum():.3f}", repr(T(d, 2, 2).sum()).replace(", device='cuda:0'", "")


@idiom
def printing_int(d):
    return str(torch.arange(3, device=d)).replace(", device='cuda:0'", "")


@idiom
def printing_empty(d):
    return str(torch.empty(0, device=d)).replace(", device='cuda:0'", "")


@idiom
def comparison_ops(d):
    a, b = T(d, 4), T(d, 4).flip(0)
    return a < b, a == b, a >= 0, torch.eq(a, b), a.ne(b), torch.maximum(a, b)


@idiom
def equal_allclose(d):
    a = T(d, 3)
    return torch.equal(a, a.clone()), torch.allclose(a, a + 1e-9), bool((a == a).all())


@idiom
def bool_any(d):
    a = T(d, 3)
    return bool(a.any()), bool((a > 100).any()), (a > 0).any().item(), bool(a.all())


@idiom
def if_tensor(d):
    a = T(d, 1)
    if a: return "yes"
    return "no"


@idiom
def item_float_int(d):
    a = T(d, 3)
    return a[0].item(), float(a[1]), int(a[2] * 10), a.sum().item()


@idiom
def tolist(d):
    return T(d, 2, 2).tolist()


@idiom
def numpy_via_cpu(d):
    return T(d, 3).cpu().numpy().tolist()


@idiom
def len_iter(d):
    x = T(d, 3, 2)
    return len(x), [r.sum() for r in x]


@idiom
def where(d):
    x = T(d, 4)
    return torch.where(x > 0, x, 0.0), torch.where(x > 0, x, torch.zeros_like(x))


@idiom
def where_one_arg(d):
    return torch.where(T(d, 4) > 0)


@idiom
def nonzero(d):
    return torch.nonzero(T(d, 4) > 0), (T(d, 4) > 0).nonzero(as_tuple=True)


@idiom
def unique(d):
    return torch.unique(torch.tensor([3, 1, 3, 2], device=d))


@idiom
def cumsum_prod(d):
    return T(d, 4).cumsum(0), T(d, 4).cumprod(0)


@idiom
def reductions(d):
    x = T(d, 3, 4)
    return x.sum(), x.mean(1), x.std(), x.var(0), x.norm(), x.amax(1), x.min(), x.prod(0)


@idiom
def arange_linspace(d):
    return torch.arange(0, 5, 2, device=d), torch.linspace(0, 1, 5, device=d), torch.eye(3, device=d)


@idiom
def full_like_zeros_like(d):
    x = T(d, 3)
    return torch.full_like(x, 2), torch.zeros_like(x), torch.ones_like(x, dtype=torch.long)


@idiom
def tensor_from_cuda_scalars(d):
    x = T(d, 3)
    return torch.tensor([x[0].item(), 1.0], device=d)


@idiom
def stack_0d(d):
    x = T(d, 3)
    return torch.stack([x[0], x[1]])


@idiom
def tril_triu(d):
    return torch.tril(T(d, 3, 3)), torch.triu(T(d, 3, 3), diagonal=1)


@idiom
def causal_mask(d):
    m = torch.ones(4, 4, device=d, dtype=torch.bool).tril()
    return T(d, 4, 4).masked_fill(~m, float("-inf")).softmax(-1)


@idiom
def repeat_tile(d):
    return T(d, 2).repeat(2, 2), T(d, 2).repeat_interleave(2), torch.tile(T(d, 2), (2,))


@idiom
def flip_roll(d):
    return T(d, 4).flip(0), T(d, 4).roll(1)


@idiom
def pad(d):
    return F.pad(T(d, 2, 2), (1, 1))


@idiom
def interpolate(d):
    return F.interpolate(T(d, 1, 1, 4), scale_factor=2, mode="nearest")


@idiom
def conv1d(d):
    torch.manual_seed(0)
    m = nn.Conv1d(1, 2, 3).to(d)
    with torch.no_grad(): return m(T(d, 1, 1, 6))


@idiom
def sdpa(d):
    q = T(d, 1, 2, 3, 4)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True)


@idiom
def one_hot(d):
    return F.one_hot(torch.tensor([0, 2], device=d), 3)


@idiom
def multinomial_seeded(d):
    g = torch.Generator(device=d)
    g.manual_seed(0)
    return torch.rand(3, device=d, generator=g).shape


@idiom
def to_other_dtype_same_device(d):
    x = T(d, 3)
    return x.to(torch.int32), x.to(x), x.to(d) is x


@idiom
def to_cpu_nonblocking(d):
    x = T(d, 3)
    y = x.to("cpu", non_blocking=True)
    torch.cuda.synchronize() if d == "cuda" else None
    return y


@idiom
def pinned_roundtrip(d):
    h = T("cpu", 4)
    if d == "cuda": h = h.pin_memory()
    y = h.to(d, non_blocking=True) * 2
    out = torch.empty(4, pin_memory=(d == "cuda"))
    out.copy_(y, non_blocking=True)
    if d == "cuda": torch.cuda.synchronize()
    return out


@idiom
def detach_requires_grad(d):
    x = T(d, 3).requires_grad_()
    return x.detach() * 2, x.requires_grad


@idiom
def no_grad_param(d):
    p = nn.Parameter(T(d, 3))
    with torch.no_grad(): p.mul_(2)
    return p.detach()


@idiom
def inference_mode(d):
    with torch.inference_mode(): return T(d, 3) * 2


@idiom
def deepcopy_tensor(d):
    import copy
    x = T(d, 3)
    y = copy.deepcopy(x)
    x.add_(1)
    return y, y.device.type == d


@idiom
def deepcopy_module(d):
    import copy
    torch.manual_seed(0)
    m = nn.Linear(2, 2).to(d)
    m2 = copy.deepcopy(m)
    return m2.weight.detach(), m2.weight.device.type == d == d


@idiom
def hash_dict_key(d):
    x = T(d, 2)
    dct = {x: 1}
    return dct[x]


@idiom
def in_list(d):
    x, y = T(d, 2), T(d, 2)
    return any(x is t for t in [y, x])


@idiom
def shape_size_numel(d):
    x = T(d, 2, 3)
    return x.shape, x.size(1), x.numel(), x.dim(), x.ndim, x.dtype, x.is_cuda == (d == "cuda")


@idiom
def get_device(d):
    x = T(d, 2)
    return x.get_device() if d == "cuda" else 0, x.device.index if d == "cuda" else 0


@idiom
def storage_share(d):
    x = T(d, 4)
    y = x[1:]
    return y.storage_offset(), x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


@idiom
def chunked_loop_accumulate(d):
    acc = torch.zeros(3, device=d)
    for i in range(4): acc += T(d, 3) * i
    return acc


@idiom
def amp_autocast(d):
    with torch.autocast(device_type=d, dtype=torch.bfloat16):
        y = T(d, 2, 3) @ T(d, 3, 2)
    return y.float().round(decimals=0), y.dtype


@idiom
def baddbmm_addmm(d):
    return torch.addmm(T(d, 2), T(d, 2, 3), T(d, 3, 2)), torch.baddbmm(T(d, 1, 2, 2), T(d, 1, 2, 3), T(d, 1, 3, 2))


@idiom
def numel_zero_ops(d):
    x = torch.empty(0, 3, device=d)
    return x.sum(0), x.shape


@idiom
def bucketize_searchsorted(d):
    b = torch.tensor([0.0, 1.0, 2.0], device=d)
    return torch.bucketize(T(d, 4), b), torch.searchsorted(b, T(d, 4))


@idiom
def histc_bincount(d):
    return torch.bincount(torch.tensor([0, 1, 1, 3], device=d))


@idiom
def max_scalar_tensor(d):
    x = T(d, 4)
    return torch.max(x, torch.tensor(0.0, device=d)), x.max().item()


@idiom
def complex_indexing_assign(d):
    x = torch.zeros(3, 4, device=d)
    x[1, 1:3] += 1
    x[:, -1] *= 2
    return x



def on_host(value):
    """A result as plain Python values read on the host (namedtuples of torch.return_types as tuples)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.detach().cpu().tolist())
    if isinstance(value, (tuple, list)):
        return tuple(on_host(v) for v in value)
    return value


def agree(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) or isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(agree(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-5 * max(1.0, abs(a), abs(b))
    return a == b


@pytest.mark.parametrize("name", list(IDIOMS))
def test_idiom_on_emulated_cuda_gives_what_it_gives_on_the_cpu(name):
    fn = IDIOMS[name]
    want = on_host(fn("cpu"))
    with Emulation(Device("sim", policy="sequential")):
        got = on_host(fn("cuda"))
    assert agree(want, got), f"{name}: cpu {want}\nemulated {got}"


def test_data_assignment_keeps_the_parameter_its_module_holds():
    with Emulation(Device("sim", policy="sequential")):
        lin = nn.Linear(3, 2, bias=False)
        weight = lin.weight
        weight.tag = "offloaded"  # an attribute of the user's, kept across the move
        lin.weight.data = torch.ones(2, 3).pin_memory().to("cuda", non_blocking=True)
        on_device = (lin.weight is weight, isinstance(weight, nn.Parameter), weight.device.type, weight.requires_grad,
                     weight.tag, [name for name, _ in lin.named_parameters()])
        with torch.no_grad():
            out = lin(torch.ones(1, 3, device="cuda")).tolist()
        weight.data = weight.data.cpu()  # and back to the host
        back = (lin.weight is weight, isinstance(weight, nn.Parameter), weight.device.type, weight.tag)
    assert on_device == (True, True, "cuda", True, "offloaded", ["weight"])
    assert out == [[3.0, 3.0]]
    assert back == (True, True, "cpu", "offloaded")
