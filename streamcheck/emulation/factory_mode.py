"""Factories and Tensor methods a CPU-only torch refuses before any dispatch (`device="cuda"`, `.cuda()`,
`.to("cuda")`, `pin_memory=True`, `record_stream`, indexing with a CUDA guard, ...): a torch function
mode sends them to the emulation.
"""
from __future__ import annotations

import copy

import torch
from torch.overrides import TorchFunctionMode

from ..device.objects import Region, caller_site
from ..record.host_views import HostView
from .generators import EmulatedGenerator
from .operators import cpu_index, flatten_call, is_basic_index
from .running import EmulationError
from .tensors import (CudaTensor, EmulatedStorage, EmulatedTypedStorage, PinnedTensor, byte_region, cpu_view,
                      is_emulated)


class FactoryMode(TorchFunctionMode):
    """Factories and conversions a CPU-only torch refuses before dispatch: `device="cuda"`,
    `.cuda()`, `.to("cuda")`, `pin_memory=True`, `.pin_memory()`, `record_stream(s)`."""

    def __init__(self, emulation):
        super().__init__()
        self.emulation = emulation  # None once the emulation ended (threads.py): every call passes through
        self.without_autograd = not emulation.autograd.enabled

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.emulation is None:
            return func(*args, **kwargs)
        if self.without_autograd and torch.is_grad_enabled() and _needs_grad(args, kwargs):
            # Without the native guard, a graph node on an emulated tensor asks a CPU-only build for a
            # CUDA stream and aborts the process: forward passes run as under torch.no_grad(), and
            # backward() is refused in one line (autograd.py).
            self.emulation.notice(self.emulation.autograd.no_grad_notice())
            with torch.no_grad():
                return self._call(func, types, args, kwargs)
        return self._call(func, types, args, kwargs)

    def _call(self, func, types, args, kwargs):
        generator = kwargs.get("generator")
        if type(generator) is EmulatedGenerator:
            # Taken here, at the call: past torch's binding the generator is a plain torch.Generator
            # (the same C++ object, a new Python one), no longer known as a CUDA one.
            emulation = self.emulation
            if emulation.capture_graphs and emulation.is_capturing(emulation.current_stream(generator.device.index)):
                raise EmulationError(f"a torch.Generator(device='cuda') passed to {getattr(func, '__name__', func)} "
                                     f"at {caller_site()} during a CUDA graph capture is not emulated (a replay would "
                                     "not draw from it); draw from the default CUDA generator in captured code, or "
                                     "check this program on a GPU (streamcheck run --backend gpu)")
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
            if types and _only_emulated(types):
                # What the emulated tensors' own __torch_function__ does next (tensors.py), here rather
                # than in a second Python layer: every operator passes this way.
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs)
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


def _only_emulated(types) -> bool:
    for kind in types:
        if kind is not CudaTensor and kind is not PinnedTensor:
            return False
    return True


def _needs_grad(args, kwargs) -> bool:
    """Whether an emulated tensor that requires grad is among the arguments (one level into lists)."""
    # Read with the tensors' own __torch_function__ off: it would run (and do just this) per tensor.
    with torch._C.DisableTorchFunctionSubclass():
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
    index = _select_index(index)
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
    index = _select_index(index)
    if is_basic_index(index):
        target = type(self)(self._inner[index], self._block, self.device)
        # The operators themselves: the Tensor methods' bindings take a CUDA device guard.
        if isinstance(value, torch.Tensor):
            torch.ops.aten.copy_.default(target, value)
        else:
            torch.ops.aten.fill_.Scalar(target, value)
        return None
    if type(self) is PinnedTensor:
        region = byte_region(self)
        emulation.device.host_access(writes=[region] if region else [], name="index_put_")
        self._inner[cpu_index(index)] = cpu_view(value)
        return None
    return emulation.scatter(self, index, value)


def _select_index(index):
    """torch reads a lone 0-d integer tensor index on the host (`.item()`, a wait for its stream) and
    selects a view with it, as with an int."""
    if type(index) is CudaTensor and index.dim() == 0 and not index.dtype.is_floating_point and \
            index.dtype != torch.bool and not index.dtype.is_complex:
        return int(index.item())
    return index


def _set_data(emulation, func, args, kwargs):
    """`t.data = value`: `t` keeps its identity (a module's Parameter stays its module's) and takes
    value's device and bytes, as torch's set_data does. With an emulated side, `t` becomes a tensor of
    value's kind (a plain CPU tensor's C++ object cannot take an emulated one's dispatch), its own
    attributes kept."""
    self, value = args
    if not (is_emulated(self) or is_emulated(value)):
        return func(*args, **kwargs)
    emulation.enter()
    is_param = isinstance(self, torch.nn.Parameter)
    kept = {k: v for k, v in self.__dict__.items() if k not in ("_inner", "_block", "_is_param")}
    requires_grad = self.requires_grad
    if is_emulated(value):
        fresh = type(value)(value._inner, value._block, value.device, requires_grad=requires_grad)
        if is_param:
            fresh._is_param = True  # what nn.Parameter marks a tensor subclass with
    elif is_param:
        fresh = torch.nn.Parameter(value, requires_grad=requires_grad)
    else:
        fresh = value.detach().requires_grad_(requires_grad)
    fresh.__dict__.update(kept)
    grad = self.grad
    self.grad = None  # a grad holds a reference to the C++ tensor, which swap_tensors refuses
    try:
        torch.utils.swap_tensors(self, fresh)
    except RuntimeError as exc:
        self.grad = grad
        raise EmulationError(f"`.data =` at {caller_site()} cannot move this tensor to the value's device on the "
                             f"sim ({exc}); assign a new tensor instead, or check this program on a GPU") from None
    if grad is not None and grad.device == self.device:
        self.grad = grad
    return None


