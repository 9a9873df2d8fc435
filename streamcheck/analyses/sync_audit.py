"""The sync audit: every synchronization of a recorded run, what each one is for, and a minimal
sufficient set of them.

A synchronization is named by what the user wrote: its kind, its call site, and the streams and
events it names (by name, so the same line in a decode loop is one synchronization seen once
per step). Removing one removes every occurrence, as deleting the line would; the audit re-checks
the recorded trace with it removed (core.hb's checker, nothing else):

- necessary: removing it alone makes a race (named) or a capture CUDA refuses;
- redundant: removing it alone makes none, either because earlier edges already ordered what it
  waits for (implied, named) or because nothing after it touches the bytes it orders;
- device-side suffices: a host synchronize whose races, once removed, are all between streams:
  an event recorded on the producer's stream and a wait on the consumer's replaces it, so the
  host keeps issuing;
- host needed: the host itself reads, writes or frees bytes the device touched;
- timing-dependent: a query that returned done. It ordered because it happened to say done
  (the program's branch or loop depended on timing), so it is never offered for removal.

The minimal set is built greedily and re-checked as a whole, since two syncs each redundant alone
may be needed together. Removing edges can only unorder access pairs, never order them, so a
sync that was necessary alone stays necessary once others are gone: the greedy pass tries only
the others, and every sync it keeps is needed given the rest (no one can be dropped).

The audit speaks for the recorded run: these inputs, this control flow, this thread
interleaving. Implicit synchronizations CUDA does not promise (core.trace.ImplicitSync: pool
growth, lazy loading, pageable copies) are listed, never relied on.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from typing import Optional

from ..core import trace as T
from ..core.hb import Checker, Race, site_path, wrap_lines
from ..core.trace import CallSite, StreamKind, stream_label

SYNC_OPS = (T.StreamWait, T.StreamSync, T.EventSync, T.DeviceSync, T.StreamQuery, T.EventQuery)
WORK_OPS = (T.Launch, T.Copy, T.EventRecord, T.StreamWait, T.GraphLaunch)


class Verdict(str, enum.Enum):
    NECESSARY = "necessary"
    REDUNDANT = "redundant"
    DEVICE_SIDE = "device-side suffices"
    HOST_NEEDED = "host needed"
    TIMING = "timing-dependent"


@dataclass(frozen=True)
class Sync:
    """One synchronization as the user wrote it, folded over its occurrences."""

    key: tuple
    kind: str  # wait_event, stream synchronize, event synchronize, device synchronize, host read, query, legacy join
    site: CallSite
    what: str  # "stream B waits on event `e` (recorded on stream A)"
    host_blocking: bool
    indexes: tuple  # trace indexes of its occurrences (a legacy join: its stream's StreamCreate)
    captured: bool = False  # an edge inside a graph capture

    @property
    def count(self) -> int:
        return len(self.indexes)


@dataclass(frozen=True)
class Replacement:
    """A device-side wait that replaces a host synchronize: record an event on `record_on` after
    `after`, and make `wait_on` wait on it before `before` (`event`: an existing event to wait on)."""

    record_on: str
    after: str
    wait_on: str
    before: str
    event: str = ""

    def describe(self) -> str:
        if self.event:
            return f"make {self.wait_on} wait on event `{self.event}` (stream.wait_event) before {self.before}"
        return (f"record an event on {self.record_on} after {self.after} and make {self.wait_on} wait on it "
                f"(stream.wait_event) before {self.before}")


@dataclass(frozen=True)
class Finding:
    number: int
    sync: Sync
    verdict: Verdict
    reason: str
    prevents: tuple = ()  # the races removing it alone makes
    replacement: tuple = ()  # Replacements (device-side suffices)
    host_bytes: tuple = ()  # what the host touches (host needed)
    gain: str = ""  # a replaced host synchronize: how far the host gets ahead before it blocks again

    def to_dict(self, root: Optional[str] = None) -> dict:
        return {"number": self.number, "kind": self.sync.kind, "site": site_path(self.sync.site, root),
                "what": self.sync.what, "count": self.sync.count, "host_blocking": self.sync.host_blocking,
                "captured": self.sync.captured, "verdict": self.verdict.value, "reason": self.reason,
                "prevents": [r.to_dict(root) for r in self.prevents],
                "replacement": [r.describe() for r in self.replacement], "host_bytes": list(self.host_bytes),
                "gain": self.gain}


@dataclass(frozen=True)
class Audit:
    findings: tuple
    keep: tuple  # numbers of the minimal set's syncs kept as they are
    replaced: tuple  # numbers of host syncs the minimal set turns into device-side waits
    removed: tuple  # numbers of syncs the minimal set drops
    races: tuple = ()  # the recorded run's own races: they come first
    implicit: tuple = ()  # ImplicitSync reasons with counts: (reason, count)
    checks: int = 0  # how many times the trace was re-checked
    plan: tuple = ((), ())  # the minimal set as edits: (keys removed, (key, _Swap) pairs)

    def apply(self, ops, drop=()) -> list:
        """`ops` as the minimal set edits them (removed syncs gone, replaced host syncs swapped for
        their device-side waits); `drop`: finding numbers removed on top, to check each is needed."""
        remove = set(self.plan[0]) | {self.findings[n - 1].sync.key for n in drop}
        swap = {key: plan for key, plan in self.plan[1] if key not in remove}
        return edit(ops, remove=remove, swap=swap)

    def edits(self, only=None) -> SyncEdits:
        """The minimal set as a rerun applies it; `only`: a finding number, that sync alone removed."""
        if only is not None:
            return SyncEdits({self.findings[only - 1].sync.key})
        return SyncEdits(self.plan[0], dict(self.plan[1]))

    @property
    def needed(self) -> int:
        return len(self.keep) + len(self.replaced)

    def summary(self) -> str:
        total = len(self.findings)
        if not total:
            return "no synchronization in this run"
        text = f"{self.needed} of {total} synchronization{'s are' if total != 1 else ' is'} needed"
        if self.replaced:
            n = len(self.replaced)
            text += f" ({n} as {'a device-side wait' if n == 1 else 'device-side waits'} instead of a host synchronize)"
        if self.removed:
            text += f"; removable: {', '.join(f'#{n}' for n in self.removed)}"
        return text

    def format(self, width: Optional[int] = None) -> str:
        """The table a user reads in ten seconds, then each sync's reason."""
        lines = ["streamcheck sync audit (this run: these inputs, this control flow)"]
        if self.races:
            lines.append(f"  note: the run has {len(self.races)} race{'s' if len(self.races) != 1 else ''} already; "
                         "fix those first (the audit judges the syncs that are there)")
        if not self.findings:
            lines.append("  no synchronization in this run: nothing orders its streams but stream order")
        else:
            rows = [("#", "verdict", "kind", "site", "seen", "what")]
            for f in self.findings:
                rows.append((str(f.number), f.verdict.value, f.sync.kind, str(f.sync.site), f"{f.sync.count}x",
                             f.sync.what))
            widths = [max(len(row[i]) for row in rows) for i in range(5)]
            for row in rows:
                lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5])
            lines.append("")
            for f in self.findings:
                lines.append(f"  #{f.number} {f.verdict.value}: {f.reason}")
                for race in f.prevents[:3]:
                    lines.append(f"      prevents {_race_line(race)}")
                if len(f.prevents) > 3:
                    lines.append(f"      (+{len(f.prevents) - 3} more)")
                for rep in f.replacement:
                    lines.append(f"      replace with: {rep.describe()}")
                for what in f.host_bytes:
                    lines.append(f"      the host {what}")
                if f.gain:
                    lines.append(f"      gain: {f.gain}")
            lines.append("")
            lines.append(f"  minimal sufficient set: {self.summary()}")
            if self.keep:
                lines.append(f"    keep: {', '.join(f'#{n}' for n in self.keep)}")
            if self.replaced:
                lines.append(f"    replace by device-side waits: {', '.join(f'#{n}' for n in self.replaced)}")
        for reason, count in self.implicit:
            lines.append(f"  implicit (CUDA promises no ordering, not counted): {reason} ({count}x)")
        return wrap_lines("\n".join(lines), width)

    def to_dict(self, root: Optional[str] = None) -> dict:
        return {"summary": self.summary(), "needed": self.needed, "total": len(self.findings),
                "keep": list(self.keep), "replaced": list(self.replaced), "removed": list(self.removed),
                "races_first": len(self.races), "findings": [f.to_dict(root) for f in self.findings],
                "implicit": [{"reason": r, "count": c} for r, c in self.implicit]}


