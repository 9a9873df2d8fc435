"""A recorded run as a timeline model: lanes, timed slices, edges and located races.

People who debug GPU timing read timelines (Nsight Systems, ui.perfetto.dev), not
logs. This module turns a run (a Device, or its parts: trace, races, op_times)
into one model that both views draw: export.py writes it as Chrome Trace Event
JSON for Perfetto, timeline.py draws it as a PNG, so both show the same times.

Time: `op_times` maps a trace index to (start, end). On the sim these are
scheduler steps (written as 1 step = 1 µs); on a GPU backend, microseconds
measured with CUDA events. Operations without a time (host calls, work that was
never timed or never ran) are placed by issue order: after what the host issued
before them, before any operation issued after them started.

Pure: the standard library and streamcheck.core only (no matplotlib, no JSON, no
cupy, no torch), so a model can be built and checked anywhere.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Optional

from ..core import trace as T
from ..core.hb import Checker, Race, TraceError

STEPS = "steps"  # sim scheduler steps, written as 1 step = 1 µs in the Perfetto export
MICROSECONDS = "us"  # measured on a GPU
ISSUE_ORDER = "order"  # nothing timed: 1 unit per operation in issue order

_STREAM_OPS = (T.Launch, T.Copy, T.EventRecord, T.StreamWait)
_SYNC_OPS = (T.StreamSync, T.EventSync, T.DeviceSync)
_HOST_OPS = _SYNC_OPS + (T.HostAccess, T.ImplicitSync)
_ACCESS_OPS = (T.Launch, T.Copy, T.HostAccess, T.Free)


# --- the model ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lane:
    """One track: a stream or a host thread."""

    key: tuple  # ("host", thread), ("stream", stream id) or ("graph", graph id, stream id)
    label: str  # "stream A (non_blocking)", "legacy default stream", "host thread 0"


@dataclass(frozen=True)
class Slice:
    """One operation on its lane, [start, end) on the run's clock."""

    index: int  # position in the trace
    lane: tuple  # Lane.key
    name: str  # kernel name, "record ev", "wait ev", "synchronize stream A", ...
    category: str  # kernel, copy, record, wait, free, sync, host; captured (a graph node), graph (a launch)
    start: float
    end: float
    measured: bool  # False: placed by issue order
    site: T.CallSite
    reads: tuple = ()  # (buffer name, start byte, stop byte)
    writes: tuple = ()

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Edge:
    """An ordering between two slices (trace indices), or the one a race lacks."""

    src: int
    dst: int
    kind: str  # "event" (record -> wait), "sync" (work -> host sync), "missing"
    label: str
    race: Optional[Race] = None  # for "missing": the race that lacks it


@dataclass(frozen=True)
class LocatedRace:
    """A race report and the trace indices of its two accesses (None if not found)."""

    race: Race
    first: Optional[int]
    second: Optional[int]


@dataclass(frozen=True)
class Model:
    """A run's timeline. build_model makes it whole: every slice and delay is on one of
    `lanes`, every edge joins two slices, every note sits on a slice, and a located race's
    indices are slices where they are not None, so the views draw it without checks."""

    lanes: tuple
    slices: Mapping  # trace index -> Slice
    edges: tuple
    races: tuple  # LocatedRace
    notes: tuple  # (trace index, text): no-op waits and the like
    clock: str  # STEPS, MICROSECONDS or ISSUE_ORDER
    backend: str
    schedule: str
    delays: tuple = ()  # Slice, category "delay": spins injected before the slice of that index

    def lane(self, key: tuple) -> Lane:
        for lane in self.lanes:
            if lane.key == key:
                return lane
        raise KeyError(key)

    def race_roles(self) -> dict:
        """trace index -> list of (LocatedRace, "first" | "second")."""
        roles: dict = {}
        for located in self.races:
            for role in ("first", "second"):
                index = getattr(located, role)
                if index is not None:
                    roles.setdefault(index, []).append((located, role))
        return roles

    def struck(self, located: LocatedRace) -> Optional[bool]:
        """Whether this run's timing let the race strike: the second access started
        before the first one ended. None when either side is not on the timeline, or is
        captured work without times (it ran at the graph's launches, not where it is drawn)."""
        first = self.slices.get(located.first)
        second = self.slices.get(located.second)
        if first is None or second is None:
            return None
        if any(s.category == "captured" and not s.measured for s in (first, second)):
            return None
        return second.start < first.end


