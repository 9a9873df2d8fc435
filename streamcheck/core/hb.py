"""Happens-before race checker over a trace of stream operations.

Vector clocks, one component per stream and per host thread (as in PyTorch's CUDA
sanitizer and FastTrack). An access races with an earlier one to overlapping bytes
when at least one writes and the earlier one is not in the later one's clock.

The checker runs in issue order and needs no timing: a race is reported whether
or not it struck. CUDA's rules it models (docs/cuda-rules.md):
- work on one stream runs in issue order;
- issuing work orders it after everything the issuing host thread knew;
- record captures the stream's work so far (re-recording replaces it); a wait
  joins the event's state *at the wait call*; a wait on a never-recorded event is
  a no-op;
- the legacy default stream waits for earlier work on blocking streams (and
  per-thread default streams) and later work on those waits for it; non-blocking
  streams never synchronize with it;
- several devices: every stream and allocation belongs to one; each device has its own
  legacy default stream, joined only by that device's blocking streams; a device
  synchronize waits for that device's streams only; events cross devices (a stream of
  device 1 may wait on an event recorded on device 0); a kernel touching another
  device's memory needs peer access (collected in `peer_errors`), a copy does not;
- stream/event/device synchronize order the host after the awaited work;
- nothing else is synchronization (first cuBLAS call, lazy loading, pool growth);
- stream capture (capture.py decides what a capture holds): captured work does not
  execute, so it is checked only against the rest of its graph, where a race strikes on
  every launch; a graph launch is one unit of work on its stream whose accesses are all
  of its nodes'. What CUDA refuses during capture is collected in `capture_errors`.

The per-access path is the hot loop (every kernel argument of every launch), so
accesses are kept as plain tuples and turned into `Access` records only when a
race is reported.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .capture import CaptureError, CaptureTracker, CapturedNode
from .trace import (
    Alloc,
    CallSite,
    CaptureBegin,
    CaptureEnd,
    Copy,
    DeviceSync,
    EventCreate,
    EventDestroy,
    EventRecord,
    EventQuery,
    EventSync,
    Free,
    GraphLaunch,
    HandOff,
    HostAccess,
    ImplicitSync,
    Launch,
    Op,
    PeerAccess,
    StreamCreate,
    StreamKind,
    StreamQuery,
    StreamSync,
    StreamWait,
    TakeOver,
    ThreadJoin,
    ThreadStart,
    Trace,
    device_label,
    site_path,
    stream_label,
)


class TraceError(ValueError):
    """A trace that no CUDA program could produce: unknown ids, out-of-range access, use after free."""


class PeerAccessError(RuntimeError):
    """A kernel on one device touched memory of another without peer access enabled: CUDA lets
    the program issue it and the kernel faults (cudaErrorIllegalAddress). Like a CaptureError, a
    program can do it, so it is not a TraceError; the checker collects it (`peer_errors`) and
    goes on, the device API raises it at the launch. `code` is CUDA's error name."""

    code = "cudaErrorIllegalAddress"


def peer_access_error(kernel: str, site: CallSite, stream: str, device: int, touched, peers) -> Optional[PeerAccessError]:
    """The error of a kernel `kernel` launched at `site` on `stream` of cuda:`device` that touches
    `touched` ((buffer name, allocation site, buffer's device) each), given the (device, peer)
    pairs with peer access enabled; None when every buffer is its own device's or a peer's.
    One rule for the checker and the device API."""
    for name, buffer_site, there in touched:
        if there != device and (device, there) not in peers:
            return PeerAccessError(
                f"{PeerAccessError.code}: kernel `{kernel}` at {site} on {stream} (cuda:{device}) accesses `{name}` "
                f"(allocated at {buffer_site} on cuda:{there}) without peer access from cuda:{device} to "
                f"cuda:{there}; enable it first (cudaDeviceEnablePeerAccess: device.enable_peer_access({device}, "
                f"{there})), or copy the data to cuda:{device}")
    return None


@dataclass(frozen=True)
class Access:
    """One side of a race, as the user wrote it."""

    actor: str  # "stream A" or "host thread 0"
    name: str  # kernel / copy / host access name
    site: CallSite
    write: bool
    replay: str = ""  # a CUDA graph node run by a launch: "replay 2 of CUDA graph 1 (launched at ...)"

    def describe(self) -> str:
        verb = "writes" if self.write else "reads"
        inner = self.site.innermost
        through = f" (through {site_path(inner)})" if inner is not None else ""
        replay = f", in {self.replay}" if self.replay else ""
        return f"{self.actor}: `{self.name}` {verb} at {site_path(self.site)}{through}{replay}"

    def to_dict(self, root: Optional[str] = None) -> dict:
        d = dict({"actor": self.actor, "name": self.name, "write": self.write}, **self.site.to_dict(root))
        if self.replay:
            d["replay"] = self.replay
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Access":
        return cls(d["actor"], d["name"], _site_from_dict(d), d["write"], d.get("replay", ""))


def _site_from_dict(d: dict) -> CallSite:
    """The CallSite a to_dict wrote (`site` as path:line, `function`, `innermost`, `stack`)."""
    def frame(f: dict) -> CallSite:
        path, _, line = f["site"].rpartition(":")
        return CallSite(path, int(line), f.get("function", ""))

    inner = d.get("innermost")
    site = frame(d)
    return CallSite(site.file, site.line, site.function, frame(inner) if inner else None,
                    tuple(frame(f) for f in d.get("stack", ())))


