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

Misuse raises DeviceError at the call that made it, naming the call, the object
and the user's line; it is never deferred to when the work happens to execute.
Values are never changed on the way in: upload, host_write and fill take data of
another dtype only when every value converts exactly (int64 3 into int8, float64 1.5
into float32); what would wrap, truncate or round is refused. A region never clips:
x[4:100] of 8 rows is refused, not shortened. On the sim, an argument that no declared
write overlaps reaches the kernel read-only, so writing it raises UndeclaredWriteError.

Stream capture (CUDA graphs): work issued to a capturing stream, and to streams forked
from it through events, becomes graph nodes instead of executing; `end_capture` returns
a Graph that runs all of it, as one unit of work on a stream, every time it is launched.

    main.begin_capture()
    ...fork to A and B with events, issue work, join both back into main...
    graph = main.end_capture()
    graph.launch(main)

The device's CaptureTracker (capture.py) decides what a capture holds; what CUDA refuses
during capture raises its CaptureError, with CUDA's error name, after the call has been
recorded into the trace (so the checker sees the same call and collects the same error).

Several devices (the sim models them on the CPU): `Device("sim", devices=2)` has cuda:0 and
cuda:1; streams and buffers take `device=`, each device has its own legacy stream
(`legacy_stream(1)`), events cross devices, `copy`/`copy_peer` copy between devices, a kernel
touching another device's memory needs `enable_peer_access` (else PeerAccessError), and
`all_reduce` / `reduce_scatter` / `all_to_all` model one NCCL collective over the ranks' comm
streams, returning a Work whose `wait(streams)` is torch's `work.wait()`.

    dev = Device("sim", devices=2)
    comm = [dev.stream("comm", device=k) for k in range(2)]
    grads = [dev.alloc((4,), device=k, fill=1.0) for k in range(2)]
    work = dev.all_reduce(grads, comm, wait_for=[dev.legacy_stream(k) for k in range(2)])
    work.wait([dev.legacy_stream(k) for k in range(2)])
