"""Kernels for the dispatcher's CUDA key while torch's autograd engine runs on the emulation: its C++
makes CUDA tensors itself (an undefined gradient materialized as zeros, `gradcheck`'s zero gradients)
and reaches `aten::empty` / `aten::empty_strided` at the CUDA key, which a CPU-only build
leaves empty ("Could not run 'aten::empty.memory_format' with arguments from the 'CUDA' backend").
Registered there, they hand out blocks of the emulated caching allocator, as torch's CUDA kernels
hand out blocks of the real one: an allocation, no kernel (its bytes are whatever the block held).
Only while the engine runs: outside it, torch's composites that allocate in C++ (`one_hot`, SDPA's
mask) run as one kernel (operators.whole_function), which a half-emulated C++ path would not."""
from __future__ import annotations

import contextlib
import warnings

import torch

from .running import active


def _layout(size, dtype, memory_format):
    """Strides torch gives a fresh tensor of `size` in `memory_format` (from the meta device)."""
    meta = torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format or torch.contiguous_format)
    return tuple(meta.stride())


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    emulation = active()
    dtype = dtype or torch.get_default_dtype()
    return emulation.empty(tuple(size), _layout(size, dtype, memory_format), dtype,
                           emulation.device_index(device if device is not None else "cuda"))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    emulation = active()
    return emulation.empty(tuple(size), tuple(stride), dtype or torch.get_default_dtype(),
                           emulation.device_index(device if device is not None else "cuda"))


_depth = [0]  # nested backward calls (a hook that runs backward) register once


@contextlib.contextmanager
def registered():
    """The kernels in place for the duration (the outermost call registers and removes them)."""
    _depth[0] += 1
    library = None
    if _depth[0] == 1:
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # a CUDA build's own kernels are overridden while the sim runs: meant so
            warnings.simplefilter("ignore", UserWarning)
            library.impl("empty.memory_format", _empty, "CUDA")
            library.impl("empty_strided", _empty_strided, "CUDA")
    try:
        yield
    finally:
        _depth[0] -= 1
        if library is not None:
            library._destroy()