_MIN_WIDTH = 0.1  # of the nominal width: every slice gets a body a flow can bind to


# --- building it ----------------------------------------------------------------------------

def _parts(source) -> tuple:
    """(ops, races or None, op_times, clock or None, backend name, schedule text, delays,
    node_times: (graph launch index, node index) -> (start, end), where the backend times them)."""
    if isinstance(source, Mapping):
        ops = source["trace"]
        races = source.get("races")
        op_times = source.get("op_times") or {}
        return (list(ops), races, op_times, source.get("clock"), str(source.get("backend", "")),
                str(source.get("schedule", "") or ""), tuple(source.get("delays", ())),
                source.get("node_times") or {})
    if isinstance(source, (T.Trace, list, tuple)):
        return list(source), None, {}, None, "", "", (), {}
    ops = getattr(source, "trace", None)
    if ops is None:
        raise TypeError(f"export: expected a Device, a Trace or a mapping with 'trace', got "
                        f"{type(source).__name__}")
    backend = getattr(source, "backend", None)
    op_times = getattr(backend, "op_times", None) or {}
    # A device run without checking has no races yet; the replay below finds them.
    races = source.races if getattr(source, "checker", None) is not None else None
    schedule = getattr(source, "schedule", None)
    return (list(ops), races, op_times, None, getattr(backend, "name", "") or "",
            str(schedule) if schedule is not None else "", tuple(getattr(backend, "delays", ()) or ()),
            getattr(backend, "node_times", None) or {})


def _stream_lane_label(op: T.StreamCreate) -> str:
    kind = T.StreamKind.parse(op.kind)
    if kind is T.StreamKind.LEGACY:
        return "legacy default stream"
    if kind is T.StreamKind.PER_THREAD:
        return f"per-thread default stream (thread {op.thread})"
    name = op.name or f"stream{op.stream}"
    return f"stream {name} ({kind.value})"


def _replay(ops, races) -> tuple:
    """Feed a fresh checker: its races, stream labels as reports name them, and for each
    race (by key) the trace indices where it was reported -- its second accesses.
    With `races` known, only operations at their second access's call site are checked."""
    checker = Checker()
    seconds: dict = {}
    seen: dict = {}
    captured: dict = {}  # trace index -> graph id, for work captured into a graph
    watch = None if races is None else {race.second.site for race in races}
    try:
        for index, op in enumerate(ops):
            stream = getattr(op, "stream", None)
            graph = checker.capturing(stream) if isinstance(op, _STREAM_OPS) else None
            checker.feed(op)
            if isinstance(op, _STREAM_OPS):
                graph = checker.capturing(stream) if graph is None else graph  # a fork joins after its wait
                if graph is not None:
                    captured[index] = graph
            if isinstance(op, _ACCESS_OPS) and (watch is None or op.site in watch):
                for race in checker.races:
                    if race.count > seen.get(race.key, 0):
                        seen[race.key] = race.count
                        seconds.setdefault(race.key, []).append(index)
    except TraceError:
        pass  # a malformed trace: locate what we can by call site below
    labels = {}
    for op in ops:
        if isinstance(op, T.StreamCreate):
            try:
                labels[checker.stream_label(op.stream)] = op.stream
            except KeyError:
                pass
    graphs = {g: checker.captured_graph(g) for g in set(captured.values())}
    return checker.races, labels, seconds, captured, {g: graph for g, graph in graphs.items() if graph is not None}