"""
from __future__ import annotations

import threading
import traceback
import weakref
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ..core import trace as T
from ..core.capture import CaptureError, CapturedGraph, CaptureTracker
from ..core.fast import new_checker, untrack
from ..core.hb import Checker, PeerAccessError, format_hazards, format_report, peer_access_error
from ..core.trace import CallSite, StreamKind
from ..host_handoffs import Listener, listen as listen_to_hand_offs
from .objects import Buffer, DeviceError, KernelError, Region, UndeclaredWriteError, caller_site

# The public names are listed once, in streamcheck/device/__init__.py (__all__).

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_to_all")
# The device each host thread joined last (made it, was started by it, used it): the one that hears
# its hand-offs (_HandOffs).
_joined = threading.local()


class _WeakTable:
    """id -> object, held weakly: plain weak references, the dead ones dropped each time the table
    doubles (a WeakValueDictionary's keyed reference costs a Python call per entry, and a buffer is
    made for every emulated operator's result)."""

    __slots__ = ("_refs", "_prune_at")

    def __init__(self):
        self._refs: dict = {}
        self._prune_at = 1024

    def __setitem__(self, key, value) -> None:
        refs = self._refs
        refs[key] = weakref.ref(value)
        if len(refs) >= self._prune_at:
            self._refs = refs = {k: ref for k, ref in refs.items() if ref() is not None}
            self._prune_at = max(1024, 2 * len(refs))

    def get(self, key, default=None):
        ref = self._refs.get(key)
        value = ref() if ref is not None else None
        return default if value is None else value

    def __getitem__(self, key):
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value


def _type_name(obj) -> str:
    return type(obj).__name__


def _exactly(values: np.ndarray, dtype: np.dtype, what: str, holder: str, data: str) -> np.ndarray:
    """`values` as `dtype`, or DeviceError unless every value converts exactly: numpy's cast wraps
    integers (int8 1000 is -24), truncates fractions and rounds floats without a word, and a stream
    program would then compute on numbers nobody wrote. The message is `what`: `holder` dtype,
    but `data` is ..."""
    if values.dtype == dtype:
        return values
    if values.dtype.kind not in "biuf":
        raise DeviceError(f"{what}: {holder} {dtype}, but {data} is {values.dtype}, which is not numbers; "
                          f"pass an array of {dtype}")
    with np.errstate(all="ignore"):  # NaN or inf to an integer is garbage: the round trip refuses it
        converted = values.astype(dtype)
        back = converted.astype(values.dtype)
    lost = back != values
    if values.dtype.kind == "f":
        lost &= ~(np.isnan(back) & np.isnan(values))
    if values.dtype.kind in "iu" and dtype.kind in "iu":
        lost |= converted != values  # a signed <-> unsigned wrap survives the round trip
    if lost.any():
        first = int(np.flatnonzero(lost)[0])
        index = [int(i) for i in np.unravel_index(first, values.shape)]
        where = "" if not index else f" (element {index[0] if len(index) == 1 else tuple(index)})"
        raise DeviceError(f"{what}: {holder} {dtype}, but {data} is {values.dtype} and its "
                          f"{values.flat[first].item()!r}{where} is not exactly representable in {dtype}; convert "
                          f"it yourself with the rounding or clipping you mean (e.g. .astype(np.{dtype})), or use a "
                          "dtype that holds it")
    return converted


class Stream:
    def __init__(self, device: "Device", id: int, kind: StreamKind, name: str, priority: int = 0,
                 device_index: int = 0):
        self.device = device
        self.device_index = device_index  # cuda:N the stream belongs to
        self.id = id
        self.kind = kind
        self.name = name
        self.priority = priority
        self.handle: Any = None  # backend object

    def record(self, event: Optional["Event"] = None) -> "Event":
        """Record `event` (a new one if None) on this stream and return it."""
        site = caller_site()
        event = event if event is not None else self.device._new_event("", site)
        self.device._record_event(event, self, site)
        return event

    def wait_event(self, event: "Event") -> None:
        """Order later work on this stream after the work `event` captured *now*."""
        self.device._wait(self, event, caller_site())

    def synchronize(self) -> None:
        """Block the host until everything issued to this stream so far has executed."""
        self.device._sync_stream(self, caller_site())

    def query(self) -> bool:
        """cudaStreamQuery: True if everything issued to this stream so far has executed. Never
        blocks. True is a synchronization (the host is ordered after that work, as by
        synchronize()); False orders nothing."""
        return self.device._query_stream(self, caller_site())

    def begin_capture(self, mode="global") -> None:
        """cudaStreamBeginCapture: from now on, work issued to this stream (and to streams that
        wait on an event recorded on it) is captured into a graph instead of executing.
        `mode`: global (default), thread_local or relaxed (cudaStreamCaptureMode)."""
        self.device._begin_capture(self, mode, caller_site())

    def end_capture(self) -> "Graph":
        """cudaStreamEndCapture: the captured work as a Graph; every stream forked from this
        one must have been joined back into it (CaptureError cudaErrorStreamCaptureUnjoined)."""
        return self.device._end_capture(self, caller_site())

    @property
    def is_capturing(self) -> bool:
        """True while this stream captures (it began a capture, or forked into one)."""
        return self.device.capture_tracker.capturing(self.id) is not None

    def __repr__(self) -> str:
        on = f", device={self.device_index}" if self.device_index else ""
        return f"Stream({self.name!r}, {self.kind.value}{on})"


class Event:
    def __init__(self, device: "Device", id: int, name: str):
        self.device = device
        self.id = id
        self.name = name
        self.destroyed = False
        self.handle: Any = None
        self._recorded_outside = False  # whether its last record executed (made outside any capture)

    def record(self, stream: Optional[Stream] = None) -> "Event":
        """Capture the work issued to `stream` (the legacy stream if None) so far."""
        self.device._record_event(self, stream, caller_site())
        return self

    def synchronize(self) -> None:
        """Block the host until the captured work has executed (at once if never recorded)."""
        self.device._sync_event(self, caller_site())

    def query(self) -> bool:
        """cudaEventQuery: True if the captured work has executed (True at once if never recorded).
        Never blocks. True orders the host after that work; False orders nothing."""
        return self.device._query_event(self, caller_site())

    def destroy(self) -> None:
        self.device._destroy_event(self, caller_site())

    def __repr__(self) -> str:
        return f"Event({self.name!r})"


class Graph:
    """An executable CUDA graph made by Stream.end_capture(). `nodes` are the captured kernels
    and copies (capture.CapturedNode: stream, per-stream seq, graph-order clock, trace op)."""

    def __init__(self, device: "Device", captured: CapturedGraph, handle: Any, buffers: tuple):
        self.device = device
        self.captured = captured
        self.handle = handle  # the backend's executable graph
        self.buffers = buffers  # every Buffer a node touches: launching after a free is refused
        self.launches = 0

    @property
    def id(self) -> int:
        return self.captured.id

    @property
    def nodes(self) -> tuple:
        return self.captured.nodes

    def launch(self, stream: Optional[Stream] = None) -> None:
        """cudaGraphLaunch on `stream` (the legacy stream if None): the whole graph runs after
        the work issued to `stream` so far and before work issued to it later."""
        self.device._launch_graph(self, stream, caller_site())

    def __repr__(self) -> str:
        origin = self.device._stream_names.get(self.captured.origin, f"stream{self.captured.origin}")
        return (f"Graph({self.id}, {len(self.nodes)} nodes, captured on {origin!r} "
                f"at {self.captured.begin_site}..{self.captured.end_site})")


class Work:
    """What a collective returns, as torch.distributed's `async_op=True` does: `events[k]` was
    recorded on rank k's comm stream right after the collective (ProcessGroupNCCL records its
    work events there)."""

    def __init__(self, device: "Device", name: str, streams: tuple, events: tuple, site: CallSite):
        self.device = device
        self.name = name
        self.streams = streams
        self.events = events
        self.site = site

    def wait(self, streams: Sequence[Stream]) -> None:
        """torch's `work.wait()`: each rank's stream (its current stream, one per rank, in rank
        order) waits for the collective; an ordinary event wait, so later work on those streams
        is ordered after it. The host does not wait."""
        site = caller_site()
        streams = self.device._rank_streams(streams, f"{self.name} work.wait", site, len(self.events))
        for stream, event in zip(streams, self.events):
            self.device._wait(stream, event, site)

    def synchronize(self) -> None:
        """The host waits until every rank's part of the collective has run."""
        site = caller_site()
        for event in self.events:
            self.device._sync_event(event, site)

    def __repr__(self) -> str:
        return f"Work({self.name!r}, {len(self.events)} ranks, issued at {self.site})"


class Device:
    """Front end: validates, records, forwards to the backend."""

    def __init__(self, backend="sim", *, check: bool = True, policy="eager", seed: int = 0, devices: int = 1,
                 strict_free: bool = False, **policy_params):
        from .backends import make_backend  # late: cupy is imported only if asked for

        site = caller_site()
        if not isinstance(check, bool):
            raise DeviceError(f"Device() at {site}: check must be True or False, got {check!r}")
        if not isinstance(strict_free, bool):
            raise DeviceError(f"Device() at {site}: strict_free must be True or False, got {strict_free!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise DeviceError(f"Device() at {site}: seed must be an integer, got {seed!r}")
        if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1:
            raise DeviceError(f"Device() at {site}: devices must be an integer >= 1 (how many of cuda:0, cuda:1, ... "
                              f"the program uses), got {devices!r}")
        self.devices = int(devices)
        self.trace = T.Trace()
        # Always on, even with check=False: the sim backend asks it what a capture holds,
        # and CUDA's capture errors must be raised whether or not races are checked.
        self.capture_tracker = CaptureTracker()
        self._stream_names: dict = {}  # stream id -> name, for Graph's repr
        self._stream_objects: dict = {}  # stream id -> Stream, for the sync audit's replacement waits
        self._event_objects = _WeakTable()  # event id -> Event, likewise
        self._edits = None  # the sync audit's proof rerun: syncs skipped or replaced (edit_syncs)
        self._fresh: dict = {}  # stream id -> the replacement event recorded on it
        self._buffers = _WeakTable()  # buffer id -> Buffer, for what a graph touches
        self._downloaded: dict = {}  # id(array download returned) -> (a weak ref to it, the host bytes the copy writes)
        self.backend = make_backend(backend, device=self, policy=policy, seed=int(seed), **policy_params)
        # A free is a race only once an allocation gets its bytes too early (core.trace.Free), unless
        # asked for the strict rule or the backend's pool may hand them out unseen.
        self.strict_free = strict_free or not self.backend.sees_reuse
        limit = self.backend.max_devices
        if limit is not None and self.devices > limit:
            raise DeviceError(f"Device({self.backend.name!r}, devices={self.devices}) at {site}: the "
                              f"{self.backend.name} backend drives {limit} device{'s' if limit != 1 else ''} "
                              f"here, fewer than the {self.devices} asked for; several devices run on the sim "
                              f"(Device('sim', devices={self.devices}))")
        self.checker: Optional[Checker] = new_checker() if check else None
        self._peers: set = set()  # (device, peer): enable_peer_access(device, peer) was called
        self._lock = threading.RLock()
        self._next = {"stream": 1, "event": 1, "buffer": 1, "graph": 1, "thread": 1}
        self._threads: dict = {threading.get_ident(): 0}  # ident of a running host thread -> its id
        _joined.device = weakref.ref(self)
        self._per_thread: dict[int, Stream] = {}
        # Named "legacy" for delay targets; recorded without a name so reports say
        # "legacy default stream".
        self.legacy = self._new_stream(StreamKind.LEGACY, "", 0, site, id=0, label="legacy")
        # One legacy default stream per device; cuda:0's keeps id 0 and the name "legacy".
        self.legacies = (self.legacy,) + tuple(
            self._new_stream(StreamKind.LEGACY, "", 0, site, label=f"legacy:{k}", device_index=k)
            for k in range(1, self.devices))
        # Host threads' own hand-offs (threading.Event, queue.Queue, locks, Condition, Barrier) are
        # edges while the device lives (host_handoffs.py; docs/cuda-rules.md, section 2).
        self._hand_offs = _HandOffs(self)
        weakref.finalize(self, listen_to_hand_offs(self._hand_offs))

    # --- recording ----------------------------------------------------------------------
    def _thread_id(self) -> int:
        tid = self._threads.get(threading.get_ident())
        if tid is None:
            # A thread we did not see start: unordered with everything (conservative).
            tid = self._threads[threading.get_ident()] = self._next["thread"]
            self._next["thread"] += 1
            _joined.device = weakref.ref(self)
            self._record(T.ThreadStart(tid, caller_site(), parent=None))
        return tid

    def host_thread(self) -> int:
        """The calling thread's host thread id in this device's trace (a new one at its first call)."""
        with self._lock:
            return self._thread_id()

    def issue_as(self, host_thread: int) -> None:
        """The calling OS thread's calls are recorded as `host_thread`'s from now on: one host thread
        working on two OS threads, the second while the first waits for it (torch's autograd engine
        runs a backward pass's device work on its own thread while the backward() caller blocks)."""
        with self._lock:
            self._threads[threading.get_ident()] = host_thread
        _joined.device = weakref.ref(self)

    def _record(self, op: T.Op) -> None:
        if self._edits is not None:
            self._edits.see(op)
        self.trace.append(op)
        untrack(op)  # frozen and acyclic: the GC need not walk the trace (core.fast.untrack)
        if self.checker is not None:
            self.checker.feed(op)

    @property
    def races(self):
        return self.checker.races if self.checker is not None else []

    @property
    def hazards(self):
        """Frees with a use pending on another stream that no allocation reused (core.hb.Hazard)."""
        return self.checker.hazards if self.checker is not None else []

    def report(self, width: Optional[int] = None) -> str:
        """The race reports, then the free hazards; lines wrapped at `width` columns (None:
        unwrapped, for files)."""
        hazards = format_hazards(self.hazards, width=width)
        return format_report(self.races, width=width) + (f"\n\n{hazards}" if hazards else "")

    @property
    def schedule(self):
        return self.backend.schedule

    def buffer(self, id: int) -> Optional[Buffer]:
        """The live Buffer with trace id `id` (a trace's ranges name buffers by id), or None
        once the program dropped it."""
        return self._buffers.get(id)

    # --- validation ---------------------------------------------------------------------
    def _region(self, obj, what: str, site: CallSite, name: str = "") -> Region:
        """`obj` as a live Region of this device. `what` names the call in errors; a `{}`
        in it is filled with `name` (formatted only on error: this runs per argument)."""
        if isinstance(obj, Region):
            region = obj
        elif isinstance(obj, Buffer):
            region = obj.region()
        else:
            raise DeviceError(f"{what.format(name)} at {site}: expected a Buffer or Region, got {_type_name(obj)}")
        buf = region.buffer
        if buf.device is not self:
            raise DeviceError(f"{what.format(name)} at {site}: buffer `{buf.name}` belongs to another Device")
        if buf.freed:
            raise DeviceError(f"{what.format(name)} at {site}: buffer `{buf.name}` was freed; allocate a new one")
        return region

    def _regions(self, objs, what: str, site: CallSite, name: str = "") -> list:
        if type(objs) is not list and type(objs) is not tuple:
            if isinstance(objs, (Buffer, Region, str, bytes)) or not isinstance(objs, Iterable):
                raise DeviceError(f"{what.format(name)} at {site}: expected a list of Buffers/Regions, got "
                                  f"{_type_name(objs)}; wrap a single buffer in a list")
        out = []
        for obj in objs:
            # Fast paths for a live buffer of this device and its regions; _region does the checks and errors.
            kind = type(obj)
            if kind is Region and obj.buffer.device is self and not obj.buffer.freed:
                out.append(obj)
            elif kind is Buffer and obj.device is self and not obj.freed:
                out.append(obj.region())
            else:
                out.append(self._region(obj, what, site, name))
        return out

    def _device_index(self, device, what: str, site: CallSite) -> int:
        """`device` checked against this Device's devices."""
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or not 0 <= device < self.devices:
            if self.devices == 1:
                has = "has device 0 only"
            else:
                has = f"has devices {', '.join(map(str, range(self.devices - 1)))} and {self.devices - 1}"
            raise DeviceError(f"{what} at {site}: Device({self.backend.name!r}, devices={self.devices}) {has}; "
                              f"got {device!r}")
        return int(device)

    def legacy_stream(self, device: int = 0) -> Stream:
        """The legacy default stream of cuda:`device` (device 0's is `self.legacy`)."""
        return self.legacies[self._device_index(device, "legacy_stream", caller_site())]

    def _stream_or_default(self, stream: Optional[Stream], what: str, site: CallSite) -> Stream:
        if stream is None:
            return self.legacy
        if not isinstance(stream, Stream) or stream.device is not self:
            raise DeviceError(f"{what} at {site}: {stream!r} is not a stream of this device")
        return stream

    @staticmethod
    def _name(name, what: str, site: CallSite) -> str:
        if not isinstance(name, str):
            raise DeviceError(f"{what} at {site}: name must be a string, got {name!r}")
        return name

    # --- objects ------------------------------------------------------------------------
    def _new_stream(self, kind, name, priority, site, id=None, label: str = "", device_index: int = 0) -> Stream:
        with self._lock:
            if id is None:
                id = self._next["stream"]
                self._next["stream"] += 1
            tid = self._thread_id()
            op = T.StreamCreate(tid, site, stream=id, kind=kind, name=name, device=device_index)
            if self._edits is not None:  # a proof rerun without this stream's implicit legacy join
                op = self._edits.stream_create(op)
                kind = op.kind
            stream = Stream(self, id, kind, label or name or f"stream{id}", priority, device_index)
            self._stream_objects[id] = stream
            self._record(op)
            self.capture_tracker.stream_created(id, kind, T.stream_label(kind, name, id, tid))
            self._stream_names[id] = stream.name
            self.backend.new_stream(stream)
            return stream

    def stream(self, name: str = "", kind="non_blocking", priority: int = 0, device: int = 0) -> Stream:
        """A new stream of cuda:`device`. `kind`: non_blocking (default, cudaStreamNonBlocking) or
        blocking (cudaStreamDefault: synchronizes with its device's legacy default stream)."""
        site = caller_site()
        name = self._name(name, "stream()", site)
        device = self._device_index(device, f"stream({name!r})", site)
        try:
            kind = StreamKind.parse(kind)
        except ValueError as exc:
            raise DeviceError(f"stream({name!r}) at {site}: {exc}") from None
        if kind in (StreamKind.LEGACY, StreamKind.PER_THREAD):
            raise DeviceError(f"stream({name!r}) at {site}: {kind.value} streams exist already; use "
                              "device.legacy or device.per_thread_stream()")
        if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
            raise DeviceError(f"stream({name!r}) at {site}: priority must be an integer, got {priority!r}")
        return self._new_stream(kind, name, int(priority), site, device_index=device)

    def per_thread_stream(self, device: int = 0) -> Stream:
        """The calling thread's per-thread default stream of cuda:`device` (cudaStreamPerThread)."""
        site = caller_site()
        device = self._device_index(device, "per_thread_stream", site)
        with self._lock:
            tid = self._thread_id()
            key = tid if device == 0 else (tid, device)
            if key not in self._per_thread:
                name = f"per-thread{tid}" if device == 0 else f"per-thread{tid}:{device}"
                self._per_thread[key] = self._new_stream(StreamKind.PER_THREAD, name, 0, site, device_index=device)
            return self._per_thread[key]

    def event(self, name: str = "") -> Event:
        site = caller_site()
        return self._new_event(self._name(name, "event()", site), site)

    def _new_event(self, name: str, site: CallSite) -> Event:
        with self._lock:
            id = self._next["event"]
            self._next["event"] += 1
            event = Event(self, id, name or f"event{id}")
            self._event_objects[id] = event
            self._record(T.EventCreate(self._thread_id(), site, event=id, name=event.name))
            self.backend.new_event(event)
            return event

    def alloc(self, shape, dtype="float32", name: str = "", fill=None, device: int = 0,
              reuse: Optional[Buffer] = None, stream: Optional[Stream] = None) -> Buffer:
        """Allocate memory on cuda:`device`. Contents are garbage (NaN in the sim) unless `fill` is
        given (it broadcasts to `shape` and must convert exactly to `dtype`). `reuse`: a freed
        buffer of the same size whose bytes this one gets, as they were last written (a caching
        allocator handing a freed block to its next allocation: pending work on them still runs);
        `stream`: the stream whose pool hands them out (its work so far is ordered before the new
        owner's). A use of those bytes pending since the free and ordered before neither that
        stream nor the host is a FREE race."""
        site = caller_site()
        if reuse is not None:
            if stream is not None:
                self._stream_or_default(stream, "alloc(reuse=)", site)
            return self._realloc(reuse, shape, dtype, name, device, site, stream)
        name = self._name(name, "alloc", site)
        device = self._device_index(device, f"alloc {name!r}", site)
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape = (shape,)
        try:
            shape = tuple(shape)
        except TypeError:
            raise DeviceError(f"alloc {name!r} at {site}: shape must be an integer or a tuple of integers, "
                              f"got {shape!r}") from None
        if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
            raise DeviceError(f"alloc {name!r} at {site}: shape must be non-negative integers, got {shape!r}")
        shape = tuple(int(n) for n in shape)
        if dtype is None:
            raise DeviceError(f"alloc {name!r} at {site}: give a dtype (e.g. 'float32')")
        try:
            dtype = self.backend.dtype(dtype)
        except TypeError as exc:
            raise DeviceError(f"alloc {name!r} at {site}: unsupported dtype {dtype!r} ({exc})") from None
        if fill is not None:
            try:
                np.broadcast_to(fill, shape)
                fill = np.asarray(fill)
            except (TypeError, ValueError) as exc:
                raise DeviceError(f"alloc {name!r} at {site}: fill {fill!r} does not fit shape {shape} "
                                  f"dtype {dtype} ({exc})") from None
            fill = _exactly(fill, dtype, f"alloc {name!r} at {site}", "the buffer holds", "fill")
            if fill.ndim == 0:
                fill = fill[()]  # a scalar of the buffer's dtype, as both backends' fills take
        return self._new_buffer(shape, dtype, name, device, site, fill=fill)

    def _realloc(self, reuse, shape, dtype, name: str, device: int, site: CallSite, stream=None) -> Buffer:
        """alloc(reuse=): the freed buffer's bytes as they are, under a new buffer (its shape, dtype
        and device must be the ones asked for; a caching allocator's hot path, so nothing else)."""
        if not isinstance(reuse, Buffer) or reuse.device is not self or not reuse.freed:
            raise DeviceError(f"alloc at {site}: reuse= takes a freed Buffer of this device, got {reuse!r}")
        if isinstance(shape, int):
            shape = (shape,)
        if tuple(shape) != reuse.shape or (dtype is not reuse.dtype and np.dtype(dtype) != reuse.dtype) or \
                device != reuse.device_index:
            raise DeviceError(f"alloc at {site}: reuse= {reuse!r} is not shape {tuple(shape)}, dtype {dtype} on "
                              f"cuda:{device}; a reused buffer keeps its shape, dtype and device")
        return self._new_buffer(reuse.shape, reuse.dtype, name, device, site, reuse=reuse, stream=stream)

    def _new_buffer(self, shape: tuple, dtype, name: str, device: int, site: CallSite, fill=None,
                    reuse: Optional[Buffer] = None, stream: Optional[Stream] = None) -> Buffer:
        """A buffer of checked arguments: numbered, recorded, and given fresh memory by the backend,
        or `reuse`'s bytes as they are."""
        with self._lock:
            id = self._next["buffer"]
            self._next["buffer"] += 1
            buf = Buffer(self, id, shape, dtype, name or f"buffer{id}", site, device)
            self._buffers[id] = buf
            reuses = () if reuse is None else (untrack(T.Range(reuse.id, 0, reuse.nbytes)),)
            self._record(T.Alloc(self._thread_id(), site, buffer=id, nbytes=buf.nbytes, name=buf.name, device=device,
                                 stream=stream.id if stream is not None else None, reuses=reuses))
            if reuse is None:
                self.backend.alloc(buf, fill)
            else:
                buf.storage = reuse.storage
            self.backend.tick()
            return buf

    def free(self, buffer: Buffer, stream: Optional[Stream] = None) -> None:
        """Give memory back. With a stream, the free is ordered on it (as CuPy's pool does)."""
        site = caller_site()
        self._check_free(buffer, stream, site)
        self._release(buffer, stream, site)

    def _check_free(self, buffer, stream: Optional[Stream], site: CallSite) -> None:
        if not isinstance(buffer, Buffer):
            raise DeviceError(f"free at {site}: expected a Buffer, got {_type_name(buffer)}")
        self._region(buffer, "free", site)
        if stream is not None:
            what = f"free `{buffer.name}`"
            self._stream_or_default(stream, what, site)
            if self.capture_tracker.active:  # no stream captures otherwise: one test on the caching allocator's path
                self._refuse_if_capturing(stream, what, site,
                                          "free it on a stream that is not capturing, or after end_capture")

    def _release(self, buffer: Buffer, stream: Optional[Stream], site: CallSite) -> None:
        """A checked free: recorded, and the buffer's bytes given back."""
        with self._lock:
            self._record(T.Free(self._thread_id(), site, buffer=buffer.id,
                                stream=stream.id if stream is not None else None, strict=self.strict_free))
            buffer.freed = True
            self.backend.free(buffer, stream)
            self.backend.tick()

    # --- work ---------------------------------------------------------------------------
    def launch(self, kernel, args: Sequence = (), *, stream: Optional[Stream] = None,
               reads: Iterable = (), writes: Iterable = (), name: str = "") -> None:
        """Enqueue `kernel(*args)` on `stream`. Buffers/Regions in args become backend arrays.
        Every buffer argument must appear in `reads` or `writes`: undeclared accesses are unchecked.
        On the sim an argument that no declared write overlaps is passed read-only (a write to
        it raises UndeclaredWriteError); a GPU cannot enforce that."""
        site = caller_site()
        if not name:
            name = getattr(kernel, "__name__", None) or _type_name(kernel)
        elif not isinstance(name, str):
            raise DeviceError(f"launch at {site}: name must be a string, got {name!r}")
        if not callable(kernel):
            raise DeviceError(f"launch `{name}` at {site}: kernel must be callable, got {_type_name(kernel)}")
        if not isinstance(args, (tuple, list)):
            raise DeviceError(f"launch `{name}` at {site}: args must be a tuple or list, got {_type_name(args)}; "
                              "write args=(x,) for one argument")
        if stream is None:
            stream = self.legacy
        elif type(stream) is not Stream or stream.device is not self:
            stream = self._stream_or_default(stream, f"launch `{name}`", site)
        reads = self._regions(reads, "launch `{}` reads=", site, name) if reads else []
        writes = self._regions(writes, "launch `{}` writes=", site, name) if writes else []
        declared = None
        for arg in args:
            if isinstance(arg, (Buffer, Region)):
                if declared is None:
                    declared = {r.buffer.id for r in reads}
                    declared.update([w.buffer.id for w in writes])
                # A declared buffer passed the checks above; anything else gets them now.
                buf = arg.buffer if isinstance(arg, Region) else arg
                if buf.id not in declared or buf.device is not self:
                    buf = self._region(arg, "launch `{}` args", site, name).buffer
                    raise DeviceError(f"launch `{name}` at {site}: argument `{buf.name}` is in neither "
                                      "reads= nor writes=; declare how the kernel uses it")
        self._issue_launch(kernel, tuple(args), stream, reads, writes, name, site)

    def _issue_launch(self, kernel, args: tuple, stream: Stream, reads, writes, name: str, site: CallSite) -> None:
        """A checked launch (`reads`, `writes`: live Regions of this device): recorded and issued."""
        error = self._peer_check(name, site, stream, reads, writes) if self.devices > 1 else None
        reads = tuple([r.byte_range() for r in reads])
        writes = tuple([w.byte_range() for w in writes])
        with self._lock:
            self._record_work(T.Launch(self._thread_id(), site, stream=stream.id, name=name, reads=reads,
                                       writes=writes), stream)
            if error is not None:  # recorded (the checker collects the same error); never executed
                raise error
            self.backend.launch(stream, kernel, args, name, site)
            self.backend.tick()

    # --- the torch emulation's own calls ----------------------------------------------------
    # streamcheck/emulation builds these calls' arguments itself (streams and freed buffers of this
    # device, Regions of its blocks): they record exactly what alloc(reuse=), free() and launch()
    # record, checking only what those arguments can get wrong, with the public call's error.

    def _alloc_reused(self, reuse: Buffer, name: str, stream: Stream) -> Buffer:
        """alloc(reuse=reuse, stream=stream, name=name) of a freed buffer of this device, in its own
        shape, dtype and device (the caching allocator's reuse)."""
        site = caller_site()
        if type(stream) is not Stream or stream.device is not self:
            self._stream_or_default(stream, "alloc(reuse=)", site)  # raises what alloc() raises
        return self._new_buffer(reuse.shape, reuse.dtype, name, reuse.device_index, site, reuse=reuse, stream=stream)

    def _free_block(self, buffer: Buffer, stream: Stream) -> None:
        """free(buffer, stream) of a buffer of this device, on one of its streams."""
        site = caller_site()
        if buffer.freed or buffer.device is not self or type(stream) is not Stream or stream.device is not self or \
                self.capture_tracker.active:
            self._check_free(buffer, stream, site)  # raises what free() raises
        self._release(buffer, stream, site)

    def _launch_regions(self, kernel, stream: Stream, reads: list, writes: list, name: str) -> None:
        """launch(kernel, stream=stream, reads=reads, writes=writes, name=name) with no args: a callable
        kernel, a stream of this device, a name, lists of Regions."""
        site = caller_site()
        if type(stream) is not Stream or stream.device is not self:
            self._stream_or_default(stream, f"launch `{name}`", site)  # raises what launch() raises
        for region in reads:
            if region.buffer.device is not self or region.buffer.freed:
                self._regions(reads, "launch `{}` reads=", site, name)  # raises what launch() raises
        for region in writes:
            if region.buffer.device is not self or region.buffer.freed:
                self._regions(reads, "launch `{}` reads=", site, name)
                self._regions(writes, "launch `{}` writes=", site, name)
        self._issue_launch(kernel, (), stream, reads, writes, name, site)

    def sleep(self, steps: int, stream: Optional[Stream] = None, name: str = "sleep") -> None:
        """A kernel that only spins: `stream` is held for `steps` host calls (the sim's time),
        as `torch.cuda._sleep` holds a GPU stream. A host synchronize that waits for it ends the
        hold (no host call passes while the host is blocked). Touches no memory."""
        site = caller_site()
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise DeviceError(f"sleep at {site}: steps must be an integer >= 0, got {steps!r}")
        stream = self._stream_or_default(stream, "sleep", site)
        sleep = getattr(self.backend, "sleep", None)
        if sleep is None:
            raise DeviceError(f"sleep at {site}: the {self.backend.name} backend cannot hold a stream; use the sim")
        with self._lock:
            self._record_work(T.Launch(self._thread_id(), site, stream=stream.id, name=name, reads=(), writes=()),
                              stream)
            sleep(stream, int(steps), name)
            self.backend.tick()

    def _peer_check(self, name: str, site: CallSite, stream: Stream, reads, writes) -> Optional[PeerAccessError]:
        """The PeerAccessError a kernel on `stream` touching `reads`/`writes` would fault with."""
        touched = [(r.buffer.name, r.buffer.site, r.buffer.device_index) for r in list(reads) + list(writes)]
        label = T.stream_label(stream.kind, "" if stream.kind is StreamKind.LEGACY else stream.name, stream.id, 0)
        return peer_access_error(name, site, label, stream.device_index, touched, self._peers)

    def enable_peer_access(self, device: int, peer: int) -> None:
        """cudaDeviceEnablePeerAccess: kernels on cuda:`device` may access memory of cuda:`peer`
        from now on (one direction; call it again swapped for the other). Copies between devices
        need no peer access (CUDA stages them through the host). Enabling it twice is harmless."""
        site = caller_site()
        device = self._device_index(device, "enable_peer_access", site)
        peer = self._device_index(peer, "enable_peer_access", site)
        if device == peer:
            raise DeviceError(f"enable_peer_access({device}, {peer}) at {site}: a device always accesses its own "
                              "memory; name two different devices")
        with self._lock:
            if (device, peer) not in self._peers:
                self._peers.add((device, peer))
                self._record(T.PeerAccess(self._thread_id(), site, device=device, peer=peer))

    def copy(self, dst, src, stream: Optional[Stream] = None) -> None:
        """Async device-to-device copy of bytes on `stream` (cudaMemcpyAsync); between two devices
        it is a peer copy (see copy_peer)."""
        self._copy(dst, src, stream, caller_site(), "copy")

    def copy_peer(self, dst, src, stream: Optional[Stream] = None) -> None:
        """Async copy between two devices on `stream` (cudaMemcpyPeerAsync; CuPy's copy across
        devices, torch's .to("cuda:1")): an access on `stream` to both ranges, ordered like a
        kernel on it. `stream` defaults to src's device's legacy stream. It needs no peer access:
        without it CUDA stages the copy through host memory."""
        site = caller_site()
        dst = self._region(dst, "copy_peer dst", site)
        src = self._region(src, "copy_peer src", site)
        if dst.buffer.device_index == src.buffer.device_index:
            raise DeviceError(f"copy_peer at {site}: {src} and {dst} are both on cuda:{src.buffer.device_index}; "
                              "a copy within one device is device.copy")
        self._copy(dst, src, stream if stream is not None else self.legacies[src.buffer.device_index], site,
                   "copy_peer")

    def _copy(self, dst, src, stream: Optional[Stream], site: CallSite, what: str) -> None:
        stream = self._stream_or_default(stream, what, site)
        dst = self._region(dst, f"{what} dst", site)
        src = self._region(src, f"{what} src", site)
        kind = T.CopyKind.D2D if dst.buffer.device_index == src.buffer.device_index else T.CopyKind.PEER
        d, s = dst.byte_range(), src.byte_range()
        if d.stop - d.start != s.stop - s.start:
            raise DeviceError(f"{what} at {site}: {src} ({s.stop - s.start} bytes) and {dst} "
                              f"({d.stop - d.start} bytes) differ in size")
        if d.overlaps(s):
            raise DeviceError(f"{what} at {site}: {src} and {dst} overlap; cudaMemcpy on overlapping memory is "
                              "undefined, copy through a temporary buffer")
        with self._lock:
            self._record_work(T.Copy(self._thread_id(), site, stream=stream.id, kind=kind, src=s, dst=d), stream)
            self.backend.copy(stream, dst, src, site)
            self.backend.tick()

    def upload(self, dst, host_array, stream: Optional[Stream] = None) -> None:
        """Async host-to-device copy on `stream` (the host array must stay alive and unchanged:
        it is read when the copy executes). The array has the region's shape, or is flat with
        its size. Another dtype is converted now, and only if every value converts exactly;
        into a capturing stream it must already be a numpy array of the buffer's dtype."""
        site = caller_site()
        stream = self._stream_or_default(stream, "upload", site)
        dst = self._region(dst, "upload dst", site)
        what = f"upload to {dst} at {site}"
        given = host_array
        try:
            host_array = np.asarray(host_array)
        except (TypeError, ValueError) as exc:
            raise DeviceError(f"{what}: the host data is not an array ({exc}); pass a numpy array of "
                              f"{dst.buffer.dtype}") from None
        if host_array.size != dst.size:
            raise DeviceError(f"{what}: {host_array.size} host elements for {dst.size} device elements; the sizes "
                              "must match")
        # A flat array is a byte copy as cudaMemcpy sees it; any other shape must be the region's,
        # or a transposed or mis-sliced array would be spread over the rows without a word.
        if host_array.shape != dst.shape and host_array.ndim != 1:
            raise DeviceError(f"{what}: the host array has shape {host_array.shape} and {dst} has shape {dst.shape}; "
                              f"pass an array of shape {dst.shape} (or a flat one of {dst.size} elements)")
        if self.capture_tracker.active and self.capture_tracker.capturing(stream.id) is not None and (
                not isinstance(given, np.ndarray) or host_array.dtype != dst.buffer.dtype):
            # A converted copy would be what the graph reads at every launch, not the caller's array.
            got = host_array.dtype if isinstance(given, np.ndarray) else _type_name(given)
            raise DeviceError(f"{what}: {stream.name} is capturing, and a captured copy reads the host array at "
                              f"every launch of the graph; pass a numpy array of {dst.buffer.dtype} (not {got}) "
                              "so that it reads yours")
        host_array = _exactly(host_array, dst.buffer.dtype, what, f"`{dst.buffer.name}` holds", "the host array")
        with self._lock:
            # Captured, the graph reads the host array at every launch (keep it alive and current).
            self._record_work(T.Copy(self._thread_id(), site, stream=stream.id, kind=T.CopyKind.H2D, src=None,
                                     dst=dst.byte_range()), stream)
            self.backend.upload(stream, dst, host_array, site)
            self.backend.tick()

    def download(self, src, stream: Optional[Stream] = None) -> np.ndarray:
        """Async device-to-host copy on `stream` into pinned host memory (cudaMemcpyAsync there): the
        returned array holds the data only once the host has synchronized with `stream`. Its bytes
        are host memory the copy writes, named `download of <buffer>`: `host_uses(array)` is the
        host reading them (run_schedules does it with the program's result)."""
        site = caller_site()
        stream = self._stream_or_default(stream, "download", site)
        src = self._region(src, "download src", site)
        self._refuse_if_capturing(stream, f"download of {src}", site, "a copy into host memory cannot be captured "
                                  "(CUDA: cudaErrorStreamCaptureUnsupported); download after launching the graph "
                                  "(graph.launch(stream), then download on that stream and synchronize it)")
        source = src.byte_range()
        with self._lock:
            host = self._next["buffer"]  # the host array: in the trace only, no device memory
            self._next["buffer"] += 1
            nbytes = source.stop - source.start
            self._record(T.Alloc(self._thread_id(), site, buffer=host, nbytes=nbytes,
                                 name=f"download of {src.buffer.name}", device=src.buffer.device_index))
            # Never captured (refused above), but the legacy stream's implicit join may be refused.
            self._record_work(T.Copy(self._thread_id(), site, stream=stream.id, kind=T.CopyKind.D2H,
                                     src=source, dst=T.Range(host, 0, nbytes)), stream)
            out = self.backend.download(stream, src, site)
            # Weakly: pinned arrays stay the program's to free; a dead one's id may come back, hence the check.
            self._downloaded[id(out)] = (weakref.ref(out), T.Range(host, 0, nbytes))
            self.backend.tick()
            return out

    def host_uses(self, value, name: str = "host use", site: Optional[CallSite] = None) -> None:
        """The host reads `value` now, with no synchronization: each array in it (through lists,
        tuples and dicts) that `download` returned is a host read of the bytes its copy writes, a
        race where the host has not synchronized with the copy's stream. Other values are ignored.
        `site`: where the host uses it, when not the caller's line (a runner's: the user's call)."""
        site = site if site is not None else caller_site()
        reads = []
        pending = [value]
        while pending:
            item = pending.pop()
            if isinstance(item, dict):
                pending.extend(item.values())
            elif isinstance(item, (list, tuple)):
                pending.extend(item)
            elif isinstance(item, np.ndarray):
                known = self._downloaded.get(id(item))
                if known is not None and known[0]() is item:
                    reads.append(known[1])
        if reads:
            with self._lock:
                self._record(T.HostAccess(self._thread_id(), site, reads=tuple(reads), name=name))

    def host_read(self, region) -> np.ndarray:
        """Read device memory from the host *now*, with no synchronization."""
        return self._host_read(region, caller_site())

    def _host_read(self, region, site: CallSite) -> np.ndarray:
        region = self._region(region, "host_read", site)
        with self._lock:
            self._record(T.HostAccess(self._thread_id(), site, reads=(region.byte_range(),), name="host read"))
            value = self.backend.host_read(region)
            self.backend.tick()
            return value

    def host_write(self, region, value) -> None:
        """Write device memory from the host *now*, with no synchronization. `value` broadcasts
        to the region and must convert exactly to its dtype (as upload's data)."""
        site = caller_site()
        region = self._region(region, "host_write", site)
        what = f"host_write to {region} at {site}"
        try:
            value = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise DeviceError(f"{what}: the value is not an array ({exc}); pass a number or a numpy array of "
                              f"{region.buffer.dtype}") from None
        try:
            np.broadcast_to(value, region.shape)
        except ValueError:
            raise DeviceError(f"{what}: a value of shape {value.shape} does not fit {region.shape}") from None
        value = _exactly(value, region.buffer.dtype, what, f"`{region.buffer.name}` holds", "the value")
        with self._lock:
            self._record(T.HostAccess(self._thread_id(), site, writes=(region.byte_range(),), name="host write"))
            self.backend.host_write(region, value)
            self.backend.tick()

    def host_access(self, reads: Iterable = (), writes: Iterable = (), name: str = "host access",
                    sync: Optional[Stream] = None) -> None:
        """Record an access the host makes itself, now: the caller then reads `reads` and writes
        `writes` through the buffers' storage (an emulated library's host code, e.g. a CPU operator
        on pinned memory). `sync`: the host first waits for that stream, as a library's blocking
        read does (`.item()`, a blocking copy to pageable memory: the synchronize is recorded with
        `name` as its cause); without it, no synchronization."""
        site = caller_site()
        reads = self._regions(reads, "host_access reads=", site) if reads else []
        writes = self._regions(writes, "host_access writes=", site) if writes else []
        if sync is not None:  # a capturing stream: CUDA's refusal, from the capture model
            self._sync_stream(self._stream_or_default(sync, name, site), site, cause=name)
        if not reads and not writes:
            return
        with self._lock:
            self._record(T.HostAccess(self._thread_id(), site, reads=tuple(r.byte_range() for r in reads),
                                      writes=tuple(w.byte_range() for w in writes), name=name))
            self.backend.host_access(name)
            self.backend.tick()

    def get(self, region, stream: Optional[Stream] = None) -> np.ndarray:
        """Like CuPy's ndarray.get(): synchronize `stream` (the legacy stream if None) only, then read."""
        site = caller_site()
        region = self._region(region, "get", site)
        stream = self._stream_or_default(stream, "get", site)
        self._refuse_if_capturing(stream, f"get of {region}", site, "synchronizing it is refused (CUDA: "
                                  "cudaErrorStreamCaptureUnsupported); read it after launching the graph "
                                  "(graph.launch(stream), then get on that stream)")
        self._sync_stream(stream, site, cause="get")
        return self._host_read(region, site)

    def synchronize(self, device: Optional[int] = None) -> None:
        """Block the host until all work issued so far on cuda:`device`'s streams has executed
        (cudaDeviceSynchronize; it waits for that device only). None: every device, one after
        the other (with one device, the same)."""
        site = caller_site()
        indexes = range(self.devices) if device is None else [self._device_index(device, "synchronize", site)]
        with self._lock:
            for index in indexes:
                op = T.DeviceSync(self._thread_id(), site, device=index)
                if self._edits is not None and self._edited(op):
                    continue
                self._record(op)
                self.capture_tracker.sync_device(op)
                if self.devices == 1:
                    self.backend.sync_device(site)
                else:  # only a backend with max_devices > 1 gets here, and takes device=
                    self.backend.sync_device(site, device=index)
            self.backend.tick()

    # --- collectives (torch.distributed / NCCL) -------------------------------------------
    def all_reduce(self, buffers, streams, *, wait_for=None) -> Work:
        """One NCCL all-reduce over the ranks (rank k: cuda:k's `buffers[k]`, its comm stream
        `streams[k]`): in place, every buffer ends as the sum of all (on the sim, really summed).
        Each rank's part is an access on its comm stream: a read and a write of its buffer.
        `wait_for` (one stream per rank): the comm streams first wait for what was issued there so
        far, as ProcessGroupNCCL makes its stream wait on the current stream. Returns the Work."""
        return self._collective("all_reduce", buffers, buffers, streams, wait_for, caller_site())

    def reduce_scatter(self, outputs, inputs, streams, *, wait_for=None) -> Work:
        """One NCCL reduce-scatter: `outputs[k]` = the sum over ranks of chunk k of `inputs[j]`
        (an input has as many rows as the ranks' outputs together). See all_reduce."""
        return self._collective("reduce_scatter", outputs, inputs, streams, wait_for, caller_site())

    def all_to_all(self, outputs, inputs, streams, *, wait_for=None) -> Work:
        """One NCCL all-to-all: chunk j of `outputs[k]` = chunk k of `inputs[j]` (rows split in as
        many chunks as ranks). See all_reduce."""
        return self._collective("all_to_all", outputs, inputs, streams, wait_for, caller_site())

    def _rank_streams(self, streams, what: str, site: CallSite, ranks: Optional[int] = None) -> list:
        if not isinstance(streams, (list, tuple)) or not all(isinstance(s, Stream) for s in streams):
            raise DeviceError(f"{what} at {site}: expected a list of Streams, one per rank, got {streams!r}")
        if ranks is not None and len(streams) != ranks:
            raise DeviceError(f"{what} at {site}: {len(streams)} streams for {ranks} ranks; give one per rank, "
                              "in rank order")
        for stream in streams:
            self._stream_or_default(stream, what, site)
        return list(streams)

    def _collective(self, name: str, outputs, inputs, streams, wait_for, site: CallSite) -> Work:
        what = name
        from .backends.protocol import Backend

        if type(self.backend).collective is Backend.collective:
            raise DeviceError(f"{what} at {site}: the {self.backend.name} backend does not model collectives; "
                              "use Device('sim', devices=N)")
        streams = self._rank_streams(streams, what, site)
        ranks = len(streams)
        outputs = self._regions(outputs, f"{what} outputs", site)
        inputs = self._regions(inputs, f"{what} inputs", site)
        if len(outputs) != ranks or len(inputs) != ranks:
            raise DeviceError(f"{what} at {site}: {ranks} streams, {len(inputs)} inputs and {len(outputs)} outputs; "
                              "give one of each per rank, in rank order")
        indexes = [s.device_index for s in streams]
        if len(set(indexes)) != ranks:
            raise DeviceError(f"{what} at {site}: the comm streams are on devices {indexes}; NCCL has one rank "
                              "per device, so give one stream of each device")
        for k, (stream, out, inp) in enumerate(zip(streams, outputs, inputs)):
            for region, role in ((inp, "input"), (out, "output")):
                if region.buffer.device_index != stream.device_index:
                    raise DeviceError(f"{what} at {site}: rank {k}'s {role} {region} is on "
                                      f"cuda:{region.buffer.device_index}, its comm stream {stream.name} on "
                                      f"cuda:{stream.device_index}; each rank's buffers live on its own device")
            self._refuse_if_capturing(stream, what, site, "streamcheck does not model a collective captured into a "
                                      "graph; issue it outside the capture")
        first_in, first_out = inputs[0], outputs[0]
        for region, role, like in [(r, "input", first_in) for r in inputs] + [(r, "output", first_out) for r in outputs]:
            if region.shape != like.shape or region.buffer.dtype != like.buffer.dtype:
                raise DeviceError(f"{what} at {site}: every rank's {role} must have the same shape and dtype; "
                                  f"{like} is {like.shape} {like.buffer.dtype}, {region} is {region.shape} "
                                  f"{region.buffer.dtype}")
        if first_in.buffer.dtype != first_out.buffer.dtype:
            raise DeviceError(f"{what} at {site}: inputs are {first_in.buffer.dtype}, outputs "
                              f"{first_out.buffer.dtype}; NCCL reduces within one dtype")
        rows_in = first_in.rows
        if name == "all_reduce":
            wanted = first_in.shape
        elif name == "reduce_scatter":
            wanted = (rows_in // ranks,) + first_in.shape[1:] if first_in.shape and rows_in % ranks == 0 else None
        else:
            wanted = first_in.shape if first_in.shape and rows_in % ranks == 0 else None
        if wanted is None or first_out.shape != wanted:
            need = (f"rows divisible by the {ranks} ranks" if wanted is None else f"outputs of shape {wanted}")
            raise DeviceError(f"{what} at {site}: inputs of shape {first_in.shape} and outputs of shape "
                              f"{first_out.shape} do not fit: {name} over {ranks} ranks needs {need}")
        if wait_for is not None:
            wait_for = self._rank_streams(wait_for, f"{what} wait_for", site, ranks)
            for current, comm in zip(wait_for, streams):
                if current is not comm:  # the comm stream waits for the current stream's work so far
                    ready = self._new_event(f"{name} inputs ready", site)
                    self._record_event(ready, current, site)
                    self._wait(comm, ready, site)
        with self._lock:
            tid = self._thread_id()
            for stream, out, inp in zip(streams, outputs, inputs):
                # One kernel per rank on its comm stream: reads its input, writes its output.
                self._record_work(T.Launch(tid, site, stream=stream.id, name=name, reads=(inp.byte_range(),),
                                           writes=(out.byte_range(),)), stream)
            self.backend.collective(name, tuple(streams), tuple(outputs), tuple(inputs))
            self.backend.tick()
        events = []
        for stream in streams:  # ProcessGroupNCCL records the work's event on its stream at once
            event = self._new_event(f"{name} done", site)
            self._record_event(event, stream, site)
            events.append(event)
        return Work(self, name, tuple(streams), tuple(events), site)

    def edit_syncs(self, edits) -> None:
        """Skip or replace synchronizations from now on, for the sync audit's proof reruns:
        `edits` (streamcheck.analyses.sync_audit.SyncEdits) names them as the audit does. A
        skipped call does nothing at all; a replaced host synchronize records events and issues
        the device-side waits instead, and the host goes on. Call it before the program runs;
        None stops editing."""
        with self._lock:
            if edits is not None:
                edits.start(self.trace)
            self._edits = edits

    def _edited(self, op) -> bool:
        """True when the sync `op` is skipped or replaced (the replacement issued here)."""
        edits = self._edits
        plan = edits.decide(op)
        if plan is None:
            return False
        self._edits = None  # the replacement itself is issued as it is
        try:
            self._issue_replacement(op, plan)
        finally:
            self._edits = edits
        return True

    def _issue_replacement(self, op, plan) -> None:
        for sid in plan.records:
            event = self._fresh.get(sid)
            if event is None:
                event = self._fresh[sid] = self._new_event(f"audit replacement {sid}", op.site)
            self._record_event(event, self._stream_objects[sid], op.site)
        for sid, source, eid in plan.waits:
            event = self._fresh[source] if eid is None else self._event_objects[eid]
            self._wait(self._stream_objects[sid], event, op.site)

    def note_implicit_sync(self, reason: str) -> None:
        """Record something that looks like a sync but is not one (see trace.ImplicitSync)."""
        site = caller_site()
        if not isinstance(reason, str):
            raise DeviceError(f"note_implicit_sync at {site}: reason must be a string, got {reason!r}")
        with self._lock:
            self._record(T.ImplicitSync(self._thread_id(), site, reason=reason))

    # --- threads ------------------------------------------------------------------------
    # A host thread's start and join are happens-before edges (as threading promises). Layers that
    # start threads of their own kind (DeviceThread; the emulation's threading.Thread) tell the
    # device: _thread_starting in the parent, _thread_running and _thread_ended in the child,
    # _thread_joined in the joiner once the child ended.
    def _thread_starting(self, site: CallSite) -> int:
        """The calling thread starts a host thread: its id (its ThreadStart follows the caller's work)."""
        with self._lock:
            parent = self._thread_id()
            child = self._next["thread"]
            self._next["thread"] += 1
            self._record(T.ThreadStart(child, site, parent=parent))
        return child

    def _thread_running(self, child: int) -> None:
        """In the new thread: it is `child` (what _thread_starting returned)."""
        with self._lock:
            self._threads[threading.get_ident()] = child
        _joined.device = weakref.ref(self)

    def _thread_ended(self) -> None:
        """In the thread, as it ends: its ident, which Python hands to a later thread, names it no more."""
        with self._lock:
            self._threads.pop(threading.get_ident(), None)

    def _thread_joined(self, child: int, site: CallSite) -> None:
        """The calling thread joined `child` (it ended): what the child did is ordered before what follows."""
        with self._lock:
            self._record(T.ThreadJoin(self._thread_id(), site, child=child))

    def thread(self, target, args: Sequence = ()) -> "DeviceThread":
        """A host thread whose start and join are ordered for the checker (as threading promises), and
        so are the hand-offs between the device's threads through threading.Event, queue.Queue, a
        Lock, RLock or Condition the program makes, and Barrier (docs/cuda-rules.md, section 2)."""
        if not callable(target):
            raise DeviceError(f"thread at {caller_site()}: target must be callable, got {_type_name(target)}")
        return DeviceThread(self, target, tuple(args))

    # --- called by Stream / Event -------------------------------------------------------
    def _record_event(self, event: Event, stream: Optional[Stream], site: CallSite) -> None:
        self._check_event(event, "record", site)
        stream = self._stream_or_default(stream, f"record `{event.name}`", site)
        with self._lock:
            op = T.EventRecord(self._thread_id(), site, event=event.id, stream=stream.id)
            self._record(op)
            # Inside a capture a record marks a point in the graph and executes nothing.
            event._recorded_outside = not self.capture_tracker.record(op)
            self.backend.record(event, stream)
            self.backend.tick()

    def _wait(self, stream: Stream, event: Event, site: CallSite) -> None:
        self._check_event(event, f"{stream.name}.wait_event", site)
        with self._lock:
            op = T.StreamWait(self._thread_id(), site, stream=stream.id, event=event.id)
            if self._edits is not None and self._edited(op):
                return
            self._record(op)
            # A fork into, or a join within, a capture; or a capture error (isolation, merge).
            self.capture_tracker.wait(op, event._recorded_outside)
            self.backend.wait(stream, event)
            self.backend.tick()

    def _sync_stream(self, stream: Stream, site: CallSite, cause: str = "") -> None:
        with self._lock:
            op = T.StreamSync(self._thread_id(), site, stream=stream.id, cause=cause)
            if self._edits is not None and self._edited(op):
                return
            self._record(op)
            self.capture_tracker.sync_stream(op, stream.id)
            self.backend.sync_stream(stream, site)
            self.backend.tick()

    def _sync_event(self, event: Event, site: CallSite) -> None:
        self._check_event(event, "synchronize", site)
        with self._lock:
            op = T.EventSync(self._thread_id(), site, event=event.id)
            if self._edits is not None and self._edited(op):
                return
            self._record(op)
            self.capture_tracker.sync_event(op, event.id, event.name)
            self.backend.sync_event(event, site)
            self.backend.tick()

    def _query_backend(self, what: str, site: CallSite, method: str):
        from .backends.protocol import Backend

        if getattr(type(self.backend), method) is getattr(Backend, method):
            raise DeviceError(f"{what} at {site}: the {self.backend.name} backend does not support queries; "
                              "use backend='sim' or 'cupy'")
        return getattr(self.backend, method)

    def _query_stream(self, stream: Stream, site: CallSite) -> bool:
        query = self._query_backend(f"{stream.name or 'stream'}.query()", site, "query_stream")
        with self._lock:
            self._refuse_if_capturing(stream, f"query of {stream!r}", site, "querying a capturing stream is "
                                      "refused (CUDA: cudaErrorStreamCaptureUnsupported); query after launching "
                                      "the graph")
            done = query(stream)
            self._record(T.StreamQuery(self._thread_id(), site, stream=stream.id, done=done))
            self.backend.tick()
            return done

    def _query_event(self, event: Event, site: CallSite) -> bool:
        self._check_event(event, "query", site)
        query = self._query_backend(f"{event.name or 'event'}.query()", site, "query_event")
        with self._lock:
            self.capture_tracker.sync_event(T.EventQuery(self._thread_id(), site, event=event.id), event.id,
                                            event.name)
            done = query(event)
            self._record(T.EventQuery(self._thread_id(), site, event=event.id, done=done))
            self.backend.tick()
            return done

    def _destroy_event(self, event: Event, site: CallSite) -> None:
        self._check_event(event, "destroy", site)
        with self._lock:
            self._record(T.EventDestroy(self._thread_id(), site, event=event.id))
            event.destroyed = True

    # --- stream capture -------------------------------------------------------------------
    def _capture_backend(self, what: str, site: CallSite, method: str):
        if not self.backend.supports_capture:
            raise DeviceError(f"{what} at {site}: the {self.backend.name} backend does not support stream "
                              "capture; use backend='sim' or 'cupy'")
        return getattr(self.backend, method)

    def _refuse_if_capturing(self, stream: Stream, what: str, site: CallSite, do: str) -> None:
        graph = self.capture_tracker.capturing(stream.id)
        if graph is not None:
            raise DeviceError(f"{what} at {site}: {stream.name} is capturing graph {graph}, so nothing issued to "
                              f"it runs until the graph is launched; {do}")

    def _record_work(self, op, stream: Stream) -> None:
        """Record a kernel or copy; while some stream captures, it becomes a graph node if
        `stream` captures. Raises CaptureError (the op is already in the trace) for what CUDA
        refuses. The hot path pays one attribute test while nothing captures."""
        self._record(op)
        if self.capture_tracker.active:
            self.capture_tracker.node(op, stream.id)

    def _begin_capture(self, stream: Stream, mode, site: CallSite) -> None:
        what = f"{stream.name}.begin_capture(mode={mode!r})"
        try:
            mode = T.CaptureMode.parse(mode)
        except ValueError as exc:
            raise DeviceError(f"{what} at {site}: {exc}") from None
        begin = self._capture_backend(what, site, "begin_capture")
        with self._lock:
            graph = self._next["graph"]
            self._next["graph"] += 1
            op = T.CaptureBegin(self._thread_id(), site, stream=stream.id, graph=graph, mode=mode)
            self._record(op)
            self.capture_tracker.begin(op)
            begin(stream, graph, mode)

    def _end_capture(self, stream: Stream, site: CallSite) -> Graph:
        end = self._capture_backend(f"{stream.name}.end_capture()", site, "end_capture")
        tracker = self.capture_tracker
        with self._lock:
            graph = tracker.capturing(stream.id)
            op = T.CaptureEnd(self._thread_id(), site, stream=stream.id, graph=graph if graph is not None else 0)
            self._record(op)
            try:
                captured = tracker.end(op)
            except CaptureError:
                if graph is not None and not tracker.is_active(graph):
                    # Refused, yet over (unjoined, invalidated): the backend may still hold it open.
                    self.backend.abort_capture(stream)
                raise
            # What the nodes touch: a launch after any of it was freed is refused.
            touched = sorted({rng.buffer for node in captured.nodes for rng in node.op.reads + node.op.writes})
            buffers = tuple(buf for buf in map(self._buffers.get, touched) if buf is not None)
            return Graph(self, captured, end(stream, captured), buffers)

    def launch_graph(self, graph: Graph, stream: Optional[Stream] = None) -> None:
        """cudaGraphLaunch of `graph` (from Stream.end_capture()) on `stream`; same as graph.launch(stream)."""
        self._launch_graph(graph, stream, caller_site())

    def _launch_graph(self, graph: Graph, stream: Optional[Stream], site: CallSite) -> None:
        if not isinstance(graph, Graph):
            raise DeviceError(f"graph launch at {site}: expected a Graph (from Stream.end_capture()), "
                              f"got {_type_name(graph)}")
        what = f"launch of graph {graph.id}"
        if graph.device is not self:
            raise DeviceError(f"{what} at {site}: the graph was captured on another Device; launch it there, "
                              "or capture it again on this one")
        if stream is not None and (not isinstance(stream, Stream) or stream.device is not self):
            raise DeviceError(f"{what} at {site}: {stream!r} is not a stream of the graph's device; launch a "
                              "graph on a stream of the Device that captured it")
        stream = self._stream_or_default(stream, what, site)
        self._refuse_if_capturing(stream, what, site, "streamcheck does not model a graph launched into another "
                                  "capture (a child graph node); launch it after end_capture")
        for buf in graph.buffers:
            if buf.freed:
                raise DeviceError(f"{what} at {site}: buffer `{buf.name}` (allocated at {buf.site}), which a node "
                                  "of the graph uses, was freed; capture the graph again over live buffers")
        launch = self._capture_backend(what, site, "launch_graph")
        with self._lock:
            op = T.GraphLaunch(self._thread_id(), site, stream=stream.id, graph=graph.id)
            self._record(op)
            if self.capture_tracker.active:
                # Never a node (the stream is not capturing), but the legacy stream's implicit join with
                # a capturing blocking stream is refused (cudaErrorStreamCaptureImplicit).
                self.capture_tracker.check_legacy(op, stream.id)
            launch(graph.handle, stream, site)
            graph.launches += 1
            self.backend.tick()

    def _check_event(self, event, what: str, site: CallSite) -> None:
        if not isinstance(event, Event) or event.device is not self:
            raise DeviceError(f"{what} at {site}: {event!r} is not an event of this device")
        if event.destroyed:
            raise DeviceError(f"{what} at {site}: event `{event.name}` was destroyed; create a new one")


class _HandOffs(Listener):
    """The device's ear for host threads' hand-offs (host_handoffs.Listener): the threads it knows
    are its creator, its Device.thread threads and the threads that used it, each as long as this
    is the device it joined last (`_joined`): a device whose program ended, not yet collected,
    must not hear the next program's device, made in the same thread."""

    def __init__(self, device: Device):
        super().__init__()
        self._device = weakref.ref(device)

    def knows_caller(self) -> bool:
        dev = self._device()
        joined = getattr(_joined, "device", None)
        return dev is not None and joined is not None and joined() is dev

    def record(self, kind, channel: int, what: str) -> None:
        dev = self._device()
        if dev is not None:
            with dev._lock:
                dev._record(kind(dev._thread_id(), caller_site(), channel=channel, what=what))


class DeviceThread(threading.Thread):
    """A program's host thread (Device.thread). One whose target raises keeps the exception in
    `exception` and is listed by `DeviceThread.raised(device)`: threading only prints it (pytest
    turns that into a warning), and run_schedules fails the schedule with it."""

    _raised: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Device -> its threads that raised

    def __init__(self, device: Device, target, args):
        super().__init__(target=target, args=args, daemon=True)
        self._device = device
        self._tid: Optional[int] = None
        self._site: CallSite = T.UNKNOWN_SITE
        self._what = getattr(target, "__name__", "") or self.name  # threading drops its target after run
        self.exception: Optional[BaseException] = None

    @staticmethod
    def raised(device: Device) -> list:
        """`device`'s threads whose target raised, in the order they raised."""
        with device._lock:
            return list(DeviceThread._raised.get(device, ()))

    def describe(self) -> str:
        """`host thread 1 (`worker`, started at prog.py:12)`: as race reports name host threads."""
        return f"host thread {self._tid} (`{self._what}`, started at {self._site})"

    def format_exception(self) -> str:
        """The traceback of `exception` from the target's frame on (threading's and ours left out)."""
        exc = self.exception
        if exc is None:
            return ""
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (threading.__file__, __file__):
            tb = tb.tb_next
        return "".join(traceback.format_exception(type(exc), exc, tb))

    def start(self) -> None:
        dev = self._device
        site = self._site = caller_site()
        self._tid = dev._thread_starting(site)
        super().start()

    def run(self) -> None:
        dev = self._device
        dev._thread_running(self._tid)
        try:
            super().run()
        except BaseException as exc:
            self.exception = exc
            with dev._lock:
                DeviceThread._raised.setdefault(dev, []).append(self)
            raise  # threading's excepthook still reports it, as for any thread
        finally:
            dev._thread_ended()

    def join(self, timeout=None) -> None:
        site = caller_site()
        super().join(timeout)
        if self.is_alive():
            return  # timed out: the child's work is not ordered before anything yet
        self._device._thread_joined(self._tid, site)
