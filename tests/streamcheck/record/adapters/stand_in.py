"""CPU tensors standing in for CUDA tensors, for the torch adapter's tests on a machine without a GPU
(test_torch_ops.py's harness, and the tests beside it)."""
from __future__ import annotations

import torch

from streamcheck.record.adapters import torch_ops
from streamcheck.record.adapters.cuda_device import CudaGpu


class CpuStandsInForCuda(torch_ops.Ops):
    """Every CPU tensor is a CUDA tensor, except those in `pinned` (pinned host memory) and in
    `pageable` (ordinary host memory, which the recording does not track), by storage address.

    The caching allocator tells a recording when a block is freed (torch_runtime._deallocated, which
    a test calls where the program drops a tensor); CPU memory has no such callback. So the stand-in
    keeps every storage it registered for the recording's life: the CPU allocator cannot hand an
    address the recording still files under a dead tensor to a new one (whose writes would then
    race with the dead tensor's, whenever the CPU allocator happened to reuse it)."""

    def __init__(self, rec, torch):
        super().__init__(rec, torch)
        self.pinned: set = set()
        self.pageable: set = set()
        self.kept: list = []  # the storages registered so far

    def _kind(self, t):
        ptr = t.untyped_storage().data_ptr()
        if t.numel() == 0 or ptr in self.pageable:
            return ""
        return "host" if ptr in self.pinned else "cuda"

    def register(self, t, kind, fresh=False):
        super().register(t, kind, fresh)
        self.kept.append(t.untyped_storage())


def stand_in_gpu() -> CudaGpu:
    """The recorder's Gpu for the stand-in: the CUDA driver is never asked, so the fake stream
    handles (A, B) reach no real driver on a machine that has one (cuStreamGetFlags on a made-up
    handle is a segmentation fault there, not an error)."""
    gpu = CudaGpu(torch=torch)
    gpu.driver.lib = None
    return gpu


def machinery(rec) -> None:
    """The stand-in's frames are the recording's own machinery, as torch_ops' are, not the user's
    (an allocation it registers is made at the user's line, as on a GPU)."""
    rec.site.internal = rec.site.internal + (__file__,)
