"""Kernels for the dispatcher's CUDA key while the emulation runs: C++ code inside torch that makes a
CUDA tensor itself (the autograd engine materializing an undefined gradient, `gradcheck`'s zero
gradients) reaches `aten::empty` / `aten::empty_strided` at the CUDA key, which a CPU-only build
leaves empty ("Could not run 'aten::empty.memory_format' with arguments from the 'CUDA' backend").
Registered there, they hand out blocks of the emulated caching allocator, as torch's CUDA kernels
hand out blocks of the real one: an allocation, no kernel (its bytes are whatever the block held)."""
from __future__ import annotations

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


def register() -> "callable":
    """Register the kernels; returns their removal."""
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # a CUDA build's own kernels are overridden while the sim runs: meant so
        warnings.simplefilter("ignore", UserWarning)
        library.impl("empty.memory_format", _empty, "CUDA")
        library.impl("empty_strided", _empty_strided, "CUDA")
    return library._destroy