# Where the hand-offs between host threads that order them are listed, for the fix that names them.
HAND_OFFS_DOC = "docs/cuda-rules.md, section 2"
SHOWN_BUFFERS = 4  # a report names this many of the buffers it folds, then counts the rest


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
    hint: str  # the fix (the text's and the JSON's word)
    count: int = 1
    # What the report folds (every occurrence of this kind at these two sites), first seen first:
    # each distinct (first actor, second actor) pair, and each buffer's name. Empty: only this one.
    streams: tuple = ()
    buffers: tuple = ()

    @property
    def key(self) -> tuple:
        """What the checker folds by: the kind and the places (user and innermost frames) of both sites."""
        return (self.kind, self.first.site.place, self.second.site.place)

    @property
    def fix(self) -> str:
        return self.hint

    def format(self, width: Optional[int] = None, stack: bool = False, what: str = "race") -> str:
        """The report; with `width`, lines longer than that are wrapped (see wrap_lines); with
        `stack`, each access's frames follow it (pytest's -v). `what`: "race", or "hazard" (Hazard)."""
        times = f" (seen {self.count}x)" if self.count > 1 else ""
        lines = [f"{self.kind} {what} on `{self.buffer}` bytes [{self.start}, {self.stop}) "
                 f"(allocated at {site_path(self.buffer_site)}){times}"]
        for label, access in (("first: ", self.first), ("second:", self.second)):
            lines.append(f"  {label} {access.describe()}")
            if stack:
                lines.extend(f"            {site_path(frame)} in {frame.function}" for frame in access.site.stack)
        if len(self.streams) > 1:
            pairs = "; ".join(f"{a} -> {b}" for a, b in self.streams)
            lines.append(f"  folds {len(self.streams)} stream pairs: {pairs}")
        if len(self.buffers) > 1:
            names = ", ".join(f"`{name}`" for name in self.buffers[:SHOWN_BUFFERS])
            more = len(self.buffers) - SHOWN_BUFFERS
            rest = f" and {more} more ({len(self.buffers)} in all)" if more > 0 else ""
            lines.append(f"  folds {len(self.buffers)} buffers: {names}{rest}")
        lines += [f"  missing edge: {self.missing_edge}", f"  fix: {self.hint}"]
        return wrap_lines("\n".join(lines), width)

    def to_dict(self, root: Optional[str] = None) -> dict:
        """The report as JSON-ready data, keyed as the text words it (`missing_edge`, `fix`); call
        sites as `path:line` relative to `root` (see site_path), each access with its
        `innermost` frame and `stack`."""
        return {"kind": self.kind, "buffer": self.buffer, "buffer_site": site_path(self.buffer_site, root),
                "start": self.start, "stop": self.stop, "first": self.first.to_dict(root),
                "second": self.second.to_dict(root), "missing_edge": self.missing_edge, "fix": self.hint,
                "count": self.count, "streams": [list(pair) for pair in self.streams],
                "buffers": list(self.buffers)}

    @classmethod
    def from_dict(cls, d: dict) -> "Race":
        """The race a to_dict wrote (its sites' paths as written there)."""
        path, _, line = d["buffer_site"].rpartition(":")
        return cls(d["kind"], d["buffer"], CallSite(path, int(line)), d["start"], d["stop"],
                   Access.from_dict(d["first"]), Access.from_dict(d["second"]), d["missing_edge"], d["fix"],
                   d["count"], tuple(tuple(pair) for pair in d.get("streams", ())), tuple(d.get("buffers", ())))


@dataclass(frozen=True)
class Hazard:
    """A free while a use of its bytes on another stream may still be pending, whose bytes no
    allocation got in this run: nothing was corrupted, but an allocation handed them before that
    use is ordered before it would be (the FREE race, trace.Free). Not a race unless the free is
    strict (--strict-free). `race` words it as a report does: kind FREE, the use first, the free
    second, the fix."""

    race: Race

    @property
    def key(self) -> tuple:
        return self.race.key

    def format(self, width: Optional[int] = None, stack: bool = False) -> str:
        return self.race.format(width, stack, what="hazard")

    def to_dict(self, root: Optional[str] = None) -> dict:
        return dict(self.race.to_dict(root), hazard=True)


def format_hazards(hazards, width: Optional[int] = None, stack: bool = False) -> str:
    """The hazard lines after a report ("" when there are none)."""
    if not hazards:
        return ""
    head = (f"streamcheck: {len(hazards)} free hazard{'s' if len(hazards) != 1 else ''} (not races in this run: "
            "memory freed while another stream may still use it, and no allocation got it; "
            "--strict-free reports them as races)")
    return "\n\n".join([head] + [h.format(width, stack) for h in hazards])


def reports_to_dicts(races, root: Optional[str] = None) -> list:
    """The reports as data (Race.to_dict each); call sites relative to `root` (default: the
    working directory, or what set_site_settings chose)."""
    return [r.to_dict(root) for r in races]


def reports_to_json(races, root: Optional[str] = None) -> str:
    """reports_to_dicts as a JSON text."""
    return json.dumps(reports_to_dicts(races, root), indent=2)


# How far wrapped lines are indented past their first line, so a reader sees where a
# report line continues.
CONTINUATION_INDENT = "    "
MIN_WRAP_WIDTH = 40  # narrower than this, wrapping makes a report harder to read, not easier