def _graph_times(ops, captured: dict, graphs: dict, node_times: Mapping, op_times: Mapping, races) -> dict:
    """trace index -> (start, end) for captured work, taken from one launch of its graph
    (the sim times each node of each launch): the first launch in which a race between
    two of its nodes struck, else its first launch. Captured records and waits, which
    do no work, are put where that launch reached them."""
    index_of = {id(ops[i]): i for i in captured}
    pairs = [(race.first.site, race.second.site) for race in races]
    times: dict = {}
    for graph_id, graph in graphs.items():
        launches = []
        for launch, op in enumerate(ops):
            if isinstance(op, T.GraphLaunch) and op.graph == graph_id:
                timed = {index_of[id(node.op)]: node_times[(launch, node.index)] for node in graph.nodes
                         if (launch, node.index) in node_times and id(node.op) in index_of}
                if timed:
                    launches.append((op_times.get(launch, (min(t[0] for t in timed.values()),))[0], timed))
        if not launches:
            continue

        def strikes(timed: dict) -> bool:
            at = {ops[i].site: t for i, t in timed.items()}
            return any(a in at and b in at and at[b][0] < at[a][1] for a, b in pairs)

        start, timed = next((launch for launch in launches if strikes(launch[1])), launches[0])
        reached: dict = {}  # stream -> where the launch got to on it
        recorded: dict = {}  # event -> when its captured record was reached
        for index in sorted(i for i, g in captured.items() if g == graph_id):
            op = ops[index]
            if index in timed:
                reached[op.stream] = timed[index][1]
                continue
            at = reached.get(op.stream, start)
            if isinstance(op, T.StreamWait):
                at = max(at, recorded.get(op.event, start))
            elif isinstance(op, T.EventRecord):
                recorded[op.event] = at
            reached[op.stream] = at
            timed[index] = (at, at)
        times.update(timed)
    return times


def _op_name(op) -> str:
    if isinstance(op, T.Free):
        return "free"
    return getattr(op, "name", type(op).__name__)


def _lane_of(op, graph: Optional[int] = None) -> tuple:
    """Where an operation is drawn: its stream, or its host thread (syncs block the host).
    Work captured into graph `graph` gets a lane of its own: it runs at the graph's
    launches, so it does not take a place in its stream's order."""
    stream = getattr(op, "stream", None)
    if stream is None or isinstance(op, _HOST_OPS):
        return ("host", op.thread)
    if graph is not None:
        return ("graph", graph, stream)
    return ("stream", stream)


def _actor(op, stream_labels: dict) -> Optional[str]:
    stream = getattr(op, "stream", None)
    if stream is None:  # host access or host-side free
        return f"host thread {op.thread}"
    for label, sid in stream_labels.items():
        if sid == stream:
            return label
    return None


def _touches(op, buffer_ids: set, start: int, stop: int, write: bool) -> bool:
    """Whether `op` reads (or writes) bytes [start, stop) of one of `buffer_ids`."""
    if isinstance(op, T.Free):
        return op.buffer in buffer_ids
    ranges = op.writes if write else op.reads
    return any(r.buffer in buffer_ids and r.start < stop and start < r.stop for r in ranges)


_SHOWN_INSTANCES = 256  # a race seen more often is looked for among its first ones and its last


