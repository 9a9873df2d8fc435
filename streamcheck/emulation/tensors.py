"""Emulated tensors: `CudaTensor` reports `cuda:N` and `is_cuda`, its data a CPU view of a caching-
allocator block's bytes (a sim buffer); `PinnedTensor` is pinned host memory, a CPU tensor whose
bytes the streams read and write too. Every operator on them goes to the running emulation.
Also the byte arithmetic the operators and the allocator share, and `untyped_storage()`.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch

from ..device.objects import Region, caller_site
from . import running
from .running import EmulationError, active


class _EmulatedTensor(torch.Tensor):
    """A wrapper tensor whose data is `_inner`, a CPU view of its block's bytes; every operator on it
    goes to the running emulation."""

    __slots__ = ()
    DEVICE = None  # the device a kind reports when none is given

    @staticmethod
    def __new__(cls, inner, block, device=None, requires_grad=False):
        t = torch.Tensor._make_wrapper_subclass(cls, inner.size(), strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=device or cls.DEVICE, requires_grad=requires_grad)
        t._inner = inner
        t._block = block
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        emulation = running._active
        if emulation is not None and not emulation.threads.has_mode():
            # A thread that was running before the emulation began, here at its first emulated call:
            # it enters the factory mode, which takes the call (threads.py).
            emulation.threads.enter_here()
            return func(*args, **(kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():  # what torch does for a subclass without this method
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return active().dispatch(func, args, kwargs or {})

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment.  If you were attempting to deepcopy a module, this may be "
                               "because of a torch.nn.utils.weight_norm usage, see "
                               "https://github.com/pytorch/pytorch/pull/103001")
        copied = self._deep_copy()
        memo[id(self)] = copied
        # What else the tensor carries (a Parameter's mark, a module's attributes), as torch copies it.
        for key, value in self.__dict__.items():
            if key not in ("_inner", "_block"):
                setattr(copied, key, copy.deepcopy(value, memo))
        return copied


def _deep_copy_cuda(self):
    """A CUDA tensor's deepcopy is a clone: one kernel on the current stream into a fresh block."""
    with torch.no_grad():
        copied = torch.Tensor.clone(self)
    return copied.requires_grad_(self.requires_grad) if self.requires_grad else copied


class CudaTensor(_EmulatedTensor):
    """A tensor on an emulated CUDA device."""

    __slots__ = ()
    _deep_copy = _deep_copy_cuda

    def __format__(self, spec):
        if self.dim() == 0 and not self.is_meta:
            return self.item().__format__(spec)  # a host read, as torch formats a CUDA scalar
        return object.__format__(self, spec)

    def __repr__(self, *, tensor_contents=None):
        with torch.no_grad():
            text = repr(self.detach().cpu())  # a host read: copy, then wait, as printing a CUDA tensor does
        device = f"device='{self.device}'"
        return _with_suffix(text, device)


class PinnedTensor(_EmulatedTensor):
    """Pinned host memory: the host reads and writes it now, the streams when they get there."""

    __slots__ = ()
    DEVICE = torch.device("cpu")

    def _deep_copy(self):
        """As torch copies pinned memory (its storage's clone): a pageable CPU tensor with the values
        the host reads now."""
        region = byte_region(self)
        if region is not None:
            active().device.host_access(reads=[region], name="deepcopy")
        copied = self._inner.clone()
        return copied.requires_grad_(self.requires_grad) if self.requires_grad else copied

    def __repr__(self, *, tensor_contents=None):
        return repr(torch.Tensor.clone(self).detach())  # a host read, now


def _with_suffix(text: str, device: str) -> str:
    """torch's repr of a CPU tensor with `device=...` where torch puts it (before dtype)."""
    for marker in (", size=", ", dtype=", ", grad_fn=", ", requires_grad="):
        cut = text.find(marker)
        if cut >= 0:
            return f"{text[:cut]}, {device}{text[cut:]}"
    return f"{text[:-1]}, {device})"


def is_emulated(value) -> bool:
    return type(value) is CudaTensor or type(value) is PinnedTensor