def wrap_lines(text: str, width: Optional[int]) -> str:
    """Wrap each line of `text` longer than `width` at spaces, continuation lines indented past
    the line's own indent. Words are never split: a file:line or a kernel name stays whole
    (a word longer than the width keeps its own line). `width=None` leaves `text` as it is."""
    if width is None:
        return text
    width = max(width, MIN_WRAP_WIDTH)
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        body = line.lstrip(" ")
        indent = line[:len(line) - len(body)]
        out.extend(textwrap.wrap(body, width, initial_indent=indent, subsequent_indent=indent + CONTINUATION_INDENT,
                                 break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)


def _join(clock: dict, other: dict) -> None:
    """clock := max(clock, other), componentwise. Missing owners are 0."""
    get = clock.get
    for owner, tick in other.items():
        if get(owner, 0) < tick:
            clock[owner] = tick


# An access as the checker keeps it: a tuple, indexed by these positions. The
# operation is kept so the report can name it; the Access is built only then.
_START, _STOP, _WRITE, _OWNER, _TICK, _OP, _FREE, _REPLAY = range(8)


class _Device:
    """One device's legacy default stream and the streams that synchronize with it."""

    __slots__ = ("index", "legacy", "legacy_version", "joiners")

    def __init__(self, index: int):
        self.index = index
        self.legacy: Optional[_Stream] = None
        self.legacy_version = 0
        self.joiners: list[_Stream] = []  # this device's blocking and per-thread default streams


class _Stream:
    __slots__ = ("id", "kind", "label", "clock", "owner", "host_seen", "legacy_seen", "is_legacy",
                 "joins_legacy", "captured", "waits", "dev", "name")

    def __init__(self, id: int, kind: StreamKind, label: str, owner: int, dev: "_Device"):
        self.id = id
        self.kind = kind
        self.label = label
        self.name = label  # the label without its device: reports add "(cuda:N)" once several are in use
        self.dev = dev
        self.owner = owner
        self.clock = {owner: 0}
        self.host_seen = {}  # thread id -> version of that thread's clock already joined
        self.legacy_seen = -1
        self.is_legacy = kind is StreamKind.LEGACY
        self.joins_legacy = kind.joins_legacy
        # For the report only: source owner -> (event name, its tick captured by a wait),
        # and event id -> (event, wait site, recorded at wait time?) of the last wait on it.
        self.captured: dict = {}
        self.waits: dict = {}


class _Event:
    __slots__ = ("id", "name", "state", "stream", "site", "destroyed")

    def __init__(self, id: int, name: str):
        self.id = id
        self.name = name or f"event{id}"
        self.state: Optional[dict] = None  # None: never recorded
        self.stream: Optional[_Stream] = None
        self.site: Optional[CallSite] = None  # of the latest record
        self.destroyed = False


class _Thread:
    __slots__ = ("id", "owner", "clock", "version")

    def __init__(self, id: int, owner: int):
        self.id = id
        self.owner = owner
        self.clock = {owner: 1}
        self.version = 0  # bumped whenever the clock changes, so streams skip redundant joins


class _Seen:
    """What the checker keeps of one Race.key: its first report, how often it was seen, the
    operations of its first and latest occurrence, and the stream pairs and buffers it folds.
    One record, so a repeat (the hot case: a race in a loop) hashes its key once."""

    __slots__ = ("race", "count", "witness", "latest", "pairs", "buffers")

    def __init__(self, race: "Race", witness: tuple, pair: tuple, buffer: str):
        self.race, self.count, self.witness, self.latest = race, 1, witness, None
        self.pairs = {pair: None}  # (first owner, second owner), first seen first
        self.buffers = {buffer: None}


def buffer_name(buffer: int, name: str) -> str:
    """How reports name buffer `buffer` allocated as `name` (Alloc.name; "" for none)."""
    return name or f"buffer{buffer}"


class _Buffer:
    __slots__ = ("id", "nbytes", "name", "site", "records", "freed_at", "device")

    def __init__(self, id: int, nbytes: int, name: str, site: CallSite, device: int = 0):
        self.id = id
        self.device = device
        self.nbytes = nbytes
        self.name = buffer_name(id, name)
        self.site = site
        self.records: list = []  # access tuples (see _START...) not yet subsumed by a later one
        self.freed_at: Optional[CallSite] = None


class _Freed:
    """A free (not strict) of bytes with uses not yet ordered for every possible new owner: those
    access tuples (`pending`: all but what record_stream's events cover), the ones its own actor
    was not ordered after either (`unordered`: the hazard), the Free and its actor's owner, and
    whether an allocation got some of the bytes since."""

    __slots__ = ("buffer", "op", "owner", "pending", "unordered", "reused")

    def __init__(self, buffer: _Buffer, op: Free, owner: int, pending: list, unordered: list):
        self.buffer, self.op, self.owner, self.reused = buffer, op, owner, False
        self.pending, self.unordered = pending, unordered


class Checker:
    """Feed operations in issue order; read `races` (and `hazards`) at any time."""

    def __init__(self) -> None:
        self._streams: dict[int, _Stream] = {}
        self._events: dict[int, _Event] = {}
        self._buffers: dict[int, _Buffer] = {}
        # Clock components ("owners") are numbered in creation order, streams and
        # threads alike, so no id a trace uses can make two of them collide.
        self._owners: list = []  # owner -> _Stream or _Thread
        self._threads: dict[int, _Thread] = {}
        self._new_thread(0)
        self._channels: dict[int, dict] = {}  # host hand-off channel -> the clock handed over through it
        self._devices: dict[int, _Device] = {0: _Device(0)}
        # Set once a second device shows up: launches then check peer access, labels name devices.
        self._multi = False
        self._peers: set = set()  # (device, peer): kernels on device may access peer's memory
        self.peer_errors: list[PeerAccessError] = []
        self._seen: dict[tuple, _Seen] = {}  # Race.key -> what was seen of it, first reported first
        self._freed: dict[int, _Freed] = {}  # freed buffer id -> the uses pending at its free
        self._capture = CaptureTracker()
        self._replays: dict = {}  # graph id -> (graph, replays so far, the last launch's site, the one before)
        self._graph_buffers: dict = {}  # active graph id -> buffer id -> _Buffer holding its accesses
        self._in_graph: Optional[int] = None  # set while checking a captured node, for the report
        self.capture_errors: list[CaptureError] = []
        # Called with (first op, second op, Race.key) at every race occurrence, repeats included:
        # the sync audit attributes each to the synchronizations issued between the two.
        self.on_race: Optional[Callable[[Op, Op, tuple], None]] = None
        self._dispatch = {
            ThreadStart: self._thread_start,
            ThreadJoin: self._thread_join,
            HandOff: self._hand_off,
            TakeOver: self._take_over,
            StreamCreate: self._stream_create,
            EventCreate: self._event_create,
            EventDestroy: self._event_destroy,
            EventRecord: self._event_record,
            StreamWait: self._stream_wait,
            StreamSync: self._stream_sync,
            EventSync: self._event_sync,
            StreamQuery: self._stream_query,
            EventQuery: self._event_query,
            DeviceSync: self._device_sync,
            PeerAccess: self._peer_access,
            Alloc: self._alloc,
            Free: self._free,
            Launch: self._launch,
            Copy: self._launch,
            HostAccess: self._host_access,
            ImplicitSync: lambda op: None,  # deliberately not an edge: CUDA promises nothing
            CaptureBegin: self._capture_begin,
            CaptureEnd: self._capture_end,
            GraphLaunch: self._graph_launch,
        }

    # --- public -------------------------------------------------------------------------
    @property
    def races(self) -> list[Race]:
        return self.folded(())

    def folded(self, later) -> list[Race]:
        """The races, with `later` occurrences folded in as _report folds a repeat: (Race.key, first
        owner, second owner, buffer name) each, of races this checker has reported (the occurrences
        another checker found in operations fed after the ones this one was fed: core.fast's)."""
        more: dict = {}  # key -> [count, pairs, buffers]
        for key, first_owner, owner, buffer in later:
            found = more.get(key)
            if found is None:
                found = more[key] = [0, {}, {}]
            found[0] += 1
            found[1][(first_owner, owner)] = None
            found[2][buffer] = None
        out = []
        for key, seen in self._seen.items():
            count, pairs, buffers = seen.count, seen.pairs, seen.buffers
            found = more.pop(key, None)
            if found is not None:  # first seen first: the new pairs and buffers after the known ones
                count, pairs, buffers = count + found[0], {**pairs, **found[1]}, {**buffers, **found[2]}
            streams = tuple((self.owner_label(a), self.owner_label(b)) for a, b in pairs)
            out.append(replace(seen.race, count=count, streams=streams, buffers=tuple(buffers)))
        if more:
            raise ValueError(f"folded: {len(more)} race key(s) this checker never reported, e.g. {next(iter(more))}")
        return out

    def has_graph(self, graph_id: int) -> bool:
        """Whether a capture of `graph_id` ended without error (a GraphLaunch of it can be fed)."""
        return self._capture.graph(graph_id) is not None

    @property
    def hazards(self) -> list[Hazard]:
        """Frees with a use pending on another stream whose bytes no allocation got (so far), one
        per (use, free) pair of sites, first freed first."""
        seen: dict = {}
        for freed in self._freed.values():
            if freed.reused:
                continue
            buf = freed.buffer
            for rec in freed.unordered:
                key = ("FREE", rec[_OP].site.place, freed.op.site.place)
                found = seen.get(key)
                if found is not None:
                    found[1] += 1
                    continue
                first = self._access_of(rec[_OWNER], rec[_OP], rec[_WRITE], False, rec[_REPLAY])
                second = self._access_of(freed.owner, freed.op, True, True)
                edge, hint = self._explain(rec, first, freed.owner, second, "FREE", freed.op, buf, hazard=True)
                seen[key] = [Race("FREE", buf.name, buf.site, rec[_START], rec[_STOP], first, second, edge, hint), 1]
        return [Hazard(replace(race, count=count)) for race, count in seen.values()]

    def witness(self, race: Race, latest: bool = False) -> Optional[tuple]:
        """The two trace operations (first, second) of the first time `race` was seen (with
        `latest`, of the last time): the occurrence race-directed confirmation reruns
        (streamcheck.proofs.confirm). None if this checker did not report it."""
        seen = self._seen.get(race.key)
        if seen is None:
            return None
        return seen.latest if latest and seen.latest is not None else seen.witness

    def feed(self, op: Op) -> None:
        handler = self._dispatch.get(type(op))
        if handler is None:
            raise TraceError(f"unknown operation {type(op).__name__} at {getattr(op, 'site', '?')}; "
                             "feed only the operation records of streamcheck.trace")
        if op.thread not in self._threads and type(op) is not ThreadStart:
            raise TraceError(f"{type(op).__name__} at {op.site}: unknown host thread {op.thread}; "
                             "record ThreadStart for it first")
        handler(op)

    def sync_clocks(self, op: Op) -> Optional[tuple]:
        """For a synchronization `op` about to be fed (a wait, a host synchronize or a query that
        returned done): (needed, have, ordered, source) — the clock it joins, the clock of what
        it orders, that actor's owner, and the owner whose work it waits for (None for a device
        synchronize). It adds no order where `have` already covers `needed`. None: not a
        synchronization, or one that orders nothing (a never-recorded event)."""
        kind = type(op)
        thread = self._threads.get(op.thread)
        if thread is None:
            return None
        if kind is StreamWait:
            event, stream = self._events.get(op.event), self._streams.get(op.stream)
            if event is None or stream is None or event.state is None or event.stream is None:
                return None
            have = dict(stream.clock)
            _join(have, thread.clock)  # what the host issued before the wait is ordered anyway
            return event.state, have, stream.owner, event.stream.owner
        if kind in (StreamSync, StreamQuery):
            stream = self._streams.get(op.stream)
            if stream is None:
                return None
            return stream.clock, thread.clock, thread.owner, stream.owner
        if kind in (EventSync, EventQuery):
            event = self._events.get(op.event)
            if event is None or event.state is None or event.stream is None:
                return None
            return event.state, thread.clock, thread.owner, event.stream.owner
        if kind is DeviceSync:
            needed: dict = {}
            for stream in self._streams.values():
                if stream.dev.index == op.device:
                    _join(needed, stream.clock)
            return needed, thread.clock, thread.owner, None
        return None

    @property
    def distinct_races(self) -> int:
        """How many distinct races were reported so far (cheap: for callers that stop at the first)."""
        return len(self._seen)

    def thread_owner(self, thread: int) -> Optional[int]:
        """The clock owner of host thread `thread` (None if it has not started)."""
        found = self._threads.get(thread)
        return found.owner if found is not None else None

    def owner_label(self, owner: int) -> str:
        """How reports name a clock owner: a stream's label or "host thread N"."""
        actor = self._owners[owner]
        return actor.label if isinstance(actor, _Stream) else f"host thread {actor.id}"

    def capturing(self, stream: int) -> Optional[int]:
        """The graph `stream` is capturing into now, or None."""
        return self._capture.capturing(stream)

    def captured_graph(self, graph_id: int):
        """The CapturedGraph of a capture that ended without error, or None."""
        return self._capture.graph(graph_id)

    def stream_label(self, stream: int) -> str:
        return self._streams[stream].label

    def buffer_name(self, buffer: int) -> str:
        return self._buffers[buffer].name

    # --- lookups with clear errors ------------------------------------------------------
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

    def _buffer(self, op: Op, buffer: int) -> _Buffer:
        buf = self._buffers.get(buffer)
        if buf is None:
            raise TraceError(f"{type(op).__name__} at {op.site}: unknown buffer {buffer}; "
                             "allocate it (Alloc) before using it")
        if buf.freed_at is not None:
            raise TraceError(f"{type(op).__name__} at {op.site}: buffer `{buf.name}` was freed at "
                             f"{buf.freed_at}; use after free: allocate a new buffer")
        return buf

    def _check_ranges(self, op: Op, ranges) -> None:
        """Raise unless every range lies inside a live allocation (before any state changes)."""
        buffers = self._buffers
        for rng in ranges:
            buf = buffers.get(rng.buffer)
            if buf is None or buf.freed_at is not None:
                self._buffer(op, rng.buffer)
            if not (0 <= rng.start <= rng.stop <= buf.nbytes):
                raise TraceError(f"{type(op).__name__} at {op.site}: bytes [{rng.start}, {rng.stop}) are "
                                 f"outside `{buf.name}` ({buf.nbytes} bytes, allocated at {buf.site})")

    # --- clocks -------------------------------------------------------------------------
    def _new_thread(self, id: int) -> _Thread:
        thread = _Thread(id, len(self._owners))
        self._owners.append(thread)
        self._threads[id] = thread
        return thread

    def _issue(self, op: Op, stream: _Stream) -> int:
        """Order the next operation on `stream` after what the host and CUDA's implicit
        legacy-stream rules require; return its tick."""
        thread = self._threads[op.thread]
        clock = stream.clock
        host_seen = stream.host_seen
        if host_seen.get(op.thread) != thread.version:
            _join(clock, thread.clock)
            host_seen[op.thread] = thread.version
        if stream.is_legacy:
            # Legacy stream: waits for all earlier work on its device's blocking streams.
            dev = stream.dev
            for other in dev.joiners:
                _join(clock, other.clock)
            dev.legacy_version += 1
        elif stream.joins_legacy:
            # ... and later work on blocking streams waits for their device's legacy stream.
            dev = stream.dev
            legacy = dev.legacy
            if legacy is not None and stream.legacy_seen != dev.legacy_version:
                _join(clock, legacy.clock)
                stream.legacy_seen = dev.legacy_version
        tick = clock[stream.owner] + 1
        clock[stream.owner] = tick
        return tick

    def _host_tick(self, thread: _Thread) -> int:
        tick = thread.clock[thread.owner] + 1
        thread.clock[thread.owner] = tick
        thread.version += 1
        return tick

    def _host_join(self, thread: _Thread, other: dict) -> None:
        _join(thread.clock, other)
        thread.version += 1

    # --- handlers -----------------------------------------------------------------------
    def _thread_start(self, op: ThreadStart) -> None:
        parent = None
        if op.parent is not None:
            parent = self._threads.get(op.parent)
            if parent is None:
                raise TraceError(f"ThreadStart at {op.site}: unknown parent thread {op.parent}; "
                                 "start the parent first")
        child = self._threads.get(op.thread)
        if child is None:
            child = self._new_thread(op.thread)
        elif op.thread != 0:  # thread 0 (the main thread) exists from the start
            raise TraceError(f"ThreadStart at {op.site}: host thread {op.thread} already started; "
                             "give each host thread its own id")
        if parent is not None:
            self._host_join(child, parent.clock)
            self._host_tick(parent)

    def _thread_join(self, op: ThreadJoin) -> None:
        child = self._threads.get(op.child)
        if child is None:
            raise TraceError(f"ThreadJoin at {op.site}: unknown host thread {op.child}; "
                             "record ThreadStart for it first")
        self._host_join(self._threads[op.thread], child.clock)

    def _hand_off(self, op: HandOff) -> None:
        thread = self._threads[op.thread]
        channel = self._channels.get(op.channel)
        if channel is None:
            channel = self._channels[op.channel] = {}
        _join(channel, thread.clock)
        self._host_tick(thread)  # what the thread does next is not handed over

    def _take_over(self, op: TakeOver) -> None:
        channel = self._channels.get(op.channel)
        if channel:
            self._host_join(self._threads[op.thread], channel)

    def _stream_create(self, op: StreamCreate) -> None:
        if op.stream in self._streams:
            raise TraceError(f"StreamCreate at {op.site}: stream {op.stream} already exists; "
                             "give each stream its own id")
        try:
            kind = StreamKind.parse(op.kind)
        except ValueError as exc:
            raise TraceError(f"StreamCreate at {op.site}: {exc}") from None
        dev = self._device(op, op.device)
        if kind is StreamKind.LEGACY and dev.legacy is not None:
            where = f" of cuda:{dev.index}" if self._multi else ""
            raise TraceError(f"StreamCreate at {op.site}: there is only one legacy default stream{where} "
                             f"(stream {dev.legacy.id}); reuse it")
        label = stream_label(kind, op.name, op.stream, op.thread)
        stream = _Stream(op.stream, kind, label, len(self._owners), dev)
        if self._multi:
            stream.label = device_label(label, dev.index)
        self._owners.append(stream)
        self._streams[op.stream] = stream
        if kind is StreamKind.LEGACY:
            dev.legacy = stream
        elif kind.joins_legacy:
            dev.joiners.append(stream)
        self._capture.stream_created(op.stream, kind, label)

    def _event_create(self, op: EventCreate) -> None:
        known = self._events.get(op.event)
        if known is not None and not known.destroyed:  # a destroyed id may be handed out again
            raise TraceError(f"EventCreate at {op.site}: event {op.event} (`{known.name}`) already exists; "
                             "give each event its own id")
        self._events[op.event] = _Event(op.event, op.name)

    def _event_destroy(self, op: EventDestroy) -> None:
        self._event(op, op.event).destroyed = True

    def _event_record(self, op: EventRecord) -> None:
        event = self._event(op, op.event)
        stream = self._stream(op, op.stream)
        capture = self._capture
        try:
            if (capture.active or op.event in capture.captured_events) and capture.record(op):
                # A record inside a capture marks a point in the graph; on the device
                # nothing is recorded, so an ordinary wait on it later waits for nothing.
                event.state, event.stream, event.site = None, stream, op.site
                return
        except CaptureError as error:
            self.capture_errors.append(error)
            return
        self._issue(op, stream)
        event.state = dict(stream.clock)  # replaces any earlier record
        event.stream = stream
        event.site = op.site

    def _stream_wait(self, op: StreamWait) -> None:
        event = self._event(op, op.event)
        stream = self._stream(op, op.stream)
        capture = self._capture
        try:
            if (capture.active or op.event in capture.captured_events) and capture.wait(op, event.state is not None):
                return  # an edge inside a graph, not an ordering of executed work
        except CaptureError as error:
            self.capture_errors.append(error)
            return
        self._issue(op, stream)
        state = event.state
        stream.waits[event.id] = (event, op.site, state is not None)
        if state is None:
            return  # CUDA: waiting on a never-recorded event does nothing
        _join(stream.clock, state)
        src = event.stream.owner
        captured = state.get(src, 0)
        known = stream.captured.get(src)
        if known is None or known[1] < captured:
            stream.captured[src] = (event.name, captured, event.site)

    def _refused(self, check, *args) -> bool:
        """Run a capture rule; True (and the error collected) when CUDA would refuse the call."""
        try:
            check(*args)
        except CaptureError as error:
            self.capture_errors.append(error)
            return True
        return False

    def _stream_sync(self, op: StreamSync) -> None:
        stream = self._stream(op, op.stream)
        if self._refused(self._capture.sync_stream, op, op.stream):
            return
        thread = self._threads[op.thread]
        if stream.is_legacy:
            # Measured on an H200 (docs/cuda-rules.md): synchronizing the legacy stream also waits
            # for its device's blocking streams' pending work, even when it has none of its own.
            for other in stream.dev.joiners:
                _join(thread.clock, other.clock)
        self._host_join(thread, stream.clock)

    def _event_sync(self, op: EventSync) -> None:
        event = self._event(op, op.event)
        if self._refused(self._capture.sync_event, op, op.event, event.name):
            return
        if event.state is not None:  # synchronizing a never-recorded event returns at once
            self._host_join(self._threads[op.thread], event.state)

    def _stream_query(self, op: StreamQuery) -> None:
        stream = self._stream(op, op.stream)
        # cudaStreamQuery of a capturing stream is refused like its synchronize.
        if self._refused(self._capture.sync_stream, op, op.stream) or not op.done:
            return
        self._host_join(self._threads[op.thread], stream.clock)

    def _event_query(self, op: EventQuery) -> None:
        event = self._event(op, op.event)
        if self._refused(self._capture.sync_event, op, op.event, event.name) or not op.done:
            return
        if event.state is not None:
            self._host_join(self._threads[op.thread], event.state)

    def _device(self, op: Op, index) -> _Device:
        """The device `index` (a new one on first use); the first device past cuda:0 turns on
        the multi-device rules: peer-access checks and device names in labels."""
        dev = self._devices.get(index)
        if dev is None:
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise TraceError(f"{type(op).__name__} at {op.site}: device {index!r} is not a device index "
                                 "(an integer >= 0, as in cuda:N)")
            dev = self._devices[index] = _Device(index)
            if not self._multi:
                self._multi = True
                for stream in self._streams.values():  # reports name every stream's device from now on
                    stream.label = device_label(stream.name, stream.dev.index)
        return dev

    def _device_sync(self, op: DeviceSync) -> None:
        dev = self._device(op, op.device)
        if self._refused(self._capture.sync_device, op):
            return
        thread = self._threads[op.thread]
        for stream in self._streams.values():
            if stream.dev is dev:  # cudaDeviceSynchronize waits for its own device only
                _join(thread.clock, stream.clock)
        thread.version += 1

    def _peer_access(self, op: PeerAccess) -> None:
        if op.device == op.peer:
            raise TraceError(f"PeerAccess at {op.site}: device {op.device} cannot be its own peer")
        self._device(op, op.device)
        self._device(op, op.peer)
        self._peers.add((op.device, op.peer))

    def _peer_error(self, op, stream: _Stream, buffers) -> Optional[PeerAccessError]:
        """A kernel (not a copy: CUDA stages those through the host) on `stream` that touches
        memory of another device to which its device has no peer access."""
        if type(op) is not Launch:
            return None
        touched = [(buf.name, buf.site, buf.device) for buf in (buffers[rng.buffer] for rng in op.reads + op.writes)]
        return peer_access_error(op.name, op.site, stream.name, stream.dev.index, touched, self._peers)

    def _alloc(self, op: Alloc) -> None:
        known = self._buffers.get(op.buffer)
        if known is not None and known.freed_at is None:
            raise TraceError(f"Alloc at {op.site}: buffer {op.buffer} (`{known.name}`) already allocated "
                             f"at {known.site}; free it first or use a new id")
        if op.nbytes < 0:
            raise TraceError(f"Alloc at {op.site}: negative size {op.nbytes} for buffer {op.buffer}")
        self._device(op, op.device)
        if op.reuses:
            self._reuse(op)  # before the new buffer replaces an old one of the same id
        self._buffers[op.buffer] = _Buffer(op.buffer, op.nbytes, op.name, op.site, op.device)

    def _reuse(self, op: Alloc) -> None:
        """An allocation handed freed bytes: each use pending at their free that is not ordered
        before the allocation (its pool's stream, and the host that allocates) is a FREE race."""
        for rng in op.reuses:
            old = self._buffers.get(rng.buffer)
            if old is None or old.freed_at is None or not 0 <= rng.start <= rng.stop <= old.nbytes:
                raise TraceError(f"Alloc at {op.site}: reuses {rng} of "
                                 f"{'a live buffer' if old is not None and old.freed_at is None else 'no freed buffer'}"
                                 "; an allocation can get only bytes of a freed buffer")
        thread = self._threads[op.thread]
        clock = thread.clock
        if op.stream is not None:
            clock = dict(self._stream(op, op.stream).clock)
            _join(clock, thread.clock)
        get = clock.get
        for rng in op.reuses:
            freed = self._freed.get(rng.buffer)
            if freed is None:
                continue  # nothing was pending at its free
            freed.reused = True
            keep = []
            for rec in freed.pending:
                if rec[_START] < rng.stop and rng.start < rec[_STOP]:
                    if get(rec[_OWNER], 0) < rec[_TICK]:
                        self._report(freed.buffer, rec, rng.start, rng.stop, True, freed.owner, freed.op, True,
                                     reuse=op)
                    if rng.start <= rec[_START] and rec[_STOP] <= rng.stop:
                        continue  # its bytes have a new owner: checked once
                keep.append(rec)
            if keep:
                freed.pending = keep
            else:
                del self._freed[rng.buffer]

    def _free(self, op: Free) -> None:
        buf = self._buffer(op, op.buffer)
        if op.stream is None:
            actor = self._threads[op.thread]
            clock, owner, tick = actor.clock, actor.owner, self._host_tick(actor)
        else:
            actor = self._stream(op, op.stream)
            clock, owner, tick = actor.clock, actor.owner, self._issue(op, actor)
            if op.also:  # record_stream: reuse also waits for what those streams issued so far
                clock = dict(clock)
                for other in op.also:
                    _join(clock, self._stream(op, other).clock)
        if op.strict:
            self._access(buf, 0, buf.nbytes, True, clock, owner, tick, op, True)
        elif buf.records:
            # Not a race yet: kept for the allocation that gets these bytes (_reuse), whose own clock
            # decides (a pool may hand them to another stream than the free's: CuPy's across
            # threads), less what record_stream's events cover (the pool waits for them); a use the
            # free's actor was not ordered after either is a hazard if nothing reuses the bytes.
            guard: dict = {}
            for other in op.also:
                _join(guard, self._stream(op, other).clock)
            covered, get = guard.get, clock.get
            pending = [rec for rec in buf.records if covered(rec[_OWNER], 0) < rec[_TICK]]
            if pending:
                unordered = [rec for rec in pending if get(rec[_OWNER], 0) < rec[_TICK]]
                self._freed[buf.id] = _Freed(buf, op, owner, pending, unordered)
        buf.freed_at = op.site
        buf.records = []

    def _launch(self, op) -> None:
        stream = self._streams.get(op.stream)
        if stream is None:
            self._stream(op, op.stream)
        reads, writes = op.reads, op.writes
        buffers = self._buffers
        # Validate everything before any state changes (the common case inline: hot path).
        for ranges in (reads, writes):
            for rng in ranges:
                buf = buffers.get(rng.buffer)
                if buf is None or buf.freed_at is not None or not (0 <= rng.start <= rng.stop <= buf.nbytes):
                    self._check_ranges(op, ranges)
        if self._multi:
            error = self._peer_error(op, stream, buffers)
            if error is not None:  # the kernel faults: collected, and its accesses never happen
                self.peer_errors.append(error)
                return
        if self._capture.active:
            try:
                node = self._capture.node(op, op.stream)
            except CaptureError as error:
                self.capture_errors.append(error)
                return
            if node is not None:
                self._captured_access(node, stream)
                return
        tick = self._issue(op, stream)
        clock, owner, access = stream.clock, stream.owner, self._access
        for rng in reads:
            access(buffers[rng.buffer], rng.start, rng.stop, False, clock, owner, tick, op, False)
        for rng in writes:
            access(buffers[rng.buffer], rng.start, rng.stop, True, clock, owner, tick, op, False)

    def _host_access(self, op: HostAccess) -> None:
        thread = self._threads[op.thread]
        self._check_ranges(op, op.reads)
        self._check_ranges(op, op.writes)
        tick = self._host_tick(thread)
        clock, owner, buffers = thread.clock, thread.owner, self._buffers
        for rng in op.reads:
            self._access(buffers[rng.buffer], rng.start, rng.stop, False, clock, owner, tick, op, False)
        for rng in op.writes:
            self._access(buffers[rng.buffer], rng.start, rng.stop, True, clock, owner, tick, op, False)

    # --- stream capture -------------------------------------------------------------------
    def _capture_begin(self, op: CaptureBegin) -> None:
        self._stream(op, op.stream)
        if not self._refused(self._capture.begin, op):
            self._graph_buffers[op.graph] = {}

    def _capture_end(self, op: CaptureEnd) -> None:
        self._stream(op, op.stream)
        self._refused(self._capture.end, op)
        for graph_id in [g for g in self._graph_buffers if not self._capture.is_active(g)]:
            del self._graph_buffers[graph_id]

    def _captured_access(self, node: CapturedNode, stream: _Stream) -> None:
        """Check a captured node against the earlier nodes of its graph, in graph order."""
        graph_id = self._capture.capturing(node.stream)
        shadows = self._graph_buffers[graph_id]
        streams = self._streams
        clock = {streams[s].owner: seq for s, seq in node.clock.items()}
        op = node.op
        self._in_graph = graph_id
        try:
            for ranges, write in ((op.reads, False), (op.writes, True)):
                for rng in ranges:
                    shadow = shadows.get(rng.buffer)
                    if shadow is None:
                        buf = self._buffers[rng.buffer]
                        shadow = shadows[rng.buffer] = _Buffer(buf.id, buf.nbytes, buf.name, buf.site)
                    self._access(shadow, rng.start, rng.stop, write, clock, stream.owner, node.seq, op, False)
        finally:
            self._in_graph = None

    def _graph_launch(self, op: GraphLaunch) -> None:
        stream = self._stream(op, op.stream)
        if self._capture.active and self._refused(self._capture.check_legacy, op, op.stream):
            return  # a launch on the legacy stream would implicitly join a capturing blocking stream
        graph = self._capture.graph(op.graph)
        if graph is None:
            raise TraceError(f"GraphLaunch at {op.site}: unknown graph {op.graph}; launch only a graph whose "
                             "capture ended without error (CaptureEnd)")
        if self._capture.capturing(op.stream) is not None:
            raise TraceError(f"GraphLaunch at {op.site}: {stream.label} is capturing; streamcheck does not "
                             "model a graph launched into another capture (a child graph node)")
        for node in graph.nodes:
            self._check_ranges(op, node.op.reads)
            self._check_ranges(op, node.op.writes)
        # The graph starts after earlier work on the stream and ends before later work
        # (every fork was joined back into the origin), so all of its nodes share one tick.
        tick = self._issue(op, stream)
        clock, owner, buffers = stream.clock, stream.owner, self._buffers
        # Which replay this is, and the one before: a graph rewrites its memory at every launch,
        # so a race with a node names the replay (and what the previous one left there).
        previous = self._replays.get(op.graph)
        replay = self._replays[op.graph] = (op.graph, 1 + (previous[1] if previous else 0), op.site,
                                            previous[2] if previous else None)
        for node in graph.nodes:
            for ranges, write in ((node.op.reads, False), (node.op.writes, True)):
                for rng in ranges:
                    self._access(buffers[rng.buffer], rng.start, rng.stop, write, clock, owner, tick, node.op, False,
                                 replay)

    # --- the race check -----------------------------------------------------------------
    def _access(self, buf: _Buffer, start: int, stop: int, write: bool, clock: dict, owner: int,
                tick: int, op: Op, free: bool, replay: Optional[tuple] = None) -> None:
        if start >= stop:
            return
        get = clock.get
        keep = []
        for rec in buf.records:
            if rec[0] < stop and start < rec[1]:
                if get(rec[3], 0) >= rec[4]:  # ordered before this access
                    # Drop what this access subsumes: an ordered earlier access to bytes it
                    # covers can only race with something that also races with this one.
                    if (write or not rec[2]) and start <= rec[0] and rec[1] <= stop:
                        continue
                elif write or rec[2]:
                    self._report(buf, rec, start, stop, write, owner, op, free, replay)
            keep.append(rec)
        keep.append((start, stop, write, owner, tick, op, free, replay))
        buf.records = keep

    def _access_of(self, owner: int, op: Op, write: bool, free: bool, replay: Optional[tuple] = None) -> Access:
        actor = self._owners[owner]
        label = actor.label if isinstance(actor, _Stream) else f"host thread {actor.id}"
        described = ""
        if replay is not None:
            graph, number, site, _ = replay
            described = f"replay {number} of CUDA graph {graph} (launched at {site_path(site)})"
        return Access(label, "free" if free else op.name, op.site, write, described)

    @staticmethod
    def _overwritten(first: tuple, kind: str, replay: Optional[tuple]) -> str:
        """A graph's replay rewriting bytes an earlier access outside it still uses: the output of
        the replay before it, in most programs (CUDA graph trees warn of exactly this)."""
        if replay is None or first[_REPLAY] is not None or kind not in ("WAR", "WAW") or replay[1] < 2:
            return ""
        graph, number, _, before = replay
        return (f"; CUDA graph {graph} rewrites its memory at every replay: replay {number} overwrites what replay "
                f"{number - 1} (launched at {site_path(before)}) left there while `{first[_OP].name}` may still use "
                "it (clone an output that must outlive the next replay, or order the replay after its user)")

    @staticmethod
    def _shared_by_graphs(first: tuple, replay: Optional[tuple]) -> str:
        """Two graphs' replays on the same bytes: graphs captured into one memory pool (torch's
        `torch.cuda.graph(pool=...)`), where a later capture is handed bytes an earlier graph
        uses; sharing is safe only for replays in capture order, one after the other."""
        earlier = first[_REPLAY]
        if replay is None or earlier is None or earlier[0] == replay[0]:
            return ""
        return (f"; CUDA graphs {earlier[0]} and {replay[0]} both use these bytes (graphs that share one memory pool "
                "may replay only one after the other, in capture order): order the second replay after the first")

    def _report(self, buf: _Buffer, first: tuple, start: int, stop: int, write: bool,
                owner: int, op: Op, free: bool, replay: Optional[tuple] = None, reuse: Optional[Alloc] = None) -> None:
        if free:
            kind = "FREE"
        elif first[_WRITE] and write:
            kind = "WAW"
        elif first[_WRITE]:
            kind = "RAW"
        else:
            kind = "WAR"
        # This runs for every repeat of a race: a site keeps its place once built (Race.key), and
        # nothing is formatted until the first report of a key.
        key = (kind, first[_OP].site.place, op.site.place)
        if self.on_race is not None:  # a reuse's race is ordered by what comes before the allocation
            self.on_race(first[_OP], op if reuse is None else reuse, key)
        seen = self._seen.get(key)
        if seen is not None:
            seen.count += 1
            seen.latest = (first[_OP], op)
            seen.pairs[(first[_OWNER], owner)] = None
            seen.buffers[buf.name] = None
            return
        first_access = self._access_of(first[_OWNER], first[_OP], first[_WRITE], first[_FREE], first[_REPLAY])
        second = self._access_of(owner, op, write, free, replay)
        edge, hint = self._explain(first, first_access, owner, second, kind, op, buf, reuse=reuse)
        hint += self._overwritten(first, kind, replay) + self._shared_by_graphs(first, replay)
        race = Race(kind, buf.name, buf.site, max(start, first[_START]), min(stop, first[_STOP]), first_access,
                    second, edge, hint)
        self._seen[key] = _Seen(race, (first[_OP], op), (first[_OWNER], owner), buf.name)

    @staticmethod
    def _hint(src: _Stream, first_access: Access, dst: _Stream, second: Access) -> str:
        return (f"record an event on {src.label} after `{first_access.name}` and make {dst.label} wait "
                f"on it (stream.wait_event) before `{second.name}` ({site_path(second.site)})")

    def _explain(self, first: tuple, first_access: Access, owner: int, second: Access, kind: str, op: Op,
                 buf: _Buffer, reuse: Optional[Alloc] = None, hazard: bool = False) -> tuple[str, str]:
        """Say which edge is missing, in the words a CUDA programmer would use; for a free that is
        not strict, which allocation got the bytes (`reuse`), or that none did (`hazard`)."""
        edge, hint = self._explain_edge(first, first_access, owner, second, kind, op, buf)
        if reuse is not None:
            by = f" on {self._streams[reuse.stream].label}" if reuse.stream in self._streams else ""
            edge += (f"; the allocation at {site_path(reuse.site)}{by} got these bytes before that use was ordered "
                     "before it")
            waiter = self._streams[reuse.stream].label if reuse.stream in self._streams else "the host"
            hint += (f"; or make {waiter} wait for {self.owner_label(first[_OWNER])} before the allocation at "
                     f"{site_path(reuse.site)}")
        elif hazard:
            edge += ("; no allocation got these bytes in this run, so nothing was corrupted, but one that gets them "
                     "before that use is ordered before it would be")
        return edge, hint

    def _explain_edge(self, first: tuple, first_access: Access, owner: int, second: Access,
                      kind: str, op: Op, buf: _Buffer) -> tuple[str, str]:
        producer = f"`{first_access.name}` ({site_path(first_access.site)})"
        at = site_path(second.site)
        src, dst = self._owners[first[_OWNER]], self._owners[owner]
        if kind == "FREE" and getattr(op, "pool", "") == "torch" and isinstance(src, _Stream) and isinstance(
                dst, _Stream):
            # torch's caching allocator reuses the block on its allocation stream at once (a host free reads
            # as any host free, below).
            return (f"the caching allocator may hand the freed block to the next allocation on {dst.label} "
                    f"(freed at {at}) while {src.label} may still use it for {producer}; the block was "
                    f"never marked as used on {src.label}",
                    f"call tensor.record_stream({src.label.split(' (')[0]}) after {producer}, before the tensor "
                    f"is freed or resized at {at} (or make {dst.label} wait for {src.label} before the free)")
        if self._in_graph is not None:  # both sides are captured nodes on streams
            origin = self._streams[self._capture.origin(self._in_graph)]
            return (f"inside CUDA graph {self._in_graph} (captured on {origin.label}): {dst.label} never "
                    f"waited for an event recorded on {src.label} after {producer}; the graph repeats this "
                    "race on every launch",
                    f"during the capture, {self._hint(src, first_access, dst, second)}")
        if isinstance(src, _Thread):  # the earlier access was the host's
            return (
                f"{second.actor} is not ordered after host thread {src.id}'s {producer}: "
                f"the thread that issued `{second.name}` never synchronized with thread {src.id}",
                f"hand over from thread {src.id} after {producer} and before `{second.name}` ({at}): join "
                f"it, or use threading.Event (set, then wait), queue.Queue (put, then get), a Lock, RLock or "
                f"Condition, or a Barrier; each of these orders the threads ({HAND_OFFS_DOC})",
            )
        if isinstance(dst, _Thread):  # the later access is the host's
            verb = "freed" if kind == "FREE" else ("wrote" if second.write else "read")
            hint = (f"call {src.label}.synchronize() (or synchronize an event recorded after "
                    f"`{first_access.name}`) before `{second.name}` ({at})")
            if kind == "FREE" and isinstance(src, _Stream) and not getattr(op, "pool", ""):
                # The device API's free takes a stream: reuse then waits for that stream's work,
                # and the host does not block.
                hint = (f"free it on {src.label} instead: device.free({buf.name}, stream=<{src.label}>) at "
                        f"{at} is ordered after {producer} without blocking the host; or {hint}")
            return (f"host thread {dst.id} {verb} the memory at {at} without synchronizing with "
                    f"{src.label} after {producer}", hint)
        hint = self._hint(src, first_access, dst, second)
        tick = first[_TICK]
        for event, wait_site, was_recorded in dst.waits.values():
            # The event now covers the producer, but the wait came before that record (an event last
            # recorded inside a capture has no state: it covers nothing).
            if event.stream is src and event.state is not None and event.state.get(src.owner, 0) >= tick:
                if not was_recorded:
                    return (f"{dst.label} waited on event `{event.name}` at {site_path(wait_site)} before it was ever "
                            f"recorded (it was recorded on {src.label} after {producer} only later); "
                            "a wait on a never-recorded event is a no-op",
                            f"issue the wait after the record: {hint}")
                return (f"{dst.label} waited on event `{event.name}` at {site_path(wait_site)}, before it was "
                        f"re-recorded on {src.label} after {producer}; a wait sees only the state the "
                        "event had at the wait call",
                        f"issue the wait after the record: {hint}")
        captured = dst.captured.get(src.owner)
        if captured is not None:
            name, _, record_site = captured
            return (f"{dst.label} waited on event `{name}`, but it was recorded on {src.label} (at "
                    f"{site_path(record_site)}) before {producer} was issued; a wait only covers work recorded at "
                    "that time",
                    f"record the event after `{first_access.name}`: {hint}")
        edge = f"{dst.label} never waited for an event recorded on {src.label} after {producer}"
        if StreamKind.LEGACY in (src.kind, dst.kind) and StreamKind.NON_BLOCKING in (src.kind, dst.kind):
            edge += " (a non-blocking stream never synchronizes with the legacy default stream)"
        elif src.dev is not dst.dev and StreamKind.LEGACY in (src.kind, dst.kind):
            edge += " (a legacy default stream synchronizes only with blocking streams of its own device)"
        return edge, hint


def check(trace: Trace) -> list[Race]:
    """Run the checker over a whole trace and return its race reports."""
    checker = Checker()
    for op in trace:
        checker.feed(op)
    return checker.races


def format_report(races, width: Optional[int] = None, stack: bool = False) -> str:
    """All reports, for a person. `width` (a terminal's columns) wraps long lines; None, the
    default, keeps each line whole, for files, logs and callers that wrap themselves. `stack`:
    each access's frames under it (pytest's -v)."""
    if not races:
        return "streamcheck: no races found"
    head = f"streamcheck: {len(races)} race{'s' if len(races) != 1 else ''} found"
    return "\n\n".join([head] + [r.format(width, stack) for r in races])