def _locate(ops, race: Race, seconds: dict, stream_labels: dict, buffer_ids: dict, struck) -> LocatedRace:
    """The pair of trace indices to show for `race`: the first instance that struck
    (the consumer started before the producer ended), else the last one seen -- on a GPU
    the first is often the cold one, slowed by lazy loading and first calls."""
    ids = buffer_ids.get(race.buffer, set())

    def matches(op, access, start=0, stop=math.inf) -> bool:
        return (isinstance(op, _ACCESS_OPS) and op.site == access.site and _op_name(op) == access.name
                and _actor(op, stream_labels) == access.actor and _touches(op, ids, start, stop, access.write))

    def producer(second: int) -> Optional[int]:
        # The latest matching access issued before the second is the one it raced with.
        for start, stop in ((race.start, race.stop), (0, math.inf)):
            found = next((i for i in range(second - 1, -1, -1) if matches(ops[i], race.first, start, stop)), None)
            if found is not None:
                return found
        return None

    candidates = [i for i in seconds.get(race.key, ()) if matches(ops[i], race.second)]
    if len(candidates) > _SHOWN_INSTANCES:
        candidates = candidates[:_SHOWN_INSTANCES] + candidates[-1:]
    if not candidates:  # not found by replay: the last access at the second's call site
        last = next((i for i in range(len(ops) - 1, -1, -1) if matches(ops[i], race.second)), None)
        candidates = [last] if last is not None else []
    pairs = [(producer(second), second) for second in candidates]
    found = [(first, second) for first, second in pairs if first is not None]
    if not found:
        return LocatedRace(race, None, candidates[-1] if candidates else None)
    first, second = next((pair for pair in found if struck(*pair)), found[-1])
    return LocatedRace(race, first, second)


def _ranges(ranges, buffer_names: dict) -> tuple:
    return tuple((buffer_names.get(r.buffer, f"buffer{r.buffer}"), r.start, r.stop) for r in ranges if r is not None)


def _describe(op, event_names: dict, stream_names: dict, graph: Optional[int] = None) -> tuple:
    """(name, category) of a drawn operation; `graph`: the graph it was captured into."""
    if graph is not None:
        name, _ = _describe(op, event_names, stream_names)
        return f"{name} [graph {graph}]", "captured"
    if isinstance(op, T.GraphLaunch):
        return f"launch graph {op.graph}", "graph"
    if isinstance(op, T.Launch):
        return op.name, "kernel"
    if isinstance(op, T.Copy):
        return op.name, "copy"
    if isinstance(op, T.EventRecord):
        return f"record {event_names.get(op.event, op.event)}", "record"
    if isinstance(op, T.StreamWait):
        return f"wait {event_names.get(op.event, op.event)}", "wait"
    if isinstance(op, T.Free):
        return "free", "free"
    if isinstance(op, T.StreamSync):
        return f"synchronize {stream_names.get(op.stream, op.stream)}", "sync"
    if isinstance(op, T.EventSync):
        return f"synchronize {event_names.get(op.event, op.event)}", "sync"
    if isinstance(op, T.DeviceSync):
        return "device synchronize", "sync"
    if isinstance(op, T.ImplicitSync):
        return f"implicit: {op.reason}" if op.reason else "implicit sync", "host"
    return _op_name(op), "host"