def _race_line(race: Race) -> str:
    return (f"{race.kind} on `{race.buffer}` bytes [{race.start}, {race.stop}): {race.first.actor} `{race.first.name}` "
            f"({race.first.site}) then {race.second.actor} `{race.second.name}` ({race.second.site})")


# --- finding the synchronizations ----------------------------------------------------------

class _Names:
    """Stream labels, event names and the stream each event was last recorded on, as the trace
    goes: the sync keys name streams and events the way reports do."""

    def __init__(self):
        self.streams: dict = {}  # id -> (label, kind, device)
        self.events: dict = {}  # id -> name
        self.recorded_on: dict = {}  # event id -> stream id of its latest record
        self.buffers: dict = {}  # buffer id -> name

    def see(self, op) -> None:
        kind = type(op)
        if kind is T.StreamCreate:
            skind = StreamKind.parse(op.kind)
            self.streams[op.stream] = (stream_label(skind, op.name, op.stream, op.thread), skind, op.device)
        elif kind is T.EventCreate:
            self.events[op.event] = op.name or f"event{op.event}"
        elif kind is T.EventRecord:
            self.recorded_on[op.event] = op.stream
        elif kind is T.Alloc:
            self.buffers[op.buffer] = op.name or f"buffer{op.buffer}"

    def stream(self, sid) -> str:
        return self.streams.get(sid, (f"stream{sid}",))[0]

    def event(self, eid) -> str:
        return self.events.get(eid, f"event{eid}")


