"""Factories and Tensor methods a CPU-only torch refuses before any dispatch (`device="cuda"`, `.cuda()`,
`.to("cuda")`, `pin_memory=True`, `record_stream`, indexing with a CUDA guard, ...): a torch function
mode sends them to the emulation.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from ..device.objects import Region
from ..record.host_views import HostView
from .generators import EmulatedGenerator
from .operators import cpu_index, flatten_call, is_basic_index
from .tensors import CudaTensor, EmulatedStorage, PinnedTensor, byte_region, cpu_view, is_emulated


class FactoryMode(TorchFunctionMode):
    """Factories and conversions a CPU-only torch refuses before dispatch: `device="cuda"`,
    `.cuda()`, `.to("cuda")`, `pin_memory=True`, `.pin_memory()`, `record_stream(s)`."""

    def __init__(self, emulation):
        super().__init__()
        self.emulation = emulation

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_grad_enabled() and _needs_grad(args, kwargs):
            # Autograd is not emulated: a graph node on an emulated tensor asks a CPU-only build for a
            # CUDA stream and aborts the process. Forward passes run as under torch.no_grad();
            # backward() is refused in one line.
            self.emulation.notice(_NO_AUTOGRAD)
            with torch.no_grad():
                return self._call(func, args, kwargs)
        return self._call(func, args, kwargs)

    def _call(self, func, args, kwargs):
        generator = kwargs.get("generator")
        if type(generator) is EmulatedGenerator:
            # Taken here, at the call: past torch's binding the generator is a plain torch.Generator
            # (the same C++ object, a new Python one), no longer known as a CUDA one.
            kwargs = dict(kwargs, generator=generator.next_cpu_generator())
        handler = _METHODS.get(func)
        if handler is not None:
            return handler(self.emulation, func, args, kwargs)
        device_arg = kwargs.get("device")
        if device_arg is not None:
            target = device_arg if isinstance(device_arg, torch.device) else _maybe_device(device_arg)
            if target is not None and target.type == "cuda" and not any(type(a) is CudaTensor for a in args):
                return self.emulation.factory(func, args, kwargs, self.emulation.device_index(target))
        if kwargs.get("pin_memory"):
            return self.emulation.pinned_factory(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except NotImplementedError as exc:
            # A composite function whose C++ makes a tensor "like" a CUDA input (F.scaled_dot_product_attention's
            # causal mask): a CPU-only build has no CUDA kernel for it. Then the function is one kernel.
            if "'CUDA' backend" not in str(exc):
                raise
            flat, spec = flatten_call(args, kwargs)
            if not any(type(v) is CudaTensor for v in flat):
                raise
            return self.emulation.whole_function(func, flat, spec, exc)


_NO_AUTOGRAD = ("autograd is not emulated on the sim: operators on tensors that require grad ran as under "
                "torch.no_grad() (their results do not require grad), and backward() is refused; check the backward "
                "pass on a GPU")


def _needs_grad(args, kwargs) -> bool:
    """Whether an emulated tensor that requires grad is among the arguments (one level into lists)."""
    for values in (args, kwargs.values()):
        for value in values:
            kind = type(value)
            if kind is CudaTensor or kind is PinnedTensor:
                if value.requires_grad:
                    return True
            elif kind is list or kind is tuple:
                if any(is_emulated(v) and v.requires_grad for v in value):
                    return True
    return False


def _maybe_device(value):
    if isinstance(value, (str, int)):
        try:
            return torch.device(value) if isinstance(value, str) else torch.device("cuda", value)
        except RuntimeError:
            return None
    return None


def _to(emulation, func, args, kwargs):
    self = args[0]
    if len(args) > 1 and isinstance(args[1], torch.Tensor):  # .to(other): its device and dtype
        other = args[1]
        args, kwargs = (self, other.device, other.dtype) + tuple(args[2:]), kwargs
    device_, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
    copy = bool(kwargs.get("copy", False))
    if type(self) is CudaTensor:
        if device_ is not None and device_.type == "cuda":
            device_ = torch.device("cuda", emulation.device_index(device_))  # "cuda": the current device
        if (device_ is None or device_ == self.device) and (dtype is None or dtype == self.dtype) and not copy \
                and memory_format in (None, torch.preserve_format):
            return self  # torch's .to returns the tensor itself when nothing changes
        # Straight to the operator: torch's binding of .to takes a CUDA device guard.
        return torch.ops.aten._to_copy.default(self, dtype=dtype or self.dtype, device=device_ or self.device,
                                               non_blocking=non_blocking, memory_format=memory_format)
    if device_ is not None and device_.type == "cuda":
        return emulation.to_device(self, emulation.device_index(device_), dtype, non_blocking)
    return func(*args, **kwargs)


def _cuda(emulation, func, args, kwargs):
    self = args[0]
    where = args[1] if len(args) > 1 else kwargs.get("device")
    index = emulation.current_device() if where is None else emulation.device_index(where)
    if type(self) is CudaTensor:
        if self.device.index == index:
            return self
        return torch.ops.aten._to_copy.default(self, device=torch.device("cuda", index),
                                               non_blocking=bool(kwargs.get("non_blocking", False)))
    return emulation.to_device(self, index, None, bool(kwargs.get("non_blocking", False)))


def _pin_memory(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is PinnedTensor:
        return self
    if type(self) is CudaTensor:
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    emulation.enter()
    return emulation.pin(self)


def _is_pinned(emulation, func, args, kwargs):
    return type(args[0]) is PinnedTensor


def _numpy(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is CudaTensor:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")
    if type(self) is PinnedTensor:  # the same bytes, as torch's numpy() of pinned memory
        return HostView.of(self._inner.numpy(), _host_view_recorder(emulation, self._block))
    return func(*args, **kwargs)


def _host_view_recorder(emulation, block):
    """What a host view of pinned `block` records: each access through it, a host access of the
    bytes it touched (record.host_views)."""
    def record(lo: int, hi: int, write: bool, name: str) -> None:
        emulation.enter()
        buffer = block.buffer
        base = block.bytes.ctypes.data
        start, stop = max(lo - base, 0), min(hi - base, buffer.nbytes)
        if start < stop and not buffer.freed:
            region = Region(buffer, start, stop)
            emulation.device.host_access(reads=() if write else [region], writes=[region] if write else (), name=name)
    return record


def _tolist(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is CudaTensor:
        return self.cpu().tolist()  # a copy to the host, then a wait: CUDA's tolist
    if type(self) is PinnedTensor:
        emulation.enter()
        region = byte_region(self)
        if region is not None:
            emulation.device.host_access(reads=[region], name="tolist")
        return self._inner.tolist()
    return func(*args, **kwargs)




def _getitem(emulation, func, args, kwargs):
    self, index = args
    if not is_emulated(self):
        return func(*args, **kwargs)
    emulation.enter()
    if is_basic_index(index):  # a view of the same bytes: no kernel (torch's indexing here needs a CUDA guard)
        return type(self)(self._inner[index], self._block, self.device)
    if type(self) is PinnedTensor:
        region = byte_region(self)
        emulation.device.host_access(reads=[region] if region else [], name="index")
        return self._inner[cpu_index(index)]
    return emulation.gather(self, index)


def _setitem(emulation, func, args, kwargs):
    self, index, value = args
    if not is_emulated(self):
        return func(*args, **kwargs)
    emulation.enter()
    if is_basic_index(index):
        target = type(self)(self._inner[index], self._block, self.device)
        if isinstance(value, torch.Tensor):
            target.copy_(value)
        else:
            target.fill_(value)
        return None
    if type(self) is PinnedTensor:
        region = byte_region(self)
        emulation.device.host_access(writes=[region] if region else [], name="index_put_")
        self._inner[cpu_index(index)] = cpu_view(value)
        return None
    return emulation.scatter(self, index, value)


def _contiguous(emulation, func, args, kwargs):
    # torch's composite `contiguous` takes a CUDA device guard a CPU-only build lacks: a clone does it.
    self = args[0]
    memory_format = args[1] if len(args) > 1 else kwargs.get("memory_format", torch.contiguous_format)
    if not is_emulated(self) or self.is_contiguous(memory_format=memory_format):
        return func(*args, **kwargs)
    return torch.Tensor.clone(self, memory_format=memory_format)


def _where(emulation, func, args, kwargs):
    # A Python scalar operand becomes a tensor on the condition's device in C++ (which a CPU-only
    # build cannot allocate): a 0-d host tensor is what CUDA operators accept beside device ones.
    args = tuple(torch.tensor(v) if isinstance(v, (int, float, bool)) else v for v in args)
    kwargs = {k: torch.tensor(v) if isinstance(v, (int, float, bool)) else v for k, v in kwargs.items()}
    return func(*args, **kwargs)


def _nonzero(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is not CudaTensor or kwargs.get("as_tuple") or len(args) > 1:
        return func(*args, **kwargs)
    return emulation.dispatch(torch.ops.aten.nonzero.default, (self,), {})


def _copy(emulation, func, args, kwargs):
    # torch's binding of copy_ takes a CUDA device guard when one side is on the host: straight to
    # the operator, which the emulation dispatches like any other.
    if not any(is_emulated(a) for a in args):
        return func(*args, **kwargs)
    return torch.ops.aten.copy_.default(*args, **kwargs)


def _data_ptr(emulation, func, args, kwargs):
    self = args[0]
    if not is_emulated(self):
        return func(*args, **kwargs)
    return self._block.bytes.ctypes.data + self.storage_offset() * self.element_size()


def _untyped_storage(emulation, func, args, kwargs):
    self = args[0]
    if not is_emulated(self):
        return func(*args, **kwargs)
    return EmulatedStorage(emulation, self)




def _scalar(convert):
    def handler(emulation, func, args, kwargs):
        self = args[0]
        if not is_emulated(self):
            return func(*args, **kwargs)
        return convert(self.item())  # a host read, as torch's conversion of a CUDA scalar
    return handler


_METHODS = {
    torch.Tensor.to: _to, torch.Tensor.cuda: _cuda, torch.Tensor.pin_memory: _pin_memory,
    torch.Tensor.is_pinned: _is_pinned,
    torch.Tensor.numpy: _numpy, torch.Tensor.tolist: _tolist, torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem, torch.Tensor.contiguous: _contiguous, torch.where: _where,
    torch.Tensor.where: _where, torch.nonzero: _nonzero, torch.Tensor.nonzero: _nonzero,
    torch.Tensor.copy_: _copy, torch.Tensor.data_ptr: _data_ptr, torch.Tensor.untyped_storage: _untyped_storage,
    torch.Tensor.__float__: _scalar(float), torch.Tensor.__int__: _scalar(int), torch.Tensor.__index__: _scalar(int),
    torch.Tensor.__complex__: _scalar(complex),
}