def build_model(source) -> Model:
    """The timeline model of a run: a Device, a Trace, or a mapping with keys `trace`
    and optionally `races`, `op_times`, `clock` ("steps" | "us"), `backend`, `schedule`,
    `delays` ((trace index, stream name, µs) of spins a GPU backend injected)."""
    ops, races, op_times, clock, backend, schedule, delays, node_times = _parts(source)
    replay_races, stream_labels, seconds, captured, graphs = _replay(ops, races)
    if races is None:
        races = replay_races
    if node_times and captured:
        # Captured work ran at its graph's launches: draw it where one launch ran it.
        op_times = {**op_times, **_graph_times(ops, captured, graphs, node_times, op_times, races)}
    if clock is None:
        clock = STEPS if backend == "sim" else (MICROSECONDS if op_times else ISSUE_ORDER)
    if clock not in (STEPS, MICROSECONDS, ISSUE_ORDER):
        raise ValueError(f"export: clock must be {STEPS!r}, {MICROSECONDS!r} or {ISSUE_ORDER!r}, got {clock!r}")

    buffer_names, buffer_ids, event_names, stream_names, lane_labels = {}, {}, {}, {}, {}
    nbytes = {}
    for op in ops:
        if isinstance(op, T.Alloc):
            name = op.name or f"buffer{op.buffer}"
            buffer_names[op.buffer] = name
            buffer_ids.setdefault(name, set()).add(op.buffer)
            nbytes[op.buffer] = op.nbytes
        elif isinstance(op, T.EventCreate):
            event_names[op.event] = op.name or f"event{op.event}"
        elif isinstance(op, T.StreamCreate):
            lane_labels[("stream", op.stream)] = _stream_lane_label(op)
            stream_names[op.stream] = _stream_lane_label(op).split(" (")[0]  # without the kind

    drawn = [i for i, op in enumerate(ops)
             if isinstance(op, _STREAM_OPS + _HOST_OPS) or isinstance(op, (T.Free, T.GraphLaunch))]
    slices = _place(ops, drawn, op_times, clock, captured)

    out: dict = {}
    for index, (start, end, measured) in slices.items():
        op = ops[index]
        lane = _lane_of(op, captured.get(index))
        name, category = _describe(op, event_names, stream_names, captured.get(index))
        reads = _ranges(getattr(op, "reads", ()), buffer_names)
        writes = _ranges(getattr(op, "writes", ()), buffer_names)
        if isinstance(op, T.Free):
            writes = ((buffer_names.get(op.buffer, f"buffer{op.buffer}"), 0, nbytes.get(op.buffer, 0)),)
        out[index] = Slice(index, lane, name, category, start, end, measured, op.site, reads, writes)

    edges, notes = _edges(ops, out, event_names)

    def struck(first: int, second: int) -> bool:
        return (first in out and second in out and out[second].start < out[first].end
                and all(out[i].measured for i in (first, second) if i in captured))

    located = tuple(_locate(ops, race, seconds, stream_labels, buffer_ids, struck) for race in races)
    for loc in located:
        if loc.first is not None and loc.second is not None:
            edges.append(Edge(loc.first, loc.second, "missing", missing_label(loc.race), loc.race))

    used = {s.lane for s in out.values()}
    hosts = sorted(k for k in used if k[0] == "host")
    streams = [k for k in lane_labels if k in used]  # creation order
    streams += sorted(k for k in used if k[0] == "stream" and k not in lane_labels)
    for key in sorted(k for k in used if k[0] == "graph"):
        streams.append(key)
        lane_labels[key] = f"graph {key[1]} on {lane_labels.get(('stream', key[2]), f'stream{key[2]}')}"
    lanes = tuple([Lane(k, f"host thread {k[1]}") for k in hosts]
                  + [Lane(k, lane_labels.get(k, f"stream{k[1]}")) for k in streams])
    return Model(lanes, out, tuple(edges), located, tuple(notes), clock, backend, schedule,
                 _delay_slices(delays, out, clock))


RACE_CONTEXT = 12  # operations shown before and after each racing access (around_races)


def around_races(model: Model, context: int = RACE_CONTEXT) -> Model:
    """The part of `model` around its racing pairs: each located access and the `context`
    operations that start just before and just after it (on any lane), with the edges, notes,
    delays and lanes among them. A whole program's run is far too long to draw, and what a user
    must see is the two accesses and where the wait belongs. Without a located race: `model`."""
    order = sorted(model.slices.values(), key=lambda s: (s.start, s.index))
    position = {s.index: n for n, s in enumerate(order)}
    spans = []
    for located in model.races:
        for index in (located.first, located.second):
            if index is None:
                continue
            n = position[index]
            low, high = order[max(n - context, 0)], order[min(n + context, len(order) - 1)]
            spans.append((low.start, max(high.end, model.slices[index].end)))
    if not spans:
        return model
    kept = {i: s for i, s in model.slices.items() if any(s.start <= b and s.end >= a for a, b in spans)}
    used = {s.lane for s in kept.values()}
    return replace(model, lanes=tuple(lane for lane in model.lanes if lane.key in used), slices=kept,
                   edges=tuple(e for e in model.edges if e.src in kept and e.dst in kept),
                   notes=tuple(note for note in model.notes if note[0] in kept),
                   delays=tuple(d for d in model.delays if d.index in kept))


