"""What the recorder asks of CuPy (recorder.Gpu): the current stream, a stream's flags and
capture state, the bytes an array spans, the driver's allocation ranges, spins.

Arrays are CuPy ndarrays or anything with `__cuda_array_interface__` (torch tensors, Numba,
other libraries): one allocation table covers them all, so a torch tensor and a CuPy view of
it are the same bytes.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

from .. import gpu
from ..core.trace import StreamKind

_SCALARS = (int, float, complex, bool, str, bytes, type(None))  # never arrays; the hot path's first test


class CudaDriver:
    """cuMemGetAddressRange through ctypes: the allocation (base, size) holding a pointer,
    for memory CuPy's allocator did not hand out (torch, external libraries)."""

    def __init__(self):
        self.fn = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuMemGetAddressRange_v2
            fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
            fn.restype = ctypes.c_int
            self.fn = fn
        except (OSError, AttributeError):
            pass

    def range_of(self, ptr: int):
        if self.fn is None:
            return None
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        if self.fn(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
            return None
        return int(base.value), int(size.value)


def _library_dirs() -> tuple:
    dirs = []
    for mod in ("cupy", "cupyx", "cupy_backends"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(m.__file__)))
    return tuple(dirs)


class CupyGpu:
    """recorder.Gpu on CuPy."""

    def __init__(self, cupy, on_external_memory=None):
        self.cupy = cupy
        self.ndarray = cupy.ndarray
        self.runtime = cupy.cuda.runtime
        self.current_stream = cupy.cuda.get_current_stream
        self.library_dirs = _library_dirs()
        self._driver: Optional[CudaDriver] = None
        self._spin = None
        self._on_external_memory = on_external_memory  # first memory CuPy did not allocate (torch's, usually)

    def stream_ptr(self, stream) -> int:
        ptr = getattr(stream, "ptr", None)
        if ptr is None:
            ptr = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
        if ptr is None:
            raise TypeError(f"not a CUDA stream: {stream!r}")
        return ptr

    def stream_kind(self, ptr: int) -> StreamKind:
        rt = self.runtime
        try:
            flags = rt.streamGetFlags(ptr)
        except Exception:  # unknown: assume non-blocking, the kind that implies the fewest edges
            return StreamKind.NON_BLOCKING
        return StreamKind.NON_BLOCKING if flags & rt.streamNonBlocking else StreamKind.BLOCKING

    def is_capturing(self, stream) -> bool:
        ptr = stream if isinstance(stream, int) else getattr(stream, "ptr", None)
        if ptr is None:
            ptr = getattr(stream, "cuda_stream", 0)
        try:
            return bool(self.runtime.streamIsCapturing(ptr))
        except Exception:  # an invalidated capture, or the legacy stream next to a blocking capture
            return True

    def spin(self, stream, us: float) -> None:
        if self._spin is None:
            self._spin = gpu.SpinDelay.get()
        self._spin.enqueue(stream, us)

    def capture_mode(self, value):
        return gpu.capture_mode_of(value, self.runtime)

    def is_array(self, obj) -> bool:
        if isinstance(obj, self.ndarray):
            return True
        return not isinstance(obj, _SCALARS) and hasattr(obj, "__cuda_array_interface__")

    def array_span(self, obj) -> Optional[tuple]:
        if isinstance(obj, self.ndarray):
            if obj.size == 0:
                return None
            ptr, shape, strides, itemsize = obj.data.ptr, obj.shape, obj.strides, obj.itemsize
        else:
            cai = getattr(obj, "__cuda_array_interface__", None)
            if cai is None:
                return None
            ptr = cai["data"][0]
            shape = tuple(cai["shape"])
            itemsize = int(cai["typestr"][2:])
            strides = cai.get("strides")
            if strides is None:
                strides, acc = [], itemsize
                for n in reversed(shape):
                    strides.append(acc)
                    acc *= n
                strides = tuple(reversed(strides))
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

    def driver_range(self, ptr: int) -> Optional[tuple]:
        if self._driver is None:
            self._driver = CudaDriver()
            if self._on_external_memory is not None:
                self._on_external_memory()
        return self._driver.range_of(ptr)
