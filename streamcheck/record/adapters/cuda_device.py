"""What the recorder asks of the GPU (recorder.Gpu), for CuPy and torch alike: the current
stream, a stream's flags and capture state (from the CUDA driver, so any library's stream
works), the bytes an array spans, the driver's allocation ranges, spins.

Arrays are CuPy ndarrays, torch tensors (CUDA, or pinned host memory) or anything with
`__cuda_array_interface__` (Numba, other libraries): one allocation table covers them all,
so a torch tensor and a CuPy view of it are the same bytes.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

from .. import gpu
from ...core.trace import CaptureMode, StreamKind

_SCALARS = (int, float, complex, bool, str, bytes, type(None))  # never arrays; the hot path's first test


class CudaDriver:
    """The CUDA driver API through ctypes, for what no single library answers for every
    stream and pointer: cuMemGetAddressRange (the allocation holding a pointer), cuStreamGetFlags
    and cuStreamIsCapturing (any library's stream)."""

    def __init__(self):
        self.lib = None
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
            self.lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                         ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
            self.lib.cuStreamGetFlags.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
            self.lib.cuStreamIsCapturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        except (OSError, AttributeError):
            self.lib = None

    def range_of(self, ptr: int):
        if self.lib is None:
            return None
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        if self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
            return None
        return int(base.value), int(size.value)

    def stream_flags(self, ptr: int):
        """cudaStreamNonBlocking (1) or 0, or None when the driver cannot tell."""
        if self.lib is None:
            return None
        flags = ctypes.c_uint(0)
        if self.lib.cuStreamGetFlags(ctypes.c_void_p(ptr), ctypes.byref(flags)) != 0:
            return None
        return int(flags.value)

    def is_capturing(self, ptr: int):
        """True/False, or None when the driver refuses to say (an invalidated capture)."""
        if self.lib is None:
            return None
        status = ctypes.c_int(0)
        if self.lib.cuStreamIsCapturing(ctypes.c_void_p(ptr), ctypes.byref(status)) != 0:
            return None
        return status.value != 0  # CU_STREAM_CAPTURE_STATUS_ACTIVE (1) or _INVALIDATED (2)

    # Timing events for race confirmation (confirm_gpu.Probe). Through the driver, so that no
    # library adapter records them: they are the checker's, not the program's.
    def _checked(self, what: str, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"CUDA driver {what} failed with CUresult {status}")

    def ensure_context(self, stream_ptr: int = 0) -> None:
        """Make a context current on this thread if none is: a thread's first CUDA call may be
        the one a probe event goes before (CUDA_ERROR_INVALID_CONTEXT otherwise). The stream's
        own context, or for the default streams device 0's primary context: the one the runtime
        (CuPy, torch) would make current itself."""
        if self.lib is None:
            raise RuntimeError("the CUDA driver (libcuda.so.1) could not be loaded")
        ctx = ctypes.c_void_p()
        self._checked("cuCtxGetCurrent", self.lib.cuCtxGetCurrent(ctypes.byref(ctx)))
        if ctx.value:
            return
        if stream_ptr not in (0, 1, 2):  # not the legacy (0, 1) or per-thread (2) default stream
            self._checked("cuStreamGetCtx", self.lib.cuStreamGetCtx(ctypes.c_void_p(stream_ptr), ctypes.byref(ctx)))
            self._checked("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))
            return
        device = ctypes.c_int()
        self._checked("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(device), 0))
        self._checked("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device))
        self._checked("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))

    def event_create(self) -> int:
        self.ensure_context()
        event = ctypes.c_void_p()
        self._checked("cuEventCreate", self.lib.cuEventCreate(ctypes.byref(event), ctypes.c_uint(0)))  # timing on
        return int(event.value or 0)

    def event_record(self, event: int, stream_ptr: int) -> None:
        self.ensure_context(stream_ptr)
        self._checked("cuEventRecord", self.lib.cuEventRecord(ctypes.c_void_p(event), ctypes.c_void_p(stream_ptr)))

    def elapsed_us(self, start: int, end: int) -> float:
        """Microseconds from `start` to `end` (negative when `end` completed first); waits for both."""
        for event in (start, end):
            self._checked("cuEventSynchronize", self.lib.cuEventSynchronize(ctypes.c_void_p(event)))
        ms = ctypes.c_float(0.0)
        elapsed = getattr(self.lib, "cuEventElapsedTime_v2", None) or self.lib.cuEventElapsedTime
        self._checked("cuEventElapsedTime", elapsed(ctypes.byref(ms), ctypes.c_void_p(start), ctypes.c_void_p(end)))
        return float(ms.value) * 1000.0

    def stream_wait_event(self, stream_ptr: int, event: int) -> None:
        """cuStreamWaitEvent: the sync audit's replacement for a host synchronize."""
        self.ensure_context(stream_ptr)
        self._checked("cuStreamWaitEvent", self.lib.cuStreamWaitEvent(ctypes.c_void_p(stream_ptr),
                                                                      ctypes.c_void_p(event), ctypes.c_uint(0)))

    def synchronize(self) -> None:
        """cuCtxSynchronize (for timing a whole script)."""
        self.ensure_context()
        self._checked("cuCtxSynchronize", self.lib.cuCtxSynchronize())

    def stream_create(self) -> int:
        """A non-blocking stream no program work runs on: an event recorded there completes when
        the GPU reaches it, which is the host's issue time seen on the GPU's clock."""
        self.ensure_context()
        stream = ctypes.c_void_p()
        self._checked("cuStreamCreate", self.lib.cuStreamCreate(ctypes.byref(stream), ctypes.c_uint(1)))
        return int(stream.value or 0)


def inductor_code_dir() -> Optional[str]:
    """Where torch.compile writes the Python it generates (Inductor's cache: the compiled
    wrapper's frames are torch's, not the user's); None until Inductor is loaded. Asked the way
    Inductor's cache_dir() asks, without its side effects (it creates the folder)."""
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if utils is None:
        return None
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        return os.path.abspath(configured or utils.default_cache_dir())
    except Exception:  # an Inductor without default_cache_dir: its frames count as the user's
        return None


def _library_dirs() -> tuple:
    """Library folders beyond those every resolver knows (core.trace.LIBRARY_PACKAGES: CuPy's,
    torch's and Triton's wherever they are installed): the code torch.compile generated."""
    generated = inductor_code_dir()
    return () if generated is None else (generated,)


def _span(ptr: int, shape, strides, itemsize: int) -> Optional[tuple]:
    """(start, stop) addresses of a strided array (strides in bytes); None if it is empty."""
    if any(n == 0 for n in shape):
        return None
    lo = hi = 0
    for n, st in zip(shape, strides):
        if n > 1:
            if st >= 0:
                hi += (n - 1) * st
            else:
                lo += (n - 1) * st
    return ptr + lo, ptr + hi + itemsize


class CudaGpu:
    """recorder.Gpu on the CUDA libraries a program uses: CuPy, torch, or both (either may be
    None). The "current stream" of a call without one is CuPy's (torch's adapters always pass
    torch's current stream explicitly: the two libraries keep separate current streams)."""

    def __init__(self, cupy=None, torch=None, on_external_memory=None):
        self.cupy = cupy
        self.torch = torch
        self.ndarray = cupy.ndarray if cupy is not None else ()
        self.tensor = torch.Tensor if torch is not None else ()
        self.runtime = cupy.cuda.runtime if cupy is not None else None
        self.library_dirs = _library_dirs()
        self._driver = CudaDriver()
        self._spin = None
        self._on_external_memory = on_external_memory  # first memory no recorded allocator handed out
        self._bind()

    def _bind(self) -> None:
        # Bound once: looked up on every recorded call without a stream.
        self.current_stream = (self.cupy.cuda.get_current_stream if self.cupy is not None
                               else self.torch.cuda.current_stream)
        self.array_types = tuple(t for t in (self.ndarray, self.tensor) if isinstance(t, type))

    def add_library(self, name: str, module) -> None:
        """A library the program imported after the recording started."""
        if name == "cupy" and self.cupy is None:
            self.cupy, self.ndarray, self.runtime = module, module.ndarray, module.cuda.runtime
        elif name == "torch" and self.torch is None:
            self.torch, self.tensor = module, module.Tensor
        self.refresh_library_dirs()
        self._bind()

    def refresh_library_dirs(self) -> bool:
        """Whether the libraries' folders changed (a part imported lazily, e.g. Inductor's)."""
        dirs = _library_dirs()
        changed, self.library_dirs = dirs != self.library_dirs, dirs
        return changed

    def stream_ptr(self, stream) -> int:
        if isinstance(stream, int):
            return stream
        ptr = getattr(stream, "ptr", None)
        if ptr is None:
            ptr = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
        if ptr is None:
            raise TypeError(f"not a CUDA stream: {stream!r}")
        return ptr

    def stream_kind(self, ptr: int) -> StreamKind:
        flags = self._driver.stream_flags(ptr)
        if flags is None and self.runtime is not None:
            try:
                flags = self.runtime.streamGetFlags(ptr)
            except Exception:
                flags = None
        if flags is None:  # unknown: assume non-blocking, the kind that implies the fewest edges
            return StreamKind.NON_BLOCKING
        return StreamKind.NON_BLOCKING if flags & 1 else StreamKind.BLOCKING  # cudaStreamNonBlocking

    def is_capturing(self, stream) -> bool:
        ptr = self.stream_ptr(stream)
        capturing = self._driver.is_capturing(ptr)
        if capturing is None and self.runtime is not None:
            try:
                capturing = bool(self.runtime.streamIsCapturing(ptr))
            except Exception:
                capturing = None
        # None: an invalidated capture, or the legacy stream next to a blocking capture
        return True if capturing is None else capturing

    def spin(self, stream, us: float) -> None:
        if self.cupy is not None:
            if self._spin is None:
                self._spin = gpu.SpinDelay.get()
            if isinstance(stream, int) or not hasattr(stream, "ptr"):
                stream = gpu.external_stream(self.cupy, self.stream_ptr(stream))
            self._spin.enqueue(stream, us)
            return
        torch = self.torch  # no CuPy: torch's own sleep kernel, bounded like ours
        cycles = int(min(max(us, 0.0), gpu.MAX_DELAY_US) * 2000)  # ~2 GHz SM clock
        with gpu.suppressed(), torch.cuda.stream(torch.cuda.ExternalStream(self.stream_ptr(stream))):
            torch.cuda._sleep(cycles)

    @property
    def driver(self) -> CudaDriver:
        return self._driver

    def capture_mode(self, value):
        if isinstance(value, str):  # torch: capture_error_mode="global" / "thread_local" / "relaxed"
            return CaptureMode.parse(value)
        return gpu.capture_mode_of(value, self.runtime)

    def is_array(self, obj) -> bool:
        if isinstance(obj, self.array_types):
            return True
        return not isinstance(obj, _SCALARS) and hasattr(obj, "__cuda_array_interface__")

    def array_span(self, obj) -> Optional[tuple]:
        if isinstance(obj, self.ndarray):
            return _span(obj.data.ptr, obj.shape, obj.strides, obj.itemsize)
        if isinstance(obj, self.tensor):  # CUDA or pinned host memory; strides are in elements
            if obj.is_contiguous():  # the common case, without a walk over the strides
                nbytes = obj.nbytes
                if not nbytes:
                    return None
                ptr = obj.data_ptr()
                return ptr, ptr + nbytes
            size = obj.element_size()
            return _span(obj.data_ptr(), obj.shape, [st * size for st in obj.stride()], size)
        cai = getattr(obj, "__cuda_array_interface__", None)
        if cai is None:
            return None
        shape = tuple(cai["shape"])
        itemsize = int(cai["typestr"][2:])
        strides = cai.get("strides")
        if strides is None:
            strides, acc = [], itemsize
            for n in reversed(shape):
                strides.append(acc)
                acc *= n
            strides = tuple(reversed(strides))
        return _span(cai["data"][0], shape, strides, itemsize)

    def driver_range(self, ptr: int) -> Optional[tuple]:
        if self._on_external_memory is not None:
            seen, self._on_external_memory = self._on_external_memory, None
            seen()
        return self._driver.range_of(ptr)