def _delay_slices(delays, slices: dict, clock: str) -> tuple:
    """Spins a GPU backend injected, as slices ending where the delayed operation
    starts (its start event is recorded after the spin): they show why a stream ran
    late. The sim's delays hold work back without taking time, so it has none."""
    if clock != MICROSECONDS or not delays:
        return ()
    before: dict = {}  # lane -> sorted (trace index, end) of its slices
    for index in sorted(slices):
        before.setdefault(slices[index].lane, []).append((index, slices[index].end))
    out = []
    for index, _stream, us in delays:
        s = slices.get(index)
        if s is None or s.lane[0] != "stream" or not us > 0:
            continue
        lane = before[s.lane]
        previous = bisect.bisect_left(lane, (index, -math.inf)) - 1
        floor = lane[previous][1] if previous >= 0 else 0.0
        start = max(s.start - us, floor, 0.0)
        if start < s.start:
            out.append(Slice(index, s.lane, f"injected delay {us:g} µs", "delay", start, s.start, False, s.site))
    return tuple(out)


def missing_label(race: Race) -> str:
    """What a race lacks, in words: the wait, sync or ordering that would have prevented it."""
    if race.second.actor.startswith("host thread"):
        return (f"missing sync: {race.second.actor} must synchronize with {race.first.actor} "
                f"after `{race.first.name}`")
    if race.first.actor.startswith("host thread"):
        return f"missing ordering: {race.second.actor} after {race.first.actor}'s `{race.first.name}`"
    return f"missing wait: {race.second.actor} must wait for {race.first.actor} after `{race.first.name}`"


