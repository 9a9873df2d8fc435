"""Library adapters: what instrument() intercepts, one module per library area.

Each module lists its entry points in one table, `patches()` (patching.Patch entries), and
may have `install(recorder, patcher)` for what is not an attribute (the allocator in use).
Adding an intercepted entry point is one Patch line, or one small wrap function, in one file.
The recorder (streamcheck/record/recorder.py) does the rest.
"""
from __future__ import annotations

import importlib

from .patching import Patcher

# (module, the library it adapts: installed once that library is imported). Install order
# matters only where one adapter's originals must be read before another's patch: none today.
# Undo runs in reverse.
ADAPTERS = (
    ("cupy_streams", "cupy"),  # Stream / Event methods, device synchronize
    ("cupy_graphs", "cupy"),  # begin_capture / end_capture, graph launches
    ("cupy_kernels", "cupy"),  # RawKernel, RawModule, ElementwiseKernel, ReductionKernel
    ("cupy_ndarray", "cupy"),  # operators and methods, get / set
    ("cupy_functions", "cupy"),  # module functions, ufuncs, linalg, fft
    ("cupy_allocator", "cupy"),  # global and thread-local allocators
    ("torch_runtime", "torch"),  # streams, events, syncs, the caching allocator (GPU-trace callbacks)
    ("torch_native", "torch"),  # ATen operators through the native observer (C++), where it can be had
    ("torch_ops", "torch"),  # ATen operators (a TorchDispatchMode) otherwise; the operator rules
    ("torch_graphs", "torch"),  # torch.cuda.graph / CUDAGraph capture and replay
    ("torch_inductor", "torch"),  # torch.compile's kernels (Inductor's CachingAutotuner.run)
    ("triton_launch", "triton"),  # Triton's JITFunction.run (jit, autotune, heuristics)
    ("threads", None),  # threading.Thread start / join; host threads' hand-offs (host_handoffs.py)
)
LIBRARIES = ("cupy", "torch", "triton")


def adapter(name: str):
    return importlib.import_module(f".{name}", __name__)


def install(rec, libraries, patcher=None) -> Patcher:
    """Apply the adapters of `libraries` (and the library-free ones, on a new Patcher) for
    recording `rec`; returns the Patcher that undoes them."""
    fresh = patcher is None
    patcher = Patcher(rec.unpatched) if fresh else patcher
    for name, library in ADAPTERS:
        if library in libraries or (library is None and fresh):
            module = adapter(name)
            setup = getattr(module, "install", None)
            if setup is not None:
                setup(rec, patcher)
            for patch in module.patches():
                patcher.apply(patch)
    return patcher