def cpu_view(value):
    return value._inner if type(value) is CudaTensor or type(value) is PinnedTensor else value


def byte_span(t) -> Optional[tuple]:
    """(start, stop) bytes of `t` within its block; None if it is empty."""
    span = layout_span(t.shape, t.stride(), t.element_size())
    if span is None:
        return None
    shift = t.storage_offset() * t.element_size()
    return span[0] + shift, span[1] + shift


def layout_span(shape, stride, itemsize: int) -> Optional[tuple]:
    """(start, stop) bytes of a tensor of this layout at storage offset 0 (byte_span adds the offset);
    None if it is empty. What an operator call's signature decides (operators._Call)."""
    lo = hi = 0
    for n, st in zip(shape, stride):
        if n == 0:
            return None
        if n > 1:
            if st >= 0:
                hi += (n - 1) * st
            else:
                lo += (n - 1) * st
    return lo * itemsize, (hi + 1) * itemsize


def byte_region(t) -> Optional[Region]:
    span = byte_span(t)
    return None if span is None else Region(t._block.buffer, span[0], span[1])


def storage_elements(shape, stride) -> int:
    """How many elements a strided tensor's storage must hold from its offset."""
    count = 1
    for n, st in zip(shape, stride):
        if n == 0:
            return 0
        if n > 1:
            count += (n - 1) * st
    return count


def typed_view(block, dtype, shape, stride, offset: int = 0):
    """A CPU tensor over the block's bytes."""
    base = block.views.get(dtype)
    if base is None:
        base = block.views[dtype] = torch.from_numpy(block.bytes).view(dtype)
    return base.as_strided(shape, stride, offset)


def contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def same_view(a, b) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.storage_offset() == b.storage_offset())



class HostBlock:
    """Pinned host memory's block: a sim buffer (so the checker sees its bytes)."""

    __slots__ = ("buffer", "bytes", "views")

    def __init__(self, buffer):
        self.buffer = buffer
        self.bytes = buffer.storage
        self.views = {}


class EmulatedStorage:
    """`tensor.untyped_storage()` of an emulated tensor: its block. `resize_(0)` frees the block now
    (FSDP's way of giving parameters back), as torch's allocator does: its bytes go back to the
    stream's pool, and pending work on other streams races with the next owner."""

    def __init__(self, emulation, tensor):
        self._emulation = emulation
        self._tensor = tensor
        self.device = tensor.device

    def data_ptr(self) -> int:
        return self._tensor._block.bytes.ctypes.data

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def is_pinned(self, device="cuda") -> bool:
        return type(self._tensor) is PinnedTensor

    def untyped(self) -> "EmulatedStorage":
        return self

    def element_size(self) -> int:
        return 1

    def nbytes(self) -> int:
        return 0 if self._tensor._block.buffer.freed else self._tensor._block.buffer.nbytes

    def size(self) -> int:
        return self.nbytes()

    def resize_(self, nbytes: int):
        emulation = self._emulation
        emulation.enter()
        if nbytes == self.nbytes():
            return self
        if nbytes != 0:
            raise EmulationError(f"untyped_storage().resize_({nbytes}) at {caller_site()}: the sim frees a block "
                                 "(resize_(0)) but does not grow one; allocate a new tensor instead")
        emulation.allocator.release(self._tensor._block)
        return self

    def __len__(self) -> int:
        return self.nbytes()



class EmulatedTypedStorage(EmulatedStorage):
    """`tensor.storage()` of an emulated tensor (torch's deprecated TypedStorage): the same block,
    counted in elements of the tensor's dtype."""

    def __init__(self, emulation, tensor):
        super().__init__(emulation, tensor)
        self.dtype = tensor.dtype

    def element_size(self) -> int:
        return self.dtype.itemsize

    def untyped(self) -> EmulatedStorage:
        return EmulatedStorage(self._emulation, self._tensor)

    def size(self) -> int:
        return self.nbytes() // self.dtype.itemsize

    def __len__(self) -> int:
        return self.size()

    def __getitem__(self, index):
        raise EmulationError(f"indexing tensor.storage() at {caller_site()} is not emulated; index the tensor "
                             "(or a view of it) instead")
