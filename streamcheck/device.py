"""The device API stream programs are written against.

One front end, two backends: `sim` (CPU, a scheduler picks the interleaving) and
`cupy` (a real GPU). Every call is recorded into a Trace and, unless checking is
switched off, fed to the happens-before checker as it is issued, so a race is
reported whether or not the chosen schedule made it strike.

    dev = Device("sim", policy="delay")
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((4,), "float32", name="x")
    dev.launch(fill, (x,), stream=a, writes=[x])
    done = a.record()
    b.wait_event(done)
    dev.launch(consume, (x,), stream=b, reads=[x])
"""
from __future__ import annotations

import threading
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from . import trace as T
from .hb import Checker, format_report
from .trace import CallSite, Range, StreamKind, caller_site


class DeviceError(RuntimeError):
    """Misuse of the device API: names the call, the object and the call site."""


class KernelError(RuntimeError):
    """A kernel raised while executing; names the launch call site (a GPU reports it later)."""


class Buffer:
    """A device allocation of `shape` and `dtype`. Index the first axis to get a Region."""

    def __init__(self, device: "Device", id: int, shape: tuple, dtype: np.dtype, name: str, site: CallSite):
        self.device = device
        self.id = id
        self.shape = shape
        self.dtype = dtype
        self.name = name
        self.site = site
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.freed = False
        self.storage: Any = None  # the backend's array

    def region(self) -> "Region":
        return Region(self, 0, self.shape[0] if self.shape else 1)

    def __getitem__(self, index) -> "Region":
        return self.region()[index]

    def __repr__(self) -> str:
        return f"Buffer({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class Region:
    """Rows [start, stop) of a buffer's first axis: a contiguous byte range."""

    def __init__(self, buffer: Buffer, start: int, stop: int):
        self.buffer = buffer
        self.start = start
        self.stop = stop

    def __getitem__(self, index) -> "Region":
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise DeviceError(f"{self.buffer.name}[{index!r}]: only contiguous first-axis slices (a:b) are regions")
        start, stop, _ = index.indices(self.stop - self.start)
        return Region(self.buffer, self.start + start, self.start + max(start, stop))

    @property
    def row_bytes(self) -> int:
        rows = self.buffer.shape[0] if self.buffer.shape else 1
        return self.buffer.nbytes // max(rows, 1)

    def byte_range(self) -> Range:
        return Range(self.buffer.id, self.start * self.row_bytes, self.stop * self.row_bytes)

    def array(self):
        """The backend array viewing these rows (for kernels)."""
        storage = self.buffer.storage
        if not self.buffer.shape:
            return storage
        return storage[self.start:self.stop]

    def __repr__(self) -> str:
        return f"{self.buffer.name}[{self.start}:{self.stop}]"


def _as_region(obj, what: str, site: CallSite) -> Region:
    if isinstance(obj, Region):
        region = obj
    elif isinstance(obj, Buffer):
        region = obj.region()
    else:
        raise DeviceError(f"{what} at {site}: expected a Buffer or Region, got {type(obj).__name__}")
    if region.buffer.freed:
        raise DeviceError(f"{what} at {site}: buffer `{region.buffer.name}` was freed; allocate a new one")
    return region


class Stream:
    def __init__(self, device: "Device", id: int, kind: StreamKind, name: str, priority: int = 0):
        self.device = device
        self.id = id
        self.kind = kind
        self.name = name
        self.priority = priority
        self.handle: Any = None  # backend object

    def record(self, event: Optional["Event"] = None) -> "Event":
        """Record `event` (a new one if None) on this stream and return it."""
        event = event if event is not None else self.device.event()
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        self.device._wait(self, event, caller_site())

    def synchronize(self) -> None:
        self.device._sync_stream(self, caller_site())

    def __repr__(self) -> str:
        return f"Stream({self.name!r}, {self.kind.value})"


class Event:
    def __init__(self, device: "Device", id: int, name: str):
        self.device = device
        self.id = id
        self.name = name
        self.destroyed = False
        self.handle: Any = None

    def record(self, stream: Optional[Stream] = None) -> "Event":
        self.device._record_event(self, stream, caller_site())
        return self

    def synchronize(self) -> None:
        self.device._sync_event(self, caller_site())

    def destroy(self) -> None:
        self.device._destroy_event(self, caller_site())

    def __repr__(self) -> str:
        return f"Event({self.name!r})"