def sync_key(op, names: _Names) -> Optional[tuple]:
    """The synchronization `op` is an occurrence of, or None (not one: a query that said not-done)."""
    site = op.site
    base = (site.file, site.line, site.function)
    kind = type(op)
    if kind is T.StreamWait:
        # By the stream the event was recorded on, not the event: a loop that records a fresh
        # event each step (stream.record()) still waits at one line for one stream.
        src = names.recorded_on.get(op.event)
        return ("wait_event",) + base + (names.stream(op.stream), names.stream(src) if src is not None else "")
    if kind is T.StreamSync:
        return ("host read" if op.cause else "stream synchronize",) + base + (names.stream(op.stream), op.cause)
    if kind is T.EventSync:
        return ("event synchronize",) + base + (names.event(op.event), op.cause)
    if kind is T.DeviceSync:
        return ("device synchronize",) + base + (f"cuda:{op.device}", op.cause)
    if kind is T.StreamQuery and op.done:
        return ("query",) + base + (names.stream(op.stream), "")
    if kind is T.EventQuery and op.done:
        src = names.recorded_on.get(op.event)  # as a wait: a fresh event each step is one poll
        return ("query",) + base + (names.stream(src) if src is not None else names.event(op.event), "event")
    return None


def legacy_join_key(op) -> tuple:
    """The implicit legacy-stream join of the blocking stream `op` (a StreamCreate) creates."""
    label = stream_label(StreamKind.parse(op.kind), op.name, op.stream, op.thread)
    return ("legacy join", op.site.file, op.site.line, op.site.function, label, "")


def _describe(op, names: _Names) -> str:
    kind = type(op)
    if kind is T.StreamWait:
        src = names.recorded_on.get(op.event)
        on = f" (recorded on {names.stream(src)})" if src is not None else " (never recorded: a no-op)"
        return f"{names.stream(op.stream)} waits on event `{names.event(op.event)}`{on}"
    if kind is T.StreamSync:
        how = f" ({op.cause})" if op.cause else ""
        return f"the host synchronizes {names.stream(op.stream)}{how}"
    if kind is T.EventSync:
        return f"the host synchronizes event `{names.event(op.event)}`"
    if kind is T.DeviceSync:
        return f"the host synchronizes cuda:{op.device}"
    if kind is T.StreamQuery:
        return f"the host polled {names.stream(op.stream)} until query() returned done"
    return f"the host polled event `{names.event(op.event)}` until query() returned done"


def find_syncs(ops) -> list:
    """Every synchronization of a trace, in order of first occurrence, with the implicit joins of
    blocking streams with the legacy default stream (one per such stream that has work while its
    device's legacy stream has work too)."""
    names = _Names()
    found: dict = {}  # key -> [first op, description, indexes, captured]
    busy: set = set()  # stream ids that got work
    capturing: set = set()  # graphs being captured
    member: dict = {}  # stream id -> graph it captures into (approximate: origin and forks by wait)
    for index, op in enumerate(ops):
        names.see(op)
        kind = type(op)
        if kind is T.CaptureBegin:
            capturing.add(op.graph)
            member[op.stream] = op.graph
        elif kind is T.CaptureEnd:
            capturing.discard(op.graph)
            member = {s: g for s, g in member.items() if g != op.graph}
        if kind in WORK_OPS:
            busy.add(op.stream)
        if kind is T.StreamWait and names.recorded_on.get(op.event) in member:
            member[op.stream] = member[names.recorded_on[op.event]]  # a fork into the capture
        if kind not in SYNC_OPS:
            continue
        key = sync_key(op, names)
        if key is None:
            continue
        entry = found.get(key)
        if entry is None:
            entry = found[key] = [op, _describe(op, names), [], False]
        entry[2].append(index)
        if kind is T.StreamWait and op.stream in member:
            entry[3] = True
    syncs = []
    for key, (op, what, indexes, captured) in found.items():
        host = type(op) is not T.StreamWait
        kind = key[0]
        syncs.append((indexes[0], Sync(key, kind, op.site, what + (" (inside a graph capture)" if captured else ""),
                                       host, tuple(indexes), captured)))
    legacy_busy = {names.streams[s][2] for s in busy if s in names.streams and names.streams[s][1] is StreamKind.LEGACY}
    for index, op in enumerate(ops):
        if type(op) is T.StreamCreate and op.stream in busy:
            label, skind, device = names.streams[op.stream]
            if skind.joins_legacy and device in legacy_busy:
                key = legacy_join_key(op)
                what = (f"{label} ({skind.value}) and the legacy default stream join implicitly (CUDA's legacy "
                        "stream semantics)")
                syncs.append((index, Sync(key, "legacy join", op.site, what, False, (index,))))
    syncs.sort(key=lambda pair: pair[0])
    return [sync for _, sync in syncs]


