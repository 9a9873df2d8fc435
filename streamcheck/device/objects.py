"""The device API's objects that its backends handle too: Buffer and Region (a buffer's rows,
a byte range of its allocation), the errors, and the call-site resolver of the device API.

A leaf: the front end (api.py) and the backends (backends/) import it; it imports only
the core and numpy, so neither has to import the other.
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

import numpy as np

from ..core.fast import untrack
from ..core.trace import CallSite, Range, SiteResolver

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # streamcheck/
# Frames in the device API, its backends and the analysis are machinery, never the user's call site;
# so are the runners that call a user's program (the plugin, its time limit, confirmation, the sync
# audit's proof): a stack ends at the program's outermost frame, not in them.
caller_site = SiteResolver(os.path.join(_PACKAGE_DIR, name) for name in (
    "device" + os.sep, "emulation" + os.sep, os.path.join("record", "gpu.py"), os.path.join("record", "host_views.py"),
    "core" + os.sep, "plugin" + os.sep,
    "timeout.py", "host_handoffs.py", os.path.join("proofs", "confirm.py"), os.path.join("proofs", "sync_proof.py")))


class DeviceError(RuntimeError):
    """Misuse of the device API: names the call, the object and the call site."""


class KernelError(RuntimeError):
    """A kernel raised while executing; names the launch call site (a GPU reports it later).
    Attributes: `kernel` (name), `launch_site` (CallSite), `stream` (name)."""


class UndeclaredWriteError(KernelError):
    """A kernel wrote an argument its launch declared only in reads= (the sim passes those
    read-only). Attributes: those of KernelError, and `arguments`: the kernel's parameter names
    of its read-only arguments (numpy does not say which one it wrote)."""


class Buffer:
    """A device allocation of `shape` and `dtype` on device `device_index` (cuda:N) of the
    Device `device`. Index the first axis to get a Region."""

    def __init__(self, device, id: int, shape: tuple, dtype: np.dtype, name: str, site: CallSite,
                 device_index: int = 0):
        self.device = device
        self.device_index = device_index
        self.id = id
        self.shape = shape
        self.dtype = dtype
        self.name = name
        self.site = site
        self.nbytes = math.prod(shape) * dtype.itemsize
        self.freed = False
        self.storage: Any = None  # the backend's array
        self._whole: Optional[Region] = None

    def region(self) -> "Region":
        """All of the buffer (a scalar buffer counts as one row)."""
        whole = self._whole
        if whole is None:
            whole = self._whole = Region(self, 0, self.shape[0] if self.shape else 1)
        return whole

    def __getitem__(self, index) -> "Region":
        return self.region()[index]

    def __repr__(self) -> str:
        on = f", device={self.device_index}" if self.device_index else ""
        return f"Buffer({self.name!r}, shape={self.shape}, dtype={self.dtype}{on})"


class Region:
    """Rows [start, stop) of a buffer's first axis: a contiguous byte range."""

    __slots__ = ("buffer", "start", "stop", "_range")  # one per tensor argument of every emulated operator

    def __init__(self, buffer: Buffer, start: int, stop: int):
        self.buffer = buffer
        self.start = start
        self.stop = stop
        self._range: Optional[Range] = None

    def __getitem__(self, index) -> "Region":
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise DeviceError(f"{self!r}[{index!r}] at {caller_site()}: only contiguous first-axis slices (a:b) are "
                              "regions; index the array inside the kernel instead")
        rows = self.stop - self.start
        start = 0 if index.start is None else index.start
        stop = rows if index.stop is None else index.stop
        if type(start) is not int or type(stop) is not int or start < 0 or stop < 0:
            start, stop = self._row(start, index), self._row(stop, index)  # numpy ints, negative bounds, bad types
        if 0 <= start <= stop <= rows and self.buffer.shape:
            return Region(self.buffer, self.start + start, self.start + stop)
        # Unlike a Python slice, a region never clips: rows past the end are a bug in the caller's
        # arithmetic, and clipping would hide it (the kernel would get fewer rows than it was meant to).
        if not self.buffer.shape:
            problem = f"buffer `{self.buffer.name}` is a scalar (shape ()), which has no rows; pass the buffer itself"
        elif not (0 <= start <= rows and 0 <= stop <= rows):
            problem = (f"{_slice_text(index)} is not within the {rows} rows of {self!r}; slice within 0:{rows} "
                       f"(negative bounds count from the end, down to -{rows})")
        else:
            problem = f"stop {stop} is before start {start}; write [{start}:{start}] for no rows"
        raise DeviceError(f"{self!r}[{_slice_text(index)}] at {caller_site()}: {problem}")

    def _row(self, bound, index: slice) -> int:
        """A slice bound as a row of this region: a negative one counts from the end."""
        if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)):
            raise DeviceError(f"{self!r}[{_slice_text(index)}] at {caller_site()}: slice bounds must be integers, "
                              f"got {bound!r}")
        return int(bound) + (self.stop - self.start if bound < 0 else 0)

    @property
    def shape(self) -> tuple:
        """The shape of `array()`: these rows of the buffer (a scalar buffer's only region is shape ())."""
        shape = self.buffer.shape
        return (self.stop - self.start,) + shape[1:] if shape else ()

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def size(self) -> int:
        """Number of elements."""
        rng = self.byte_range()
        return (rng.stop - rng.start) // self.buffer.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        rows = self.buffer.shape[0] if self.buffer.shape else 1
        return self.buffer.nbytes // max(rows, 1)

    def byte_range(self) -> Range:
        rng = self._range
        if rng is None:
            row = self.row_bytes
            rng = self._range = Range(self.buffer.id, self.start * row, self.stop * row)
            untrack(rng)  # frozen and acyclic: the GC need not walk the trace's Ranges (core.fast.untrack)
        return rng

    def array(self):
        """The backend array viewing these rows (for kernels)."""
        buffer = self.buffer
        shape = buffer.shape
        if not shape or (self.start == 0 and self.stop == shape[0]):
            return buffer.storage  # the whole buffer: no view to build
        return buffer.storage[self.start:self.stop]

    def __repr__(self) -> str:
        return f"{self.buffer.name}[{self.start}:{self.stop}]"


def _slice_text(index: slice) -> str:
    """`index` as the user wrote it: 4:100, :3, -2:."""
    return ":".join("" if bound is None else repr(bound) for bound in (index.start, index.stop))