def _place(ops, drawn: list, op_times: Mapping, clock: str, captured: Mapping) -> dict:
    """trace index -> (start, end, measured) for every drawn operation; `captured`: trace
    index -> graph id of work captured into a graph (drawn on that graph's lanes)."""
    known = {}
    for index in drawn:
        times = op_times.get(index)
        if times is not None:
            start, end = float(times[0]), float(times[1])
            known[index] = (start, max(end, start))
    if clock == ISSUE_ORDER or not known:
        # Nothing timed: one unit per operation, each lane in issue order.
        return {index: (float(k), float(k) + 1.0, False) for k, index in enumerate(drawn)}
    origin = min(s for s, _ in known.values())
    known = {i: (s - origin, e - origin) for i, (s, e) in known.items()}
    # A nominal width for what has no time: visible, and short next to real work.
    durations = sorted(e - s for s, e in known.values() if e > s) or [1.0]
    nominal = 0.5 if clock == STEPS else 0.25 * durations[len(durations) // 2]

    # An operation was issued before any operation issued after it started.
    later_start = [math.inf] * (len(ops) + 1)
    for index in range(len(ops) - 1, -1, -1):
        own = known[index][0] if index in known else math.inf
        later_start[index] = min(own, later_start[index + 1])

    # Untimed work must fit before the next timed work: on its own stream (stream
    # order), or for host calls before any timed work (the host issued that later).
    # room: index -> (that bound, how many untimed operations share the gap).
    room: dict = {}
    stream_ahead: dict = {}  # lane -> (next timed start, untimed count), scanning backwards
    host_ahead: dict = {}  # host lane -> untimed count since the next timed operation
    for index in reversed(drawn):
        lane = _lane_of(ops[index], captured.get(index))
        if index in known:
            stream_ahead[lane] = (known[index][0], 0)
            host_ahead = {}
        elif lane[0] != "host":  # a stream, or a graph's lane: ordered on the lane
            high, waiting = stream_ahead.get(lane, (math.inf, 0))
            stream_ahead[lane] = room[index] = (high, waiting + 1)
        else:
            host_ahead[lane] = host_ahead.get(lane, 0) + 1
            room[index] = (later_start[index], host_ahead[lane])

    placed = {}
    lane_end: dict = {}  # lane -> end of its last placed slice
    last_record: dict = {}  # event -> trace index of its latest record
    issued = 0.0  # estimated host issue time of the latest operation
    drawn_set = set(drawn)
    for index, op in enumerate(ops):
        if index in known:
            issued = max(issued, later_start[index])  # issued before it, or later work, started
        if index not in drawn_set:
            continue
        lane = _lane_of(op, captured.get(index))
        if index in known:
            start, end = known[index]
            # Slices on one track must not overlap (Perfetto nests them); event timing
            # can be off by a little, so keep stream order.
            start = max(start, lane_end.get(lane, start))
            placed[index] = (start, max(end, start + _MIN_WIDTH * nominal), True)
        else:
            floor = lane_end.get(lane, 0.0)
            if isinstance(op, T.StreamWait) and op.event in last_record:
                floor = max(floor, placed[last_record[op.event]][1])  # it completes after its record
            low = floor if lane[0] != "host" else max(floor, issued)
            high, waiting = room[index]
            width = nominal if high == math.inf else min(nominal, (high - low) / waiting)
            if width <= 0:
                width = _MIN_WIDTH * nominal  # timed work leaves no gap: overlap a little
            # As early as issue order allows, leaving room for the rest of the gap.
            start = max(floor, min(max(issued, low), high - width * waiting))
            end = start + width
            if isinstance(op, _SYNC_OPS):
                # The host returns when the awaited work is done.
                end = max(end, _completion(op, lane_end, placed, last_record))
            placed[index] = (start, end, False)
            if lane[0] == "host":
                issued = max(issued, end)  # the host issues nothing while it is busy here
        if isinstance(op, T.EventRecord):
            last_record[op.event] = index
        lane_end[lane] = max(lane_end.get(lane, 0.0), placed[index][1])
    return placed


def _completion(op, lane_end: dict, placed: dict, last_record: dict) -> float:
    if isinstance(op, T.StreamSync):
        return lane_end.get(("stream", op.stream), 0.0)
    if isinstance(op, T.EventSync):
        record = last_record.get(op.event)
        return placed[record][1] if record is not None else 0.0  # never recorded: returns at once
    return max((end for key, end in lane_end.items() if key[0] == "stream"), default=0.0)


def _edges(ops, slices: dict, event_names: dict) -> tuple:
    """record -> wait and work -> host sync edges, and notes on no-op waits."""
    edges, notes = [], []
    last_record: dict = {}
    last_on_stream: dict = {}
    for index, op in enumerate(ops):
        if isinstance(op, T.EventRecord):
            last_record[op.event] = index
        elif isinstance(op, T.StreamWait):
            record = last_record.get(op.event)
            name = event_names.get(op.event, op.event)
            if record is None:
                # CUDA: waiting on a never-recorded event does nothing.
                notes.append((index, f"no-op wait: event `{name}` was never recorded"))
            elif index in slices:
                edges.append(Edge(record, index, "event", f"event {name}"))
        elif isinstance(op, T.StreamSync):
            src = last_on_stream.get(op.stream)
            if src is not None:
                edges.append(Edge(src, index, "sync", "sync"))
        elif isinstance(op, T.EventSync):
            record = last_record.get(op.event)
            if record is not None:
                edges.append(Edge(record, index, "sync", "sync"))
        elif isinstance(op, T.DeviceSync):
            for src in last_on_stream.values():
                edges.append(Edge(src, index, "sync", "sync"))
            last_on_stream = {}  # later device syncs only need the work issued after this one
            continue
        if index in slices and slices[index].lane[0] == "stream":  # captured work is not synced here
            last_on_stream[slices[index].lane[1]] = index
    return edges, notes