def _deepcopy(emulation, func, args, kwargs):
    """copy.deepcopy of an emulated tensor: a copy of its bytes in a block of its own (on its device's
    current stream, as a GPU's clone), its attributes copied too (a Parameter stays one)."""
    self, memo = args
    if not is_emulated(self):
        return func(*args, **kwargs)
    if id(self) in memo:
        return memo[id(self)]
    emulation.enter()
    with torch.no_grad():
        if type(self) is PinnedTensor:
            fresh = emulation.pin(torch.Tensor.clone(self))
        else:
            fresh = torch.ops.aten.clone.default(self)
    if self.requires_grad:
        fresh.requires_grad_(True)
    memo[id(self)] = fresh
    for k, v in self.__dict__.items():
        if k not in ("_inner", "_block"):
            setattr(fresh, k, copy.deepcopy(v, memo))
    return fresh


def _invert(emulation, func, args, kwargs):
    # `~t`'s binding takes a CUDA device guard: the operator itself.
    if not is_emulated(args[0]):
        return func(*args, **kwargs)
    return torch.ops.aten.bitwise_not.default(args[0])


def _new_tensor(emulation, func, args, kwargs):
    """`t.new_tensor(data)`: a copy of data on t's device with t's dtype, unless told otherwise."""
    self, data = args[0], args[1] if len(args) > 1 else kwargs["data"]
    if not is_emulated(self) and not _names_cuda(kwargs.get("device")):
        return func(*args, **kwargs)
    dtype = kwargs.get("dtype") or (data.dtype if isinstance(data, torch.Tensor) else self.dtype)
    device = kwargs.get("device")
    device = self.device if device is None else torch.device(device) if not isinstance(device, int) \
        else torch.device("cuda", device)
    requires_grad = bool(kwargs.get("requires_grad", False))
    if isinstance(data, torch.Tensor):  # torch copies a tensor's values (and warns to use clone)
        out = torch.ops.aten._to_copy.default(torch.Tensor.detach(data), dtype=dtype, device=device)
    elif device.type == "cuda":
        out = emulation.factory(torch.tensor, (data,), {"dtype": dtype}, emulation.device_index(device))
    else:
        out = torch.tensor(data, dtype=dtype)
    return out.requires_grad_(True) if requires_grad else out


def _names_cuda(device) -> bool:
    target = device if isinstance(device, torch.device) else _maybe_device(device)
    return target is not None and target.type == "cuda"


# The legacy tensor types' names (`torch.cuda.FloatTensor`, "torch.LongTensor") and their dtypes.
_LEGACY_TYPES = {"Double": torch.float64, "Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16,
                 "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8,
                 "Byte": torch.uint8, "Bool": torch.bool}


def _type(emulation, func, args, kwargs):
    """`t.type(torch.cuda.FloatTensor)` / `t.type("torch.cuda.LongTensor")` / `t.type(torch.float64)`:
    a conversion (to the current CUDA device for a cuda type), as torch's binding; `t.type()` names it."""
    self = args[0]
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if dtype is None:
        return func(*args, **kwargs)
    if isinstance(dtype, torch.dtype):
        return _to(emulation, torch.Tensor.to, (self, dtype), {"non_blocking": non_blocking})
    name = dtype if isinstance(dtype, str) else f"{dtype.__module__}.{dtype.__name__}"
    parts = name.split(".")
    kind = parts[-1][:-len("Tensor")] if parts[-1].endswith("Tensor") else None
    if parts[0] != "torch" or kind not in _LEGACY_TYPES or len(parts) not in (2, 3) or \
            (len(parts) == 3 and parts[1] != "cuda"):
        return func(*args, **kwargs)  # torch's own error for a name it does not know
    if len(parts) == 3:  # a cuda type: the tensor's device if it is on one, else the current one
        device = self.device if type(self) is CudaTensor else torch.device("cuda", emulation.current_device())
    else:
        device = torch.device("cpu")
    return _to(emulation, torch.Tensor.to, (self, device, _LEGACY_TYPES[kind]), {"non_blocking": non_blocking})


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
    if type(self) is not CudaTensor or len(args) > 1:
        return func(*args, **kwargs)
    as_tuple = kwargs.get("as_tuple")
    if as_tuple and self.dim() == 0:  # torch's as_tuple treats a 0-d input as 1-d
        self = torch.ops.aten.reshape.default(self, (1,))
    indices = emulation.dispatch(torch.ops.aten.nonzero.default, (self,), {})
    if as_tuple:  # one index tensor per dimension
        return tuple(torch.ops.aten.unbind.int(indices, 1))
    return indices


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


def _typed_storage(emulation, func, args, kwargs):
    self = args[0]
    if not is_emulated(self):
        return func(*args, **kwargs)
    return EmulatedTypedStorage(emulation, self)




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
    torch.Tensor.storage: _typed_storage,
    torch.Tensor.__float__: _scalar(float), torch.Tensor.__int__: _scalar(int), torch.Tensor.__index__: _scalar(int),
    torch.Tensor.__complex__: _scalar(complex),
    torch.Tensor.data.__set__: _set_data, torch.Tensor.__deepcopy__: _deepcopy, torch.Tensor.__invert__: _invert,
    torch.Tensor.new_tensor: _new_tensor, torch.Tensor.type: _type,
    # Parses `.to()`'s arguments (Module.to's too): its `device=` names a target, it makes no tensor.
    torch._C._nn._parse_to: lambda emulation, func, args, kwargs: func(*args, **kwargs),
}
