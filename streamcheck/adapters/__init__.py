"""Library adapters: what instrument() intercepts, one module per library area.

Each module lists its entry points in one table, `patches()` (patching.Patch entries), and
may have `install(recorder, patcher)` for what is not an attribute (the allocator in use).
Adding an intercepted entry point is one Patch line, or one small wrap function, in one file.
The recorder (streamcheck/recorder.py) does the rest.
"""
from __future__ import annotations

import importlib

from .patching import Patcher

# Install order matters only where one adapter's originals must be read before another's
# patch: none today. Undo runs in reverse.
ADAPTERS = (
    "cupy_streams",  # Stream / Event methods, device synchronize
    "cupy_graphs",  # begin_capture / end_capture, graph launches
    "cupy_kernels",  # RawKernel, RawModule, ElementwiseKernel, ReductionKernel
    "cupy_ndarray",  # operators and methods, get / set
    "cupy_functions",  # module functions, ufuncs, linalg, fft
    "cupy_allocator",  # global and thread-local allocators
    "threads",  # threading.Thread start / join
    "torch_sync",  # torch.cuda.synchronize when torch is loaded
)


def adapter(name: str):
    return importlib.import_module(f".{name}", __name__)


def install(rec, names=ADAPTERS) -> Patcher:
    """Apply the adapters `names` for recording `rec`; returns the Patcher that undoes them."""
    patcher = Patcher(rec.unpatched)
    for name in names:
        module = adapter(name)
        setup = getattr(module, "install", None)
        if setup is not None:
            setup(rec, patcher)
        for patch in module.patches():
            patcher.apply(patch)
    return patcher