# --- editing and re-checking the trace -----------------------------------------------------

@dataclass(frozen=True)
class _Swap:
    """What replaces one host synchronize's occurrences: events to record, waits to issue."""

    records: tuple  # stream ids to record a fresh event on (one event per stream)
    waits: tuple  # (stream id to wait, source stream id or None, existing event id or None)


def edit(ops, remove=frozenset(), swap=None) -> list:
    """The trace without the syncs whose keys are in `remove` (every occurrence; a legacy join:
    its stream made non-blocking), and with each host sync in `swap` (key -> _Swap) replaced by
    device-side waits at the same point of the host's issue order."""
    swap = swap or {}
    names = _Names()
    out = []
    next_event = 1 + max((op.event for op in ops if type(op) is T.EventCreate), default=0)
    fresh: dict = {}  # source stream id -> fresh event id
    creates = {op.stream: op for op in ops if type(op) is T.StreamCreate}
    hoisted: set = set()  # streams a replacement uses before the trace created them (recorded lazily)
    for op in ops:
        kind = type(op)
        if kind is T.StreamCreate and op.stream in hoisted:
            continue
        names.see(op)
        if kind is T.StreamCreate and remove and StreamKind.parse(op.kind).joins_legacy:
            if legacy_join_key(op) in remove:
                out.append(replace(op, kind=StreamKind.NON_BLOCKING))
                continue
        if kind in SYNC_OPS:
            key = sync_key(op, names)
            if key is not None and key in remove:
                continue
            plan = swap.get(key) if key is not None else None
            if plan is not None:
                for stream in set(plan.records) | {w[0] for w in plan.waits}:
                    if stream not in names.streams and stream in creates:
                        hoisted.add(stream)
                        out.append(creates[stream])
                        names.see(creates[stream])
                for stream in plan.records:
                    event = fresh.get(stream)
                    if event is None:
                        event = fresh[stream] = next_event
                        next_event += 1
                        out.append(T.EventCreate(op.thread, op.site, event=event, name=f"audit replacement {event}"))
                    out.append(T.EventRecord(op.thread, op.site, event=event, stream=stream))
                for stream, source, event in plan.waits:
                    out.append(T.StreamWait(op.thread, op.site, stream=stream,
                                            event=event if event is not None else fresh[source]))
                continue
        out.append(op)
    return out


_SKIP = _Swap((), ())  # a replacement by nothing: the sync is skipped


