"""Happens-before race checker over a trace of stream operations.

Vector clocks, one component per stream and per host thread (as in PyTorch's CUDA
sanitizer and FastTrack). An access races with an earlier one to overlapping bytes
when at least one writes and the earlier one is not in the later one's clock.

The checker runs in issue order and needs no timing: a race is reported whether
or not it struck. CUDA's rules it models (DESIGN.md):
- work on one stream runs in issue order;
- issuing work orders it after everything the issuing host thread knew;
- record captures the stream's work so far (re-recording replaces it); a wait
  joins the event's state *at the wait call*; a wait on a never-recorded event is
  a no-op;
- the legacy default stream waits for earlier work on blocking streams (and
  per-thread default streams) and later work on those waits for it; non-blocking
  streams never synchronize with it;
- stream/event/device synchronize order the host after the awaited work;
- nothing else is synchronization (first cuBLAS call, lazy loading, pool growth).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Optional

from .trace import (
    Alloc,
    CallSite,
    Copy,
    DeviceSync,
    EventCreate,
    EventDestroy,
    EventRecord,
    EventSync,
    Free,
    HostAccess,
    ImplicitSync,
    Launch,
    Op,
    Range,
    StreamCreate,
    StreamKind,
    StreamSync,
    StreamWait,
    ThreadJoin,
    ThreadStart,
    Trace,
)


class TraceError(ValueError):
    """A trace that no CUDA program could produce: unknown ids, out-of-range access, use after free."""


@dataclass(frozen=True)
class Access:
    """One side of a race, as the user wrote it."""

    actor: str  # "stream A" or "host thread 0"
    name: str  # kernel / copy / host access name
    site: CallSite
    write: bool

    def describe(self) -> str:
        verb = "writes" if self.write else "reads"
        return f"{self.actor}: `{self.name}` {verb} at {self.site}"


@dataclass(frozen=True)
class Race:
    kind: str  # RAW, WAR, WAW, or FREE (memory freed while another stream may use it)
    buffer: str
    buffer_site: CallSite
    start: int
    stop: int
    first: Access
    second: Access
    missing_edge: str
    hint: str
    count: int = 1

    @property
    def key(self) -> tuple:
        return (self.kind, self.first.site, self.second.site)

    def format(self) -> str:
        times = f" (seen {self.count}x)" if self.count > 1 else ""
        return (
            f"{self.kind} race on `{self.buffer}` bytes [{self.start}, {self.stop}) "
            f"(allocated at {self.buffer_site}){times}\n"
            f"  first:  {self.first.describe()}\n"
            f"  second: {self.second.describe()}\n"
            f"  missing edge: {self.missing_edge}\n"
            f"  fix: {self.hint}"
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["buffer_site"] = str(self.buffer_site)
        d["first"]["site"] = str(self.first.site)
        d["second"]["site"] = str(self.second.site)
        return d


def reports_to_json(races) -> str:
    return json.dumps([r.to_dict() for r in races], indent=2)


class _Clock(dict):
    """Vector clock: owner -> last known tick. Missing owners are 0."""

    __slots__ = ()

    def join(self, other: dict) -> None:
        get = self.get
        for owner, tick in other.items():
            if get(owner, 0) < tick:
                self[owner] = tick


@dataclass
class _Record:
    start: int
    stop: int
    write: bool
    owner: int
    tick: int
    access: Access
    free: bool = False


class _Stream:
    __slots__ = ("id", "kind", "label", "clock", "owner", "host_seen", "legacy_seen", "captured", "noop_waits")

    def __init__(self, id: int, kind: StreamKind, label: str, owner: int):
        self.id = id
        self.kind = kind
        self.label = label
        self.owner = owner
        self.clock = _Clock()
        self.clock[owner] = 0
        self.host_seen = {}  # thread -> version of that thread's clock already joined
        self.legacy_seen = -1
        self.captured = {}  # source stream owner -> (event name, tick captured by a wait)
        self.noop_waits = []  # events waited on before they were ever recorded


class _Event:
    __slots__ = ("id", "name", "state", "stream", "destroyed")

    def __init__(self, id: int, name: str):
        self.id = id
        self.name = name or f"event{id}"
        self.state: Optional[dict] = None  # None: never recorded
        self.stream: Optional[_Stream] = None
        self.destroyed = False


class _Thread:
    __slots__ = ("id", "owner", "clock", "version")

    def __init__(self, id: int):
        self.id = id
        self.owner = -1 - id  # threads own negative components, streams non-negative
        self.clock = _Clock({self.owner: 1})
        self.version = 0  # bumped whenever the clock changes, so streams skip redundant joins


class _Buffer:
    __slots__ = ("id", "nbytes", "name", "site", "records", "freed_at")

    def __init__(self, id: int, nbytes: int, name: str, site: CallSite):
        self.id = id
        self.nbytes = nbytes
        self.name = name or f"buffer{id}"
        self.site = site
        self.records: list[_Record] = []
        self.freed_at: Optional[CallSite] = None


class Checker:
    """Feed operations in issue order; read `races` at any time."""

    def __init__(self) -> None:
        self._streams: dict[int, _Stream] = {}
        self._events: dict[int, _Event] = {}
        self._buffers: dict[int, _Buffer] = {}
        self._threads: dict[int, _Thread] = {0: _Thread(0)}
        self._legacy: Optional[_Stream] = None
        self._legacy_version = 0
        self._joiners: list[_Stream] = []  # streams that synchronize with the legacy stream
        self._races: dict[tuple, Race] = {}
        self._dispatch = {
            ThreadStart: self._thread_start,
            ThreadJoin: self._thread_join,
            StreamCreate: self._stream_create,
            EventCreate: self._event_create,
            EventDestroy: self._event_destroy,
            EventRecord: self._event_record,
            StreamWait: self._stream_wait,
            StreamSync: self._stream_sync,
            EventSync: self._event_sync,
            DeviceSync: self._device_sync,
            Alloc: self._alloc,
            Free: self._free,
            Launch: self._launch,
            Copy: self._launch,
            HostAccess: self._host_access,
            ImplicitSync: lambda op: None,  # deliberately not an edge: CUDA promises nothing
        }

    # --- public -------------------------------------------------------------------------
    @property
    def races(self) -> list[Race]:
        return list(self._races.values())

    def feed(self, op: Op) -> None:
        handler = self._dispatch.get(type(op))
        if handler is None:
            raise TraceError(f"unknown operation {type(op).__name__} at {op.site}")
        handler(op)

    def stream_label(self, stream: int) -> str:
        return self._streams[stream].label

    def buffer_name(self, buffer: int) -> str:
        return self._buffers[buffer].name

    # --- lookups with clear errors ------------------------------------------------------
    def _thread(self, op: Op) -> _Thread:
        try:
            return self._threads[op.thread]
        except KeyError:
            raise TraceError(f"{type(op).__name__} at {op.site}: unknown host thread {op.thread}; "
                             "record ThreadStart first") from None

    def _stream(self, op: Op, stream: int) -> _Stream:
        try:
            return self._streams[stream]
        except KeyError:
            raise TraceError(f"{type(op).__name__} at {op.site}: unknown stream {stream}; "
                             "create it (StreamCreate) before using it") from None

    def _event(self, op: Op, event: int) -> _Event:
        ev = self._events.get(event)
        if ev is None:
            raise TraceError(f"{type(op).__name__} at {op.site}: unknown event {event}; "
                             "create it (EventCreate) before using it")
        if ev.destroyed:
            raise TraceError(f"{type(op).__name__} at {op.site}: event `{ev.name}` was destroyed; "
                             "create a new event instead of reusing a destroyed one")
        return ev

    def _buffer(self, op: Op, rng: Range) -> _Buffer:
        buf = self._buffers.get(rng.buffer)
        if buf is None:
            raise TraceError(f"{type(op).__name__} at {op.site}: unknown buffer {rng.buffer}; "
                             "allocate it (Alloc) before using it")
        if buf.freed_at is not None:
            raise TraceError(f"{type(op).__name__} at {op.site}: buffer `{buf.name}` was freed at "
                             f"{buf.freed_at}; use after free")
        if not (0 <= rng.start <= rng.stop <= buf.nbytes):
            raise TraceError(f"{type(op).__name__} at {op.site}: bytes [{rng.start}, {rng.stop}) are "
                             f"outside `{buf.name}` ({buf.nbytes} bytes, allocated at {buf.site})")
        return buf

    # --- clocks -------------------------------------------------------------------------
    def _issue(self, op: Op, stream: _Stream) -> int:
        """Order the next operation on `stream` after what the host and CUDA's implicit
        legacy-stream rules require; return its tick."""
        thread = self._thread(op)
        clock = stream.clock
        if stream.host_seen.get(thread.id) != thread.version:
            clock.join(thread.clock)
            stream.host_seen[thread.id] = thread.version
        if stream.kind is StreamKind.LEGACY:
            # Legacy stream: waits for all earlier work on blocking streams.
            for other in self._joiners:
                clock.join(other.clock)
            self._legacy_version += 1
        elif stream.kind.joins_legacy and self._legacy is not None:
            if stream.legacy_seen != self._legacy_version:
                clock.join(self._legacy.clock)
                stream.legacy_seen = self._legacy_version
        tick = clock[stream.owner] + 1
        clock[stream.owner] = tick
        return tick

    def _host_tick(self, thread: _Thread) -> int:
        tick = thread.clock[thread.owner] + 1
        thread.clock[thread.owner] = tick
        thread.version += 1
        return tick

    def _host_join(self, thread: _Thread, other: dict) -> None:
        thread.clock.join(other)
        thread.version += 1

    # --- handlers -----------------------------------------------------------------------
    def _thread_start(self, op: ThreadStart) -> None:
        if op.thread in self._threads and op.thread != 0:
            raise TraceError(f"ThreadStart at {op.site}: host thread {op.thread} already started")
        child = self._threads.setdefault(op.thread, _Thread(op.thread))
        if op.parent is not None:
            parent = self._threads.get(op.parent)
            if parent is None:
                raise TraceError(f"ThreadStart at {op.site}: unknown parent thread {op.parent}")
            self._host_join(child, parent.clock)
            self._host_tick(parent)

    def _thread_join(self, op: ThreadJoin) -> None:
        thread = self._thread(op)
        child = self._threads.get(op.child)
        if child is None:
            raise TraceError(f"ThreadJoin at {op.site}: unknown host thread {op.child}")
        self._host_join(thread, child.clock)

    def _stream_create(self, op: StreamCreate) -> None:
        if op.stream in self._streams:
            raise TraceError(f"StreamCreate at {op.site}: stream {op.stream} already exists")
        kind = StreamKind.parse(op.kind)
        if kind is StreamKind.LEGACY:
            if self._legacy is not None:
                raise TraceError(f"StreamCreate at {op.site}: there is only one legacy default stream")
            label = op.name or "legacy default stream"
        elif kind is StreamKind.PER_THREAD:
            label = op.name or f"per-thread default stream of thread {op.thread}"
        else:
            label = f"stream {op.name}" if op.name else f"stream{op.stream}"
        stream = _Stream(op.stream, kind, label, owner=op.stream)
        self._streams[op.stream] = stream
        if kind is StreamKind.LEGACY:
            self._legacy = stream
        elif kind.joins_legacy:
            self._joiners.append(stream)

    def _event_create(self, op: EventCreate) -> None:
        if op.event in self._events:
            raise TraceError(f"EventCreate at {op.site}: event {op.event} already exists")
        self._events[op.event] = _Event(op.event, op.name)

    def _event_destroy(self, op: EventDestroy) -> None:
        self._event(op, op.event).destroyed = True

    def _event_record(self, op: EventRecord) -> None:
        event = self._event(op, op.event)
        stream = self._stream(op, op.stream)
        self._issue(op, stream)
        event.state = dict(stream.clock)  # replaces any earlier record
        event.stream = stream

    def _stream_wait(self, op: StreamWait) -> None:
        event = self._event(op, op.event)
        stream = self._stream(op, op.stream)
        self._issue(op, stream)
        if event.state is None:
            stream.noop_waits.append(event)  # CUDA: waiting on a never-recorded event does nothing
            return
        stream.clock.join(event.state)
        src = event.stream
        captured = event.state.get(src.owner, 0)
        if stream.captured.get(src.owner, (None, -1))[1] < captured:
            stream.captured[src.owner] = (event.name, captured)

    def _stream_sync(self, op: StreamSync) -> None:
        stream = self._stream(op, op.stream)
        self._host_join(self._thread(op), stream.clock)

    def _event_sync(self, op: EventSync) -> None:
        event = self._event(op, op.event)
        if event.state is not None:  # synchronizing a never-recorded event returns at once
            self._host_join(self._thread(op), event.state)

    def _device_sync(self, op: DeviceSync) -> None:
        thread = self._thread(op)
        for stream in self._streams.values():
            thread.clock.join(stream.clock)
        thread.version += 1

    def _alloc(self, op: Alloc) -> None:
        if op.buffer in self._buffers and self._buffers[op.buffer].freed_at is None:
            raise TraceError(f"Alloc at {op.site}: buffer {op.buffer} already allocated")
        if op.nbytes < 0:
            raise TraceError(f"Alloc at {op.site}: negative size {op.nbytes}")
        self._buffers[op.buffer] = _Buffer(op.buffer, op.nbytes, op.name, op.site)

    def _free(self, op: Free) -> None:
        buf = self._buffer(op, Range(op.buffer, 0, 0))
        whole = Range(op.buffer, 0, buf.nbytes)
        if op.stream is None:
            thread = self._thread(op)
            tick = self._host_tick(thread)
            access = Access(f"host thread {thread.id}", "free", op.site, True)
            self._access(buf, whole, True, thread.clock, thread.owner, tick, access, free=True)
        else:
            stream = self._stream(op, op.stream)
            tick = self._issue(op, stream)
            access = Access(stream.label, "free", op.site, True)
            self._access(buf, whole, True, stream.clock, stream.owner, tick, access, free=True)
        buf.freed_at = op.site
        buf.records = []

    def _launch(self, op) -> None:
        stream = self._stream(op, op.stream)
        reads = [(self._buffer(op, r), r) for r in op.reads]
        writes = [(self._buffer(op, r), r) for r in op.writes]
        tick = self._issue(op, stream)
        name = op.name
        for buf, rng in reads:
            self._access(buf, rng, False, stream.clock, stream.owner, tick,
                         Access(stream.label, name, op.site, False))
        for buf, rng in writes:
            self._access(buf, rng, True, stream.clock, stream.owner, tick,
                         Access(stream.label, name, op.site, True))

    def _host_access(self, op: HostAccess) -> None:
        thread = self._thread(op)
        reads = [(self._buffer(op, r), r) for r in op.reads]
        writes = [(self._buffer(op, r), r) for r in op.writes]
        tick = self._host_tick(thread)
        actor = f"host thread {thread.id}"
        for buf, rng in reads:
            self._access(buf, rng, False, thread.clock, thread.owner, tick, Access(actor, op.name, op.site, False))
        for buf, rng in writes:
            self._access(buf, rng, True, thread.clock, thread.owner, tick, Access(actor, op.name, op.site, True))

    # --- the race check -----------------------------------------------------------------
    def _access(self, buf: _Buffer, rng: Range, write: bool, clock: dict, owner: int, tick: int,
                access: Access, free: bool = False) -> None:
        start, stop = rng.start, rng.stop
        if start == stop:
            return
        get = clock.get
        keep = []
        for rec in buf.records:
            if rec.start < stop and start < rec.stop:
                ordered = get(rec.owner, 0) >= rec.tick
                if not ordered and (write or rec.write):
                    self._report(buf, rec, start, stop, write, owner, access, free)
                # Drop what this access subsumes: an ordered earlier access to bytes it
                # covers can only race with something that also races with this one.
                if ordered and rec.start >= start and rec.stop <= stop and (write or not rec.write):
                    continue
            keep.append(rec)
        keep.append(_Record(start, stop, write, owner, tick, access, free))
        buf.records = keep

    def _report(self, buf: _Buffer, first: _Record, start: int, stop: int, write: bool,
                owner: int, second: Access, free: bool) -> None:
        if free:
            kind = "FREE"
        elif first.write and write:
            kind = "WAW"
        elif first.write:
            kind = "RAW"
        else:
            kind = "WAR"
        key = (kind, first.access.site, second.site)
        known = self._races.get(key)
        if known is not None:
            self._races[key] = replace(known, count=known.count + 1)
            return
        edge, hint = self._explain(first, owner, second, kind)
        self._races[key] = Race(kind, buf.name, buf.site, max(start, first.start), min(stop, first.stop),
                                first.access, second, edge, hint)

    def _explain(self, first: _Record, owner: int, second: Access, kind: str) -> tuple[str, str]:
        """Say which edge is missing, in the words a CUDA programmer would use."""
        producer = f"`{first.access.name}` ({first.access.site})"
        if first.owner < 0:  # the earlier access was the host's
            other = -1 - first.owner
            return (
                f"{second.actor} is not ordered after host thread {other}'s {producer}: "
                f"the thread that issued `{second.name}` never synchronized with thread {other}",
                "join the threads (or hand over with threading.Event) before issuing the second access",
            )
        src = self._streams[first.owner]
        if owner < 0:  # the later access is the host's
            verb = "freed" if kind == "FREE" else ("wrote" if second.write else "read")
            return (
                f"the host {verb} the memory at {second.site} without synchronizing with {src.label} "
                f"after {producer}",
                f"call {src.label}.synchronize() (or synchronize an event recorded after "
                f"`{first.access.name}`) before `{second.name}`",
            )
        dst = self._streams[owner]
        hint = (f"record an event on {src.label} after `{first.access.name}` and make {dst.label} wait "
                f"on it (stream.wait_event) before `{second.name}` ({second.site})")
        for event in dst.noop_waits:
            if event.stream is src and event.state.get(src.owner, 0) >= first.tick:
                return (f"{dst.label} waited on event `{event.name}` before it was recorded on {src.label} "
                        f"after {producer}; a wait on a never-recorded event is a no-op",
                        f"issue the wait after the record: {hint}")
        captured = dst.captured.get(src.owner)
        if captured is not None:
            name, tick = captured
            return (f"{dst.label} waited on event `{name}`, but it was recorded on {src.label} before "
                    f"{producer} was issued; a wait only covers work recorded at that time",
                    f"record the event after `{first.access.name}`: {hint}")
        edge = f"{dst.label} never waited for an event recorded on {src.label} after {producer}"
        legacy = {StreamKind.LEGACY}
        if {src.kind, dst.kind} & legacy and StreamKind.NON_BLOCKING in {src.kind, dst.kind}:
            edge += " (a non-blocking stream never synchronizes with the legacy default stream)"
        return edge, hint


def check(trace: Trace) -> list[Race]:
    """Run the checker over a whole trace and return its race reports."""
    checker = Checker()
    for op in trace:
        checker.feed(op)
    return checker.races


def format_report(races) -> str:
    if not races:
        return "streamcheck: no races found"
    head = f"streamcheck: {len(races)} race{'s' if len(races) != 1 else ''} found"
    return "\n\n".join([head] + [r.format() for r in races])
