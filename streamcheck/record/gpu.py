"""GPU plumbing shared by the cupy backend (streamcheck/device/backends/cupy_backend.py) and the
CuPy adapters of instrument() (streamcheck/record/adapters/): the bounded spin delay, CUDA's
stream-capture modes, the one warm-up, and the flag that keeps streamcheck's own GPU work
out of a recording.

A leaf: it imports only the trace vocabulary (and CuPy, inside functions), so neither of
its users has to import the other.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Optional

import numpy as np

from ..core.trace import CaptureMode

SPIN_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda", "spin_delay.cu")
MAX_DELAY_US = 50_000  # the spin kernel's hard cap (STREAMCHECK_SPIN_MAX_NS): nothing can hang


class _ThreadState(threading.local):
    """Per host thread, with class defaults so reading needs no getattr fallback (hot path):
    `suppress`: inside work streamcheck issues itself, never the program's; `depth`: inside a
    recorded library call, whose own library calls are part of it (recorder.inside); `acting`: the
    ident of the thread whose earlier call this thread is recording now (the native observer's
    records, drained later), 0 for its own."""

    suppress = 0
    depth = 0
    acting = 0


thread_state = _ThreadState()
# While the native operator observer records (record/native): pause(+1 / -1) tells it that this
# thread is inside streamcheck's own work or a recorded call, whose torch operators are not the
# program's (what `suppress` and `depth` tell the Python dispatch mode).
native_pause = None


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


def cuda_device_present() -> bool:
    """True when the CUDA driver sees a device, asked without importing CuPy or torch: CuPy
    reads settings such as CUPY_CUDA_PER_THREAD_DEFAULT_STREAM when it is imported, so
    `streamcheck run` leaves that import to the program."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except (OSError, AttributeError):
        return False


def gpu_library_installed() -> bool:
    """CuPy, or torch, is installed (not imported)."""
    import importlib.util

    return any(importlib.util.find_spec(name) is not None for name in ("cupy", "torch"))


@contextlib.contextmanager
def suppressed():
    """Record nothing issued by this thread inside the block: the cupy backend's spins, timing
    events and fills, work a streamcheck Device checks itself, the warm-up."""
    thread_state.suppress += 1
    pause = native_pause
    if pause is not None:
        pause(1)
    try:
        yield
    finally:
        thread_state.suppress -= 1
        if pause is not None:
            pause(-1)


def is_suppressed() -> bool:
    return bool(thread_state.suppress)


# --- stream capture -----------------------------------------------------------------------

# cudaStreamCaptureMode values as CuPy's runtime module names them.
_CAPTURE_MODE_NAMES = {
    CaptureMode.GLOBAL: "streamCaptureModeGlobal",
    CaptureMode.THREAD_LOCAL: "streamCaptureModeThreadLocal",
    CaptureMode.RELAXED: "streamCaptureModeRelaxed",
}


def capture_mode_value(mode, runtime) -> int:
    """The cudaStreamCaptureMode integer for `mode` (CaptureMode or its name), read from
    CuPy's runtime module (cupy.cuda.runtime), which Stream.begin_capture(mode=...) takes."""
    mode = CaptureMode.parse(mode)
    return int(getattr(runtime, _CAPTURE_MODE_NAMES[mode]))


def capture_mode_of(value, runtime) -> CaptureMode:
    """CuPy's begin_capture(mode=...) argument as a CaptureMode; None is CuPy's default, relaxed
    (not CUDA's global: CuPy picks relaxed so that pool growth during a capture is allowed)."""
    if value is None:
        return CaptureMode.RELAXED
    for mode, name in _CAPTURE_MODE_NAMES.items():
        if value == getattr(runtime, name, None):
            return mode
    raise ValueError(f"unknown stream capture mode {value!r}; pass cupy.cuda.runtime.streamCaptureModeGlobal, "
                     "streamCaptureModeThreadLocal or streamCaptureModeRelaxed")


# --- streams CuPy did not create ----------------------------------------------------------