class SyncEdits:
    """What a proof rerun changes as the program issues its calls (Device.edit_syncs): the syncs
    whose audit keys are in `remove` are skipped, those in `swap` (key -> the audit's
    replacement) become device-side waits. `met`: the keys the rerun issued, to tell whether it
    took the recorded run's path (a program that is not deterministic is claimed nothing of)."""

    def __init__(self, remove=(), swap=None):
        self.remove = frozenset(remove)
        self.swap = dict(swap or {})
        self.met: set = set()
        self.unskipped: set = set()  # keys a recorder could not skip (a library reported the call after it ran)
        self.names = _Names()

    @property
    def every_edit_met(self) -> bool:
        """Whether the rerun issued every sync it was to skip or swap (it took the recorded path)."""
        return (self.remove | set(self.swap)) <= self.met

    def to_json(self) -> str:
        """For a rerun in another process (`streamcheck run --skip-syncs`)."""
        return json.dumps({"remove": [list(k) for k in sorted(self.remove, key=str)],
                           "swap": [[list(k), list(p.records), [list(w) for w in p.waits]]
                                    for k, p in self.swap.items()]})

    @classmethod
    def from_json(cls, text: str) -> "SyncEdits":
        try:
            data = json.loads(text)
            remove = {tuple(k) for k in data["remove"]}
            swap = {tuple(k): _Swap(tuple(records), tuple(tuple(w) for w in waits))
                    for k, records, waits in data["swap"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--skip-syncs: not a sync-audit edit list ({exc}); it is written by "
                             "`streamcheck run --audit-syncs --prove`, not by hand") from None
        return cls(remove, swap)

    def recorded_anyway(self, op) -> None:
        """A sync the program issued that the recorder saw only after it ran: if it was to be
        skipped or replaced, the rerun did not do what the proof says."""
        key = sync_key(op, self.names)
        if key is not None and (key in self.remove or key in self.swap):
            self.unskipped.add(key)

    def start(self, ops) -> None:
        for op in ops:
            self.names.see(op)

    def see(self, op) -> None:
        self.names.see(op)

    def decide(self, op) -> Optional[_Swap]:
        key = sync_key(op, self.names)
        if key is None:
            return None
        self.met.add(key)
        return _SKIP if key in self.remove else self.swap.get(key)

    def stream_create(self, op):
        """`op` itself, or made non-blocking when its implicit legacy join is removed."""
        if not StreamKind.parse(op.kind).joins_legacy:
            return op
        key = legacy_join_key(op)
        self.met.add(key)
        return replace(op, kind=StreamKind.NON_BLOCKING) if key in self.remove else op


class _Base:
    """The recorded run's own verdict, against which an edited trace's races count as new."""

    def __init__(self, ops):
        checker = _feed(ops)
        self.races = checker.races
        self.keys = {race.key for race in self.races}
        self.errors = {str(error) for error in checker.capture_errors}
        self.findings = self.keys | self.errors


def _findings(ops) -> set:
    """The race keys and capture errors of a trace (a full check)."""
    checker = _feed(ops)
    return {race.key for race in checker.races} | {str(error) for error in checker.capture_errors}


def _feed(ops, stop=None) -> Checker:
    """A checker fed `ops`; with `stop`, feeding ends as soon as stop(checker) is true."""
    checker = Checker()
    feed = checker.feed
    if stop is None:
        for op in ops:
            feed(op)
        return checker
    for op in ops:
        feed(op)
        if stop(checker):
            break
    return checker


def _new(checker: Checker, base: _Base) -> tuple:
    races = [race for race in checker.races if race.key not in base.keys]
    errors = [error for error in checker.capture_errors if str(error) not in base.errors]
    return races, errors


def _clean(ops, base: _Base) -> bool:
    """No race and no capture error beyond the recorded run's own (stops at the first new one)."""
    allowed = len(base.keys)
    allowed_errors = len(base.errors)
    checker = _feed(ops, stop=lambda c: c.distinct_races > allowed or len(c.capture_errors) > allowed_errors)
    races, errors = _new(checker, base)
    return not races and not errors


def _actor(op) -> Optional[int]:
    """The stream of an access operation, or None when the host did it."""
    if type(op) is T.HostAccess:
        return None
    return getattr(op, "stream", None)


# --- the audit -------------------------------------------------------------------------------

def audit(trace) -> Audit:
    """Audit the synchronizations of a recorded trace (a core.trace.Trace or a list of ops)."""
    ops = list(trace)
    base = _Base(ops)
    checks = 1
    syncs = find_syncs(ops)
    implied, via = _provenance(ops, syncs)
    checks += 1
    numbers = {sync.key: (number, sync) for number, sync in enumerate(syncs, 1)}
    findings = []
    swaps: dict = {}
    alone_clean: dict = {}  # key -> the races and capture errors of the run without that sync (cached)
    for number, sync in enumerate(syncs, 1):
        if sync.kind == "query":
            findings.append(Finding(number, sync, Verdict.TIMING,
                                    "it ordered the host only because it returned done; a loop or branch on "
                                    "query() depends on timing, so it is never offered for removal"))
            continue
        if sync.kind != "legacy join" and implied[sync.key] in (True, "no-op"):
            # It changed no clock at any occurrence, so the trace without it checks the same.
            findings.append(Finding(number, sync, Verdict.REDUNDANT, _why_redundant(sync, implied, via, numbers)))
            continue
        # A wait's verdict needs one new race: stop at the first (more distinct races than the
        # run's own means a new one). A host sync's needs them all: its replacement covers each.
        stop = None if sync.host_blocking else (lambda c, n=len(base.keys): c.distinct_races > n)
        checker = _feed(edit(ops, remove={sync.key}), stop=stop)
        checks += 1
        races, errors = _new(checker, base)
        if errors:
            findings.append(Finding(number, sync, Verdict.NECESSARY,
                                    f"without it CUDA refuses the capture: {errors[0]}", tuple(races)))
            continue
        if not races and sync.kind == "host read":
            # The host consumes what the read copied back into host memory, which the model does
            # not track as a device buffer: the synchronize is what makes that copy complete.
            copied = _copied_back(ops, sync)
            findings.append(Finding(number, sync, Verdict.HOST_NEEDED,
                                    f"the host reads what `{sync.key[-1]}` copied back; only this synchronize makes "
                                    "the device-to-host copy complete", host_bytes=copied))
            continue
        if not races:
            reason = _why_redundant(sync, implied, via, numbers)
            if reason is None:  # it does order something: find the sync that gives the same order later
                reason, tried = _covered_by(ops, base, sync, syncs, numbers, alone_clean)
                checks += tried
            findings.append(Finding(number, sync, Verdict.REDUNDANT, reason))
            continue
        if not sync.host_blocking:
            findings.append(Finding(number, sync, Verdict.NECESSARY,
                                    "removing it alone makes a race (the first one found)", tuple(races)))
            continue
        host = [race for race in races if _host_side(checker, race)]
        if host:
            findings.append(Finding(number, sync, Verdict.HOST_NEEDED,
                                    "the host itself touches bytes the device works on, so it must block",
                                    tuple(races), host_bytes=tuple(_host_bytes(race) for race in host)))
            continue
        plan, replacements = _swap_for(checker, sync, races, ops)
        checks += 1
        if plan is not None and _clean(edit(ops, swap={sync.key: plan}), base):
            swaps[sync.key] = plan
            findings.append(Finding(number, sync, Verdict.DEVICE_SIDE,
                                    "only streams need this ordering (the host touches none of the bytes): "
                                    "a device-side wait orders them and the host keeps issuing",
                                    tuple(races), replacement=tuple(replacements)))
        else:
            findings.append(Finding(number, sync, Verdict.NECESSARY,
                                    f"removing it alone makes {_count(races, 'race')}", tuple(races)))
    removed, swapped = set(), {}
    # Greedy, checked as a whole (each redundant alone may not be together). Latest first: of a
    # double wait, or a wait implied by an earlier one, the later one goes; then the swaps.
    # Host-blocking ones before device-side waits: a host synchronize costs the host its lead.
    order = [f for f in reversed(findings) if f.verdict is Verdict.REDUNDANT and f.sync.host_blocking]
    order += [f for f in reversed(findings) if f.verdict is Verdict.REDUNDANT and not f.sync.host_blocking]
    order += [f for f in findings if f.verdict is Verdict.DEVICE_SIDE]
    everything = ({f.sync.key for f in order if f.verdict is Verdict.REDUNDANT},
                  {f.sync.key: swaps[f.sync.key] for f in order if f.verdict is Verdict.DEVICE_SIDE})
    checks += 1
    if len(order) > 1 and _clean(edit(ops, remove=everything[0], swap=everything[1]), base):
        removed, swapped = everything  # the common case: all of them at once, one check
        order = []
    for finding in order:
        key = finding.sync.key
        if finding.verdict is Verdict.REDUNDANT:
            trial_remove, trial_swap = removed | {key}, swapped
        elif finding.verdict is Verdict.DEVICE_SIDE:
            trial_remove, trial_swap = removed, {**swapped, key: swaps[key]}
        else:
            continue
        checks += 1
        if _clean(edit(ops, remove=trial_remove, swap=trial_swap), base):
            removed, swapped = trial_remove, trial_swap
    keep = tuple(f.number for f in findings if f.sync.key not in removed and f.sync.key not in swapped)
    findings = _with_gains(ops, findings, keep, swapped)
    implicit: dict = {}
    for op in ops:
        if type(op) is T.ImplicitSync:
            implicit[op.reason] = implicit.get(op.reason, 0) + 1
    return Audit(tuple(findings), keep, tuple(f.number for f in findings if f.sync.key in swapped),
                 tuple(f.number for f in findings if f.sync.key in removed), tuple(base.races),
                 tuple(implicit.items()), checks, (tuple(removed), tuple(swapped.items())))


HOST_WORK = (T.Launch, T.Copy, T.GraphLaunch)  # what the host issues that the GPU can run meanwhile
SMALL_LEAD = 2  # a replacement issues an event record and a wait: two calls for the host's lead


def _with_gains(ops, findings: list, keep: tuple, swapped: dict) -> list:
    """Each host synchronize the minimal set replaces, with how far the host then gets ahead: the
    work it issues on its thread before a host synchronize the set keeps blocks it again (one pass,
    from the end). A lead of a call or two buys little, as the replacement itself adds two calls."""
    kept = {f.sync.key: f.number for f in findings if f.number in keep and f.sync.host_blocking}
    blocker = {i: kept[f.sync.key] for f in findings if f.sync.key in kept for i in f.sync.indexes}
    wanted = {i: f.number for f in findings if f.sync.key in swapped for i in f.sync.indexes}
    if not wanted:
        return findings
    ahead: dict = {}  # thread -> [work issued since this point, the finding number that blocks next]
    leads: dict = {}  # finding number -> [(work, blocker) per occurrence]
    for index in range(len(ops) - 1, -1, -1):
        op = ops[index]
        state = ahead.setdefault(op.thread, [0, None])
        if index in wanted:
            leads.setdefault(wanted[index], []).append(tuple(state))
        if index in blocker:
            state[0], state[1] = 0, blocker[index]
        elif type(op) in HOST_WORK:
            state[0] += 1
    return [replace(f, gain=_gain_line(leads[f.number])) if f.number in leads else f for f in findings]


def _gain_line(leads: list) -> str:
    blocked = [(work, number) for work, number in leads if number is not None]
    if len(blocked) * 2 < len(leads):  # mostly nothing blocks the host again on this thread
        return ""
    work = sorted(w for w, _ in blocked)[len(blocked) // 2]
    numbers = [number for _, number in blocked]
    then = max(set(numbers), key=numbers.count)
    seen = f" (median of {len(blocked)} occurrences)" if len(blocked) > 1 else ""
    text = (f"after it the host issues {work} operation{'s' if work != 1 else ''}{seen} before #{then} blocks it "
            "again")
    if work <= SMALL_LEAD:
        return (text + ", and the device-side wait adds two calls (an event record and a wait): little to gain; "
                "time it (--prove) before changing it")
    return text + ": the wait lets the GPU run while the host issues them"


def _copied_back(ops, sync: Sync) -> tuple:
    """What the device-to-host copies of a host read (issued at its call site just before its
    synchronize) read on the device, as host_bytes lines."""
    names = _Names()
    copies = {}
    wanted = set(sync.indexes)
    last = None
    for index, op in enumerate(ops):
        names.see(op)
        if type(op) is T.Copy and op.kind is T.CopyKind.D2H and op.src is not None:
            last = op
        elif index in wanted and last is not None and last.site == op.site:
            src = last.src
            copies.setdefault((src.buffer, src.start, src.stop), names.buffers.get(src.buffer, f"buffer{src.buffer}"))
        if index in wanted:
            last = None
    return tuple(f"reads `{name}` bytes [{start}, {stop}) copied back at {sync.site}"
                 for (_, start, stop), name in list(copies.items())[:3])


def _count(items, word: str) -> str:
    return f"{len(items)} {word}{'s' if len(items) != 1 else ''}"


def _host_side(checker: Checker, race: Race) -> bool:
    witness = checker.witness(race)
    return witness is None or _actor(witness[0]) is None or _actor(witness[1]) is None


def _host_bytes(race: Race) -> str:
    first, second = race.first, race.second
    if second.actor.startswith("host"):
        verb = "frees" if second.name == "free" else ("writes" if second.write else "reads")
        return (f"{verb} `{race.buffer}` bytes [{race.start}, {race.stop}) at {second.site}, which `{first.name}` on "
                f"{first.actor} ({first.site}) {'writes' if first.write else 'reads'}")
    return (f"{'writes' if first.write else 'reads'} `{race.buffer}` bytes [{race.start}, {race.stop}) at "
            f"{first.site} before `{second.name}` on {second.actor} ({second.site}) may use them")


def _swap_for(checker: Checker, sync: Sync, races, ops):
    """The device-side waits that replace host sync `sync`: each race's consumer stream waits
    for its producer, through an event recorded where the host synchronized."""
    op = ops[sync.indexes[0]]
    names = _Names()
    for each in ops:
        names.see(each)
    records, waits, replacements = [], [], []
    for race in races:
        witness = checker.witness(race)
        if witness is None:
            return None, ()
        source, target = _actor(witness[0]), _actor(witness[1])
        kind = type(op)
        if kind is T.EventSync:
            wait = (target, None, op.event)
            rep = Replacement("", "", race.second.actor, f"`{race.second.name}` ({race.second.site})",
                              event=names.event(op.event))
        else:
            record = op.stream if kind is T.StreamSync else source
            if record not in records:
                records.append(record)
            wait = (target, record, None)
            rep = Replacement(names.stream(record), f"`{race.first.name}` ({race.first.site})", race.second.actor,
                              f"`{race.second.name}` ({race.second.site})")
        if wait not in waits:
            waits.append(wait)
            replacements.append(rep)
    return _Swap(tuple(records), tuple(waits)), replacements


def _provenance(ops, syncs):
    """One pass over the whole trace: which syncs add no order at any occurrence (what they wait
    for was already ordered), and, where one does, which sync had ordered it ("implied by")."""
    occurrence = {}
    for sync in syncs:
        for index in sync.indexes:
            occurrence[index] = sync.key
    implied = {sync.key: "no-op" for sync in syncs}  # True / False once an occurrence orders something
    via: dict = {}  # key -> keys of the syncs that had ordered what it waits for, the latest first
    origin: dict = {}  # (ordered owner, source owner) -> (trace index, key) of the sync that ordered it last
    checker = Checker()
    for index, op in enumerate(ops):
        key = occurrence.get(index)
        if key is not None and key[0] != "legacy join":
            clocks = checker.sync_clocks(op)
            if clocks is not None:
                needed, have, ordered, source = clocks
                raised = [c for c, tick in needed.items() if tick > have.get(c, 0)]
                if raised:
                    implied[key] = False
                    for c in raised:
                        origin[(ordered, c)] = (index, key)
                    checker.feed(op)
                    continue
                if implied[key] == "no-op":
                    implied[key] = True
                if key not in via:
                    # A device synchronize waits for every stream: each may have been ordered by
                    # another sync (the host read of one stream, the query of another), so all are named.
                    host = checker.thread_owner(op.thread)
                    found = {origin.get((ordered, c)) or origin.get((host, c))
                             for c in ([source] if source is not None else list(needed))}
                    others = sorted((f for f in found if f is not None and f[1] != key), reverse=True)
                    if others:
                        via[key] = tuple(dict.fromkeys(k for _, k in others))
        checker.feed(op)
    return implied, via


def _why_redundant(sync: Sync, implied: dict, via: dict, numbers: dict) -> str:
    if sync.kind == "legacy join":
        return "removing it alone makes no race: nothing relies on the implicit join"
    state = implied.get(sync.key)
    if state == "no-op":
        return "it orders nothing: the event it waits on was never recorded when it ran (CUDA: a no-op)"
    if state:
        others = [numbers[k] for k in via.get(sync.key, ()) if k in numbers]
        if others:
            named = [f"#{number} ({other.what}, {other.site})" for number, other in others]
            return ("implied: what it waits for was already ordered by " +
                    (named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]))
        return "implied: what it waits for was already ordered (by stream order or the host's issue order)"
    return None


COVER_CANDIDATES = 3  # later syncs tried as the one that gives the same order (a check each)


def _covered_by(ops, base: _Base, sync: Sync, syncs, numbers: dict, alone_clean: dict) -> tuple:
    """Why a sync that adds order is still redundant alone: a later sync gives that order before
    anything relies on it (removing both makes a race; those ordering the same actor are tried
    first), or nothing after it touches the bytes it orders. Returns (reason, checks made)."""
    first = sync.indexes[0]
    actor = _ordered_actor(ops[first])
    later = [s for s in syncs if s is not sync and s.kind != "legacy join" and s.indexes[-1] > first]
    later.sort(key=lambda s: (_ordered_actor(ops[s.indexes[0]]) != actor,
                              min((i for i in s.indexes if i > first), default=first)))
    tried = 0
    for other in later[:COVER_CANDIDATES]:
        # `other` covers this sync when removing both makes a race that removing `other` alone
        # does not: then this sync's order is what `other`'s absence exposes (a cover needed on
        # its own counts too, but only for races beyond its own).
        if other.key not in alone_clean:
            tried += 1
            alone_clean[other.key] = _findings(edit(ops, remove={other.key}))
        tried += 1
        if _findings(edit(ops, remove={sync.key, other.key})) - alone_clean[other.key] - base.findings:
            number = numbers[other.key][0]
            return (f"covered: #{number} ({other.what}, {other.site}) gives the same order before anything "
                    "relies on it (removing both makes a race)"), tried
    if not _shares_bytes(ops, sync):
        return "it orders no shared bytes: nothing after it touches bytes anything before it used", tried
    return ("the other synchronizations order what it orders before anything relies on it (no single one of "
            "them alone)"), tried


def _touches(op):
    """(buffer, start, stop, write) of what an operation accesses; None if it cannot be told."""
    kind = type(op)
    if kind in (T.Launch, T.Copy, T.HostAccess):
        return [(r.buffer, r.start, r.stop, False) for r in op.reads] + \
               [(r.buffer, r.start, r.stop, True) for r in op.writes]
    if kind is T.Free:
        return [(op.buffer, 0, float("inf"), True)]
    if kind is T.GraphLaunch:
        return None  # its nodes' accesses are in the capture: claim nothing
    return []


def _shares_bytes(ops, sync: Sync) -> bool:
    """Whether, at some occurrence, bytes accessed before it are accessed after it, one side a
    write. Without that, no pair of accesses can depend on it (conservative: True when unsure)."""
    before: list = []
    occurrences = set(sync.indexes)
    after_first = False
    for index, op in enumerate(ops):
        if index in occurrences:
            after_first = True
        touched = _touches(op)
        if touched is None:
            return True
        for buf, start, stop, write in touched:
            if after_first and any(b == buf and s < stop and start < e and (w or write) for b, s, e, w in before):
                return True
            before.append((buf, start, stop, write))
    return False


def _ordered_actor(op) -> tuple:
    """What a sync orders: a stream (a wait) or the host thread (a host synchronize)."""
    if type(op) is T.StreamWait:
        return ("stream", op.stream)
    return ("host", op.thread)