class Device:
    """Front end: validates, records, forwards to the backend."""

    def __init__(self, backend="sim", *, check: bool = True, policy="eager", seed: int = 0, **policy_params):
        from .backends import make_backend  # late: cupy is imported only if asked for

        self.trace = T.Trace()
        self.backend = make_backend(backend, device=self, policy=policy, seed=seed, **policy_params)
        self.checker: Optional[Checker] = Checker() if check else None
        self._lock = threading.RLock()
        self._next = {"stream": 1, "event": 1, "buffer": 1}
        self._threads: dict[int, int] = {threading.get_ident(): 0}
        self._per_thread: dict[int, Stream] = {}
        site = caller_site()
        self.legacy = self._new_stream(StreamKind.LEGACY, "legacy", 0, site, id=0)

    # --- recording ----------------------------------------------------------------------
    def _thread_id(self) -> int:
        ident = threading.get_ident()
        tid = self._threads.get(ident)
        if tid is None:
            # A thread we did not see start: unordered with everything (conservative).
            tid = self._threads[ident] = len(self._threads)
            self._record(T.ThreadStart(tid, caller_site(), parent=None))
        return tid

    def _record(self, op: T.Op) -> None:
        self.trace.append(op)
        if self.checker is not None:
            self.checker.feed(op)

    @property
    def races(self):
        return self.checker.races if self.checker is not None else []

    def report(self) -> str:
        return format_report(self.races)

    @property
    def schedule(self):
        return getattr(self.backend, "schedule", None)

    # --- objects ------------------------------------------------------------------------
    def _new_stream(self, kind, name, priority, site, id=None) -> Stream:
        with self._lock:
            if id is None:
                id = self._next["stream"]
                self._next["stream"] += 1
            stream = Stream(self, id, kind, name or f"stream{id}", priority)
            self._record(T.StreamCreate(self._thread_id(), site, stream=id, kind=kind, name=name))
            self.backend.new_stream(stream)
            return stream

    def stream(self, name: str = "", kind="non_blocking", priority: int = 0) -> Stream:
        """A new stream. `kind`: non_blocking (default), blocking."""
        site = caller_site()
        kind = StreamKind.parse(kind)
        if kind in (StreamKind.LEGACY, StreamKind.PER_THREAD):
            raise DeviceError(f"stream() at {site}: {kind.value} streams exist already; use device.legacy "
                              "or device.per_thread_stream()")
        return self._new_stream(kind, name, priority, site)

    def per_thread_stream(self) -> Stream:
        """The calling thread's per-thread default stream (cudaStreamPerThread)."""
        with self._lock:
            tid = self._thread_id()
            if tid not in self._per_thread:
                self._per_thread[tid] = self._new_stream(StreamKind.PER_THREAD, f"per-thread{tid}", 0, caller_site())
            return self._per_thread[tid]

    def event(self, name: str = "") -> Event:
        with self._lock:
            id = self._next["event"]
            self._next["event"] += 1
            event = Event(self, id, name or f"event{id}")
            self._record(T.EventCreate(self._thread_id(), caller_site(), event=id, name=event.name))
            self.backend.new_event(event)
            return event

    def alloc(self, shape, dtype="float32", name: str = "", fill=None) -> Buffer:
        """Allocate device memory. Contents are garbage (NaN in the sim) unless `fill` is given."""
        site = caller_site()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if any((not isinstance(n, (int, np.integer))) or n < 0 for n in shape):
            raise DeviceError(f"alloc at {site}: shape must be non-negative integers, got {shape!r}")
        try:
            dtype = self.backend.dtype(dtype)
        except TypeError as exc:
            raise DeviceError(f"alloc at {site}: unsupported dtype {dtype!r} ({exc})") from None
        with self._lock:
            id = self._next["buffer"]
            self._next["buffer"] += 1
            buf = Buffer(self, id, tuple(int(n) for n in shape), dtype, name or f"buffer{id}", site)
            self._record(T.Alloc(self._thread_id(), site, buffer=id, nbytes=buf.nbytes, name=buf.name))
            self.backend.alloc(buf, fill)
            self.backend.tick()
            return buf

    def free(self, buffer: Buffer, stream: Optional[Stream] = None) -> None:
        """Give memory back. With a stream, the free is ordered on it (as CuPy's pool does)."""
        site = caller_site()
        region = _as_region(buffer, "free", site)
        with self._lock:
            self._record(T.Free(self._thread_id(), site, buffer=region.buffer.id,
                                stream=stream.id if stream is not None else None))
            region.buffer.freed = True
            self.backend.free(region.buffer, stream)
            self.backend.tick()

    # --- work ---------------------------------------------------------------------------
    def _stream_or_default(self, stream: Optional[Stream], what: str, site: CallSite) -> Stream:
        if stream is None:
            return self.legacy
        if not isinstance(stream, Stream) or stream.device is not self:
            raise DeviceError(f"{what} at {site}: {stream!r} is not a stream of this device")
        return stream

    def launch(self, kernel, args: Sequence = (), *, stream: Optional[Stream] = None,
               reads: Iterable = (), writes: Iterable = (), name: str = "") -> None:
        """Enqueue `kernel(*args)` on `stream`. Buffers/Regions in args become backend arrays.
        Every buffer argument must appear in `reads` or `writes`: undeclared accesses are unchecked."""
        site = caller_site()
        name = name or getattr(kernel, "__name__", None) or type(kernel).__name__
        stream = self._stream_or_default(stream, f"launch `{name}`", site)
        reads = [_as_region(r, f"launch `{name}` reads", site) for r in reads]
        writes = [_as_region(w, f"launch `{name}` writes", site) for w in writes]
        declared = {r.buffer.id for r in reads} | {w.buffer.id for w in writes}
        for arg in args:
            if isinstance(arg, (Buffer, Region)):
                region = _as_region(arg, f"launch `{name}`", site)
                if region.buffer.id not in declared:
                    raise DeviceError(f"launch `{name}` at {site}: argument `{region.buffer.name}` is in neither "
                                      "reads= nor writes=; declare how the kernel uses it")
        with self._lock:
            self._record(T.Launch(self._thread_id(), site, stream=stream.id, name=name,
                                  reads=tuple(r.byte_range() for r in reads),
                                  writes=tuple(w.byte_range() for w in writes)))
            self.backend.launch(stream, kernel, tuple(args), name, site)
            self.backend.tick()

    def copy(self, dst, src, stream: Optional[Stream] = None) -> None:
        """Async device-to-device copy on `stream`."""
        site = caller_site()
        stream = self._stream_or_default(stream, "copy", site)
        dst = _as_region(dst, "copy dst", site)
        src = _as_region(src, "copy src", site)
        if dst.byte_range().stop - dst.byte_range().start != src.byte_range().stop - src.byte_range().start:
            raise DeviceError(f"copy at {site}: {src} and {dst} differ in size")
        with self._lock:
            self._record(T.Copy(self._thread_id(), site, stream=stream.id, kind=T.CopyKind.D2D,
                                src=src.byte_range(), dst=dst.byte_range()))
            self.backend.copy(stream, dst, src, site)
            self.backend.tick()

    def upload(self, dst, host_array, stream: Optional[Stream] = None) -> None:
        """Async host-to-device copy on `stream` (the host array must stay alive and unchanged)."""
        site = caller_site()
        stream = self._stream_or_default(stream, "upload", site)
        dst = _as_region(dst, "upload dst", site)
        host_array = np.asarray(host_array)
        with self._lock:
            self._record(T.Copy(self._thread_id(), site, stream=stream.id, kind=T.CopyKind.H2D,
                                src=None, dst=dst.byte_range()))
            self.backend.upload(stream, dst, host_array, site)
            self.backend.tick()

    def download(self, src, stream: Optional[Stream] = None) -> np.ndarray:
        """Async device-to-host copy on `stream`; the returned array is valid after a sync."""
        site = caller_site()
        stream = self._stream_or_default(stream, "download", site)
        src = _as_region(src, "download src", site)
        with self._lock:
            self._record(T.Copy(self._thread_id(), site, stream=stream.id, kind=T.CopyKind.D2H,
                                src=src.byte_range(), dst=None))
            out = self.backend.download(stream, src, site)
            self.backend.tick()
            return out

    def host_read(self, region) -> np.ndarray:
        """Read device memory from the host *now*, with no synchronization."""
        site = caller_site()
        region = _as_region(region, "host_read", site)
        with self._lock:
            self._record(T.HostAccess(self._thread_id(), site, reads=(region.byte_range(),), name="host read"))
            value = self.backend.host_read(region)
            self.backend.tick()
            return value

    def host_write(self, region, value) -> None:
        """Write device memory from the host *now*, with no synchronization."""
        site = caller_site()
        region = _as_region(region, "host_write", site)
        with self._lock:
            self._record(T.HostAccess(self._thread_id(), site, writes=(region.byte_range(),), name="host write"))
            self.backend.host_write(region, value)
            self.backend.tick()

    def get(self, region, stream: Optional[Stream] = None) -> np.ndarray:
        """Like CuPy's ndarray.get(): synchronize `stream` only, then read."""
        stream = self._stream_or_default(stream, "get", caller_site())
        stream.synchronize()
        return self.host_read(region)

    def synchronize(self) -> None:
        site = caller_site()
        with self._lock:
            self._record(T.DeviceSync(self._thread_id(), site))
            self.backend.sync_device(site)

    def note_implicit_sync(self, reason: str) -> None:
        """Record something that looks like a sync but is not one (see trace.ImplicitSync)."""
        with self._lock:
            self._record(T.ImplicitSync(self._thread_id(), caller_site(), reason=reason))

    # --- threads ------------------------------------------------------------------------
    def thread(self, target, args: Sequence = ()) -> "DeviceThread":
        """A host thread whose start and join are ordered for the checker (as threading promises)."""
        return DeviceThread(self, target, tuple(args))

    # --- called by Stream / Event -------------------------------------------------------
    def _record_event(self, event: Event, stream: Optional[Stream], site: CallSite) -> None:
        stream = self._stream_or_default(stream, f"record `{event.name}`", site)
        self._check_event(event, "record", site)
        with self._lock:
            self._record(T.EventRecord(self._thread_id(), site, event=event.id, stream=stream.id))
            self.backend.record(event, stream)
            self.backend.tick()

    def _wait(self, stream: Stream, event: Event, site: CallSite) -> None:
        self._check_event(event, "wait_event", site)
        with self._lock:
            self._record(T.StreamWait(self._thread_id(), site, stream=stream.id, event=event.id))
            self.backend.wait(stream, event)
            self.backend.tick()

    def _sync_stream(self, stream: Stream, site: CallSite) -> None:
        with self._lock:
            self._record(T.StreamSync(self._thread_id(), site, stream=stream.id))
            self.backend.sync_stream(stream, site)

    def _sync_event(self, event: Event, site: CallSite) -> None:
        self._check_event(event, "synchronize", site)
        with self._lock:
            self._record(T.EventSync(self._thread_id(), site, event=event.id))
            self.backend.sync_event(event, site)

    def _destroy_event(self, event: Event, site: CallSite) -> None:
        self._check_event(event, "destroy", site)
        with self._lock:
            self._record(T.EventDestroy(self._thread_id(), site, event=event.id))
            event.destroyed = True

    def _check_event(self, event, what: str, site: CallSite) -> None:
        if not isinstance(event, Event) or event.device is not self:
            raise DeviceError(f"{what} at {site}: {event!r} is not an event of this device")
        if event.destroyed:
            raise DeviceError(f"{what} at {site}: event `{event.name}` was destroyed; create a new one")


class DeviceThread(threading.Thread):
    def __init__(self, device: Device, target, args):
        super().__init__(target=target, args=args, daemon=True)
        self._device = device
        self._tid: Optional[int] = None

    def start(self) -> None:
        dev = self._device
        with dev._lock:
            parent = dev._thread_id()
            self._tid = len(dev._threads)
            dev._threads[("pending", self._tid)] = self._tid  # reserve the id
            dev._record(T.ThreadStart(self._tid, caller_site(), parent=parent))
        super().start()

    def run(self) -> None:
        dev = self._device
        with dev._lock:
            del dev._threads[("pending", self._tid)]
            dev._threads[threading.get_ident()] = self._tid
        super().run()

    def join(self, timeout=None) -> None:
        super().join(timeout)
        dev = self._device
        with dev._lock:
            dev._record(T.ThreadJoin(dev._thread_id(), caller_site(), child=self._tid))