class _CudaStreamProtocol:
    """The CUDA stream protocol (`__cuda_stream__`) for a raw stream pointer."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def external_stream(cupy, ptr: int):
    """A CuPy stream object for a stream CuPy did not create (e.g. torch's); handle 0 is the
    legacy default stream (torch's default stream), CuPy's Stream.null."""
    if ptr == 0:
        return cupy.cuda.Stream.null
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_CudaStreamProtocol(ptr))
    return cupy.cuda.ExternalStream(ptr)  # CuPy < 14


# --- the spin delay -----------------------------------------------------------------------

class SpinDelay:
    """The spin kernel, loaded once per process through cupy.RawModule (NVRTC)."""

    _loaded: Optional["SpinDelay"] = None

    def __init__(self):
        import cupy
        from cupy._core import raw  # the original class, never an instrumented subclass

        with open(SPIN_SOURCE, encoding="utf-8") as f:
            code = f.read()
        self._cupy = cupy
        self._module = raw.RawModule(code=code)
        # get_function compiles (NVRTC) and loads the module now, not inside the program's first delay.
        self._kernel = self._module.get_function("streamcheck_spin")
        rt = cupy.cuda.runtime
        try:
            khz = rt.deviceGetAttribute(rt.cudaDevAttrClockRate, rt.getDevice())
        except Exception:  # attribute missing in this CUDA/CuPy build: assume a fast clock
            khz = 2_000_000
        self.clock_khz = int(khz) or 2_000_000
        # clock64 cap: twice the cycles the longest allowed spin takes at the rated SM clock,
        # a backstop only; %globaltimer ends the spin on time.
        self.max_cycles = np.uint64(2 * MAX_DELAY_US * self.clock_khz // 1000)
        self._elapsed = cupy.zeros(1, dtype=cupy.uint64)

    @classmethod
    def get(cls) -> "SpinDelay":
        if cls._loaded is None:
            with suppressed():
                cls._loaded = cls()
        return cls._loaded

    def enqueue(self, stream, us: float) -> None:
        """Spin `us` microseconds (clamped to MAX_DELAY_US) on the CuPy stream `stream`."""
        ns = int(min(max(us, 0.0), MAX_DELAY_US) * 1000)
        if ns == 0:
            return
        with suppressed(), stream:
            self._kernel((1,), (1,), (np.uint64(ns), self.max_cycles, 0))

    def measure(self, us: float) -> float:
        """Spin once on a private stream and return how long the GPU says it spun (µs)."""
        cupy = self._cupy
        with suppressed():
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                ns = int(min(max(us, 0.0), MAX_DELAY_US) * 1000)
                self._kernel((1,), (1,), (np.uint64(ns), self.max_cycles, self._elapsed))
            stream.synchronize()
            return float(self._elapsed.get(stream=stream)[0]) / 1000.0


# --- warm-up ------------------------------------------------------------------------------

def warm_up(*, cupy=None, torch=None, spin: bool = False, pool_bytes: int = 64 << 20) -> list:
    """Trigger what synchronizes implicitly the first time, before the program's first racy
    step: cuBLAS handle creation, the libraries' first kernels, the spin module's load,
    memory-pool growth (docs/cuda-rules.md: none of these is synchronization the program may
    rely on, yet each hides races while it happens). Returns the reasons, for the caller to
    record as implicit syncs (never an edge for the checker)."""
    reasons = []
    with suppressed():
        if cupy is not None:
            a = cupy.ones((8, 8), dtype=cupy.float32)
            (a @ a).sum()
            a[...] = a.copy()
            cupy.cuda.runtime.deviceSynchronize()
            reasons.append("first cuBLAS call (handle creation) and CuPy's first fill/copy/reduction kernels")
            if spin:
                SpinDelay.get()
                reasons.append("lazy module load: streamcheck spin kernel (NVRTC compile + cuModuleLoad)")
            pool = cupy.get_default_memory_pool()
            before = pool.total_bytes()
            if pool.free_bytes() < pool_bytes:
                cupy.empty(pool_bytes, dtype=cupy.uint8)  # freed at once: the pool keeps the bytes
            grown = pool.total_bytes() - before
            if grown > 0:
                reasons.append(f"memory pool growth by {grown} bytes (cudaMalloc)")
        if torch is not None and torch.cuda.is_available():
            t = torch.ones((8, 8), device="cuda")
            (t @ t).sum().item()
            if spin and cupy is None:
                torch.cuda._sleep(1)
            torch.cuda.synchronize()
            reasons.append("torch's first CUDA calls (context, cuBLAS handle, caching allocator segment)")
    return reasons
