"""The sync audit: every synchronization of a recorded run, what each of its occurrences is for,
and a minimal sufficient set of occurrences.

A synchronization is named by what the user wrote: its kind, its call site, and the streams and
events it names (by name, so the same line in a decode loop is one synchronization seen once
per step). Each occurrence gets its own verdict, since a line in a loop is often needed at some
steps only (the host reads after the last one); a site reads as its most demanding occurrence,
and the report groups its occurrences the way a user changes code ("needed at the last of 3
occurrences: synchronize once after the loop"). Verdicts come from re-checking the recorded trace
without the synchronization (core.hb's checker, nothing else):

- necessary: removing it makes a race (named) or a capture CUDA refuses;
- redundant: removing it makes none, either because earlier edges already ordered what it
  waits for (implied, named) or because a later one gives the same order first (covered), or
  because nothing after it touches the bytes it orders;
- device-side suffices: a host synchronize whose races, once removed, are all between streams:
  an event recorded on the producer's stream and a wait on the consumer's replaces it (checked
  with the replacement in the trace), so the host keeps issuing;
- host needed: the host itself reads, writes or frees bytes the device touched;
- timing-dependent: a query that returned done. It ordered because it happened to say done
  (the program's branch or loop depended on timing), so it is never offered for removal.

Per occurrence, incrementally: one re-check without every occurrence of a site reports each race
occurrence with its two accesses (Checker.on_race), and a pair with exactly one of the site's
occurrences issued between its accesses needs that occurrence (happens-before edges run forward
in issue order, so only syncs issued between two accesses can order them). The occurrences no
pair pins are re-checked together, and one at a time only where two of them share every pair.

The minimal set is built greedily over occurrences and re-checked as a whole, since two syncs
each redundant alone may be needed together: host-blocking occurrences go first (what costs is
blocking the host), then the count. Removing edges can only unorder access pairs, never order
them, so an occurrence necessary alone stays necessary once others are gone, and every one the
set keeps is needed given the rest.

The audit speaks for the recorded run: these inputs, this control flow, this thread
interleaving. Implicit synchronizations CUDA does not promise (core.trace.ImplicitSync: pool
growth, lazy loading, pageable copies) are listed, never relied on.
"""
from __future__ import annotations

import bisect
import enum
import json
from dataclasses import dataclass, replace
from typing import Optional

from ..core import trace as T
from ..core.fast import new_checker
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


# A site reads as its most demanding occurrence.
DEMAND = {Verdict.REDUNDANT: 0, Verdict.DEVICE_SIDE: 1, Verdict.TIMING: 2, Verdict.NECESSARY: 3,
          Verdict.HOST_NEEDED: 4}


@dataclass(frozen=True)
class Sync:
    """One synchronization as the user wrote it, with its occurrences."""

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
    each: bool = False  # the program creates a new `event` at each occurrence: wait on that occurrence's

    def describe(self) -> str:
        if self.event:
            which = " (the one that occurrence synchronizes: a new one each time)" if self.each else ""
            return f"make {self.wait_on} wait on event `{self.event}`{which} (stream.wait_event) before {self.before}"
        return (f"record an event on {self.record_on} after {self.after} and make {self.wait_on} wait on it "
                f"(stream.wait_event) before {self.before}")


LISTED = 8  # occurrence numbers a phrase lists before "..."


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def occurrences_phrase(ordinals, count: int) -> str:
    """Where `ordinals` (1-based, ascending) fall among a site's `count` occurrences, in the
    words a user changes code by: "at every occurrence", "at the last of 3 occurrences",
    "at occurrences 2, 4, 6 (every 2nd)"."""
    ordinals = tuple(ordinals)
    if len(ordinals) == count:
        return "at every occurrence"
    if not ordinals:
        return "at no occurrence"
    if ordinals == (count,):
        return f"at the last of {count} occurrences"
    if ordinals == (1,):
        return f"at the first of {count} occurrences"
    if len(ordinals) == 1:
        return f"at occurrence {ordinals[0]} of {count}"
    missing = [n for n in range(1, count + 1) if n not in ordinals]
    if len(missing) <= 2 and count > LISTED:  # say the few it is not at
        if missing == [1]:
            return "at every occurrence but the first"
        if missing == [count]:
            return "at every occurrence but the last"
        return f"at every occurrence but occurrences {', '.join(map(str, missing))}"
    listed = ", ".join(map(str, ordinals[:LISTED])) + (", ..." if len(ordinals) > LISTED else "")
    steps = {b - a for a, b in zip(ordinals, ordinals[1:])}
    if len(steps) == 1 and min(steps) > 1:
        return f"at occurrences {listed} (every {_nth(min(steps))})"
    return f"at occurrences {listed} of {count}"


@dataclass(frozen=True)
class Finding:
    number: int
    sync: Sync
    verdict: Verdict  # the most demanding of its occurrences'
    reason: str  # why, for the occurrences with that verdict
    prevents: tuple = ()  # the races removing its needed occurrences makes
    replacement: tuple = ()  # Replacements (device-side suffices)
    host_bytes: tuple = ()  # what the host touches (host needed)
    gain: str = ""  # a replaced host synchronize: how far the host gets ahead before it blocks again
    at: tuple = ()  # each occurrence's own verdict, in order
    others: str = ""  # why the occurrences that are redundant alone are (when the site is needed at some)
    kept: tuple = ()  # occurrences (1-based) the minimal set keeps as they are
    replaced_at: tuple = ()  # ... turns into device-side waits
    removed_at: tuple = ()  # ... drops

    @property
    def needed_at(self) -> tuple:
        """The occurrences that are not redundant alone."""
        return tuple(n for n, verdict in enumerate(self.at, 1) if verdict is not Verdict.REDUNDANT)

    def occurrence(self, index: int) -> tuple:
        """(verdict, reason) of the occurrence at trace index `index`."""
        verdict = self.at[self.sync.indexes.index(index)]
        return verdict, (self.others if verdict is not self.verdict and self.others else self.reason)

    @property
    def where(self) -> str:
        """Where a site needed at some occurrences only is needed, with the change that follows;
        "" where every occurrence has the site's verdict (it reads as a site seen once)."""
        needed = self.needed_at
        if self.verdict is Verdict.REDUNDANT or len(needed) == self.sync.count:
            return ""
        text = occurrences_phrase(needed, self.sync.count)
        verb = "synchronize" if self.sync.host_blocking else "wait"
        if needed == (self.sync.count,):
            text += f": {verb} once after the loop"
        elif needed == (1,):
            text += f": {verb} once, at the first step"
        return text

    def to_dict(self, root: Optional[str] = None) -> dict:
        return {"number": self.number, "kind": self.sync.kind, "site": site_path(self.sync.site, root),
                "what": self.sync.what, "count": self.sync.count, "host_blocking": self.sync.host_blocking,
                "captured": self.sync.captured, "verdict": self.verdict.value, "reason": self.reason,
                "where": self.where, "occurrences": [v.value for v in self.at], "others": self.others,
                "kept": list(self.kept), "replaced": list(self.replaced_at), "removed": list(self.removed_at),
                "prevents": [r.to_dict(root) for r in self.prevents],
                "replacement": [r.describe() for r in self.replacement], "host_bytes": list(self.host_bytes),
                "gain": self.gain}


@dataclass(frozen=True)
class Audit:
    findings: tuple
    races: tuple = ()  # the recorded run's own races: they come first
    implicit: tuple = ()  # ImplicitSync reasons with counts: (reason, count)
    checks: int = 0  # how many times the trace was re-checked
    swaps: tuple = ()  # (key, _Swap): the device-side waits of each site the minimal set replaces somewhere

    @property
    def keep(self) -> tuple:
        """Numbers of the syncs the minimal set keeps as they are (at one occurrence or more)."""
        return tuple(f.number for f in self.findings if f.kept)

    @property
    def replaced(self) -> tuple:
        """Numbers of the host syncs it turns into device-side waits (at one occurrence or more)."""
        return tuple(f.number for f in self.findings if f.replaced_at)

    @property
    def removed(self) -> tuple:
        """Numbers of the syncs it drops (at one occurrence or more)."""
        return tuple(f.number for f in self.findings if f.removed_at)

    @property
    def needed(self) -> int:
        """Occurrences the minimal set keeps or replaces."""
        return sum(len(f.kept) + len(f.replaced_at) for f in self.findings)

    @property
    def total(self) -> int:
        """Occurrences of every synchronization."""
        return sum(f.sync.count for f in self.findings)

    def edited_occurrences(self) -> dict:
        """trace index -> finding, for every occurrence the minimal set drops or replaces."""
        return {f.sync.indexes[n - 1]: f for f in self.findings for n in f.removed_at + f.replaced_at}

    def apply(self, ops, drop=(), drop_at=()) -> list:
        """`ops` as the minimal set edits them (removed occurrences gone, replaced ones swapped for
        their device-side waits); `drop`: finding numbers removed on top (every occurrence), and
        `drop_at`: (finding number, occurrence) pairs, to check each is needed."""
        swaps = dict(self.swaps)
        gone = {self.findings[n - 1].sync.key for n in drop}
        removed = {f.sync.indexes[n - 1] for f in self.findings for n in f.removed_at}
        removed |= {self.findings[number - 1].sync.indexes[n - 1] for number, n in drop_at}
        swap_at = {f.sync.indexes[n - 1]: swaps[f.sync.key] for f in self.findings if f.number not in drop
                   for n in f.replaced_at if f.sync.indexes[n - 1] not in removed}
        return edit(ops, remove=gone, drop=removed, swap_at=swap_at)

    def edits(self, only=None) -> SyncEdits:
        """The minimal set as a rerun applies it; `only`: a finding number, that sync's needed
        occurrences alone skipped (every occurrence, for one needed as a whole)."""
        if only is not None:
            finding = self.findings[only - 1]
            return SyncEdits({finding.sync.key: finding.needed_at or None}, counts={finding.sync.key: finding.sync.count})
        swaps = dict(self.swaps)
        remove = {f.sync.key: f.removed_at for f in self.findings if f.removed_at}
        swap = {f.sync.key: (swaps[f.sync.key], f.replaced_at) for f in self.findings if f.replaced_at}
        counts = {f.sync.key: f.sync.count for f in self.findings if f.removed_at or f.replaced_at}
        return SyncEdits(remove, swap, counts)

    def summary(self) -> str:
        total = self.total
        if not total:
            return "no synchronization in this run"
        text = f"{self.needed} of {total} synchronization{'s are' if total != 1 else ' is'} needed"
        sites = len(self.findings)
        if sites != total:  # a site seen more than once: say how many lines of code they are
            at = sum(1 for f in self.findings if f.kept or f.replaced_at)
            text += f", at {at} of {sites} site{'s' if sites != 1 else ''}"
        replaced = sum(len(f.replaced_at) for f in self.findings)
        if replaced:
            text += (f" ({replaced} as {'a device-side wait' if replaced == 1 else 'device-side waits'} instead of "
                     f"{'a host synchronize' if replaced == 1 else 'host synchronizes'})")
        if self.removed:
            text += f"; removable: {', '.join(_numbered(f, f.removed_at) for f in self.findings if f.removed_at)}"
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
                rows.append((str(f.number), _verdict_cell(f), f.sync.kind, str(f.sync.site), f"{f.sync.count}x",
                             f.sync.what))
            widths = [max(len(row[i]) for row in rows) for i in range(5)]
            for row in rows:
                lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5])
            lines.append("")
            for f in self.findings:
                alone = " alone" if f.verdict is Verdict.REDUNDANT and f.kept else ""
                if f.where:
                    lines.append(f"  #{f.number} {f.verdict.value} {f.where}; {f.reason}")
                else:
                    lines.append(f"  #{f.number} {f.verdict.value}{alone}: {f.reason}")
                if f.others:
                    rest = f.sync.count - len(f.needed_at)
                    lines.append(f"      the other {rest} occurrence{'s are' if rest != 1 else ' is'} redundant: "
                                 f"{f.others}")
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
            kept = [_numbered(f, f.kept) for f in self.findings if f.kept]
            if kept:
                lines.append(f"    keep: {', '.join(kept)}")
            replaced = [_numbered(f, f.replaced_at) for f in self.findings if f.replaced_at]
            if replaced:
                lines.append(f"    replace by device-side waits: {', '.join(replaced)}")
            for f in self.findings:
                if f.kept and f.sync.host_blocking:
                    lines.append(f"    {_numbered(f, f.kept)} stays a host synchronize: {_why_host_stays(f)}")
        for reason, count in self.implicit:
            lines.append(f"  implicit (CUDA promises no ordering, not counted): {reason} ({count}x)")
        return wrap_lines("\n".join(lines), width)

    def to_dict(self, root: Optional[str] = None) -> dict:
        return {"summary": self.summary(), "needed": self.needed, "total": self.total,
                "sites": len(self.findings), "keep": list(self.keep), "replaced": list(self.replaced),
                "removed": list(self.removed), "races_first": len(self.races),
                "findings": [f.to_dict(root) for f in self.findings],
                "implicit": [{"reason": r, "count": c} for r, c in self.implicit]}


def _numbered(finding: Finding, ordinals: tuple) -> str:
    """`#n`, with where when it is not every occurrence: "#2 (at the last of 3 occurrences)"."""
    if len(ordinals) == finding.sync.count:
        return f"#{finding.number}"
    return f"#{finding.number} ({occurrences_phrase(ordinals, finding.sync.count)})"


def _verdict_cell(finding: Finding) -> str:
    if finding.verdict is Verdict.REDUNDANT and finding.kept:
        # Redundant alone, but the set keeps it: with the others it drops, it is what orders (a double
        # wait's first wait), so the table must not call it removable.
        return "kept by the set"
    needed = len(finding.needed_at)
    if finding.verdict is Verdict.REDUNDANT or needed == finding.sync.count:
        return finding.verdict.value
    return f"{finding.verdict.value} ({needed} of {finding.sync.count})"


_ALLOCATOR_QUERY = ("torch's caching allocator queries the events of `record_stream` before it hands a freed block out "
                    "again: not the program's synchronization, so never offered for removal (the program's "
                    "record_stream call is what makes it)")


def _allocators(sync) -> bool:
    """A query torch's caching allocator makes for record_stream, not the program."""
    return sync.key[-1] == "record_stream"


def _why_host_stays(finding: Finding) -> str:
    """Why the minimal set keeps a host synchronize blocking the host: what the host reads there."""
    if finding.host_bytes:
        return f"the host {finding.host_bytes[0]}"
    if finding.verdict is Verdict.HOST_NEEDED:
        return finding.reason
    if finding.verdict is Verdict.TIMING:
        if _allocators(finding.sync):
            return "the caching allocator's own query (record_stream), not the program's"
        return "a query that returned done: the program's loop or branch on it depends on timing"
    if finding.verdict is Verdict.NECESSARY:
        return "its device-side replacement, checked in the trace, does not order every race it prevents"
    return ("redundant alone, but needed once the removable ones are gone: without it the set races between streams "
            "(a device-side replacement for it was not tried)")


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
        what = "record_stream" if names.event(op.event) == T.RECORD_STREAM_EVENT else "event"
        return ("query",) + base + (names.stream(src) if src is not None else names.event(op.event), what)
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
    if names.event(op.event) == T.RECORD_STREAM_EVENT:
        src = names.recorded_on.get(op.event)
        on = f" on {names.stream(src)}" if src is not None else ""
        return (f"torch's caching allocator found its record_stream event{on} passed before handing the freed block "
                "out again")
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

# In a replacement's wait, for an event synchronize: the event that occurrence synchronizes. A
# loop that creates its event each step synchronizes a new one each time; waiting on the first
# step's event would order nothing after it.
SYNCED_EVENT = "synchronized"


@dataclass(frozen=True)
class _Swap:
    """What replaces one host synchronize's occurrences: events to record, waits to issue."""

    records: tuple  # stream ids to record a fresh event on (one event per stream)
    waits: tuple  # (stream id to wait, source stream id or None, existing event id, SYNCED_EVENT or None)


def edit(ops, remove=frozenset(), drop=frozenset(), swap_at=None) -> list:
    """The trace without the syncs whose keys are in `remove` (every occurrence; a legacy join:
    its stream made non-blocking) or whose trace indexes are in `drop` (those occurrences), and
    with each host sync in `swap_at` (trace index -> _Swap) replaced by device-side waits at the
    same point of the host's issue order."""
    swap_at = swap_at or {}
    by_key = bool(remove)
    if not by_key and not swap_at:  # occurrences dropped only: the common re-check, kept cheap
        out = []
        for index, op in enumerate(ops):
            if index in drop:
                if type(op) is not T.StreamCreate:
                    continue
                if StreamKind.parse(op.kind).joins_legacy:  # a legacy join removed: the stream made non-blocking
                    op = replace(op, kind=StreamKind.NON_BLOCKING)
            out.append(op)
        return out
    names = _Names() if by_key else None
    created: set = set()  # stream ids created so far
    out = []
    next_event = 1 + max((op.event for op in ops if type(op) is T.EventCreate), default=0)
    fresh: dict = {}  # source stream id -> fresh event id
    creates = {op.stream: op for op in ops if type(op) is T.StreamCreate}
    hoisted: set = set()  # streams a replacement uses before the trace created them (recorded lazily)
    for index, op in enumerate(ops):
        kind = type(op)
        if kind is T.StreamCreate:
            if op.stream in hoisted:
                continue
            created.add(op.stream)
        if names is not None:
            names.see(op)
        if kind is T.StreamCreate and (index in drop or (remove and legacy_join_key(op) in remove)):
            if StreamKind.parse(op.kind).joins_legacy:
                out.append(replace(op, kind=StreamKind.NON_BLOCKING))
                continue
        if kind in SYNC_OPS:
            if index in drop:
                continue
            if by_key and sync_key(op, names) in remove:
                continue
            plan = swap_at.get(index)
            if plan is not None:
                for stream in set(plan.records) | {w[0] for w in plan.waits}:
                    if stream not in created and stream in creates:
                        hoisted.add(stream)
                        created.add(stream)
                        out.append(creates[stream])
                        if names is not None:
                            names.see(creates[stream])
                for stream in plan.records:
                    event = fresh.get(stream)
                    if event is None:
                        event = fresh[stream] = next_event
                        next_event += 1
                        out.append(T.EventCreate(op.thread, op.site, event=event, name=f"audit replacement {event}"))
                    out.append(T.EventRecord(op.thread, op.site, event=event, stream=stream))
                for stream, source, event in plan.waits:
                    if event == SYNCED_EVENT:
                        event = op.event
                    out.append(T.StreamWait(op.thread, op.site, stream=stream,
                                            event=event if event is not None else fresh[source]))
                continue
        out.append(op)
    return out


_SKIP = _Swap((), ())  # a replacement by nothing: the sync is skipped


def _occurrence_sets(items) -> dict:
    """key -> frozenset of occurrences (1-based), or None for every one, from a mapping of that
    shape or an iterable of keys (every occurrence)."""
    if isinstance(items, dict):
        return {key: (frozenset(at) if at is not None else None) for key, at in items.items()}
    return {key: None for key in items}


class SyncEdits:
    """What a proof rerun changes as the program issues its calls (Device.edit_syncs, the
    recorder's Recorder.skipped): `remove` (keys, or key -> occurrences, 1-based) are skipped,
    `swap` (key -> the audit's _Swap, or key -> (_Swap, occurrences)) become device-side waits.
    Occurrences are counted per key as the program issues them (`issued`). `met`: the keys the
    rerun issued, and `same_path`: whether it issued each as often as the recorded run did
    (`counts`), to tell whether it took the recorded run's path (a program that is not
    deterministic is claimed nothing of)."""

    def __init__(self, remove=(), swap=None, counts=None):
        self.remove = _occurrence_sets(remove)
        self.swap = {}  # key -> (_Swap, occurrences or None for every one)
        for key, plan in (swap or {}).items():
            plan, at = plan if not isinstance(plan, _Swap) else (plan, None)
            self.swap[key] = (plan, frozenset(at) if at is not None else None)
        self.counts = dict(counts or {})
        self.issued: dict = {}  # key -> occurrences issued so far
        self.unskipped: set = set()  # keys a recorder could not skip (a library reported the call after it ran)
        self.names = _Names()
        # Keys decide() was asked about: their calls pass an entry point that counts them, so the
        # library's later report of a call that was made (torch's callback) is not counted again.
        self._decided: set = set()

    @property
    def every_edit_met(self) -> bool:
        """Whether the rerun issued every sync it was to skip or swap as often as the recorded run
        did (it took the recorded path)."""
        if self.counts:
            return not self.edit_differences()
        return set(self.remove) | set(self.swap) <= self.met

    def edit_differences(self) -> list:
        """(key, times the rerun issued it, times the recorded run did) for each sync to skip or
        swap whose counts differ."""
        return self._differences([*self.remove, *self.swap], self.counts)

    @property
    def met(self) -> set:
        return set(self.issued)

    def same_path(self, counts: dict) -> bool:
        """Whether the rerun issued exactly the syncs of `counts` (key -> the recorded run's
        occurrences), as often; a legacy join of a stream the recorded run gave no work is no sync."""
        return not self.path_differences(counts)

    def path_differences(self, counts: dict) -> list:
        """(key, times the rerun issued it, times the recorded run did) where they differ."""
        return self._differences([*counts, *(key for key in self.issued if key in counts or key[0] != "legacy join")],
                                 counts)

    def _differences(self, keys, counts: dict) -> list:
        return [(key, self.issued.get(key, 0), counts.get(key, 0)) for key in dict.fromkeys(keys)
                if self.issued.get(key, 0) != counts.get(key, 0)]

    def _edited(self, key, occurrence: int) -> Optional[_Swap]:
        if key in self.remove:
            at = self.remove[key]
            if at is None or occurrence in at:
                return _SKIP
        found = self.swap.get(key)
        if found is not None and (found[1] is None or occurrence in found[1]):
            return found[0]
        return None

    def to_json(self) -> str:
        """For a rerun in another process (`streamcheck run --skip-syncs`)."""
        def at(found):
            return sorted(found) if found is not None else None
        return json.dumps({"remove": [[list(k), at(a)] for k, a in sorted(self.remove.items(), key=str)],
                           "swap": [[list(k), list(p.records), [list(w) for w in p.waits], at(a)]
                                    for k, (p, a) in self.swap.items()],
                           "counts": [[list(k), n] for k, n in self.counts.items()]})

    @classmethod
    def from_json(cls, text: str) -> "SyncEdits":
        try:
            data = json.loads(text)
            remove = {tuple(k): at for k, at in data["remove"]}
            swap = {tuple(k): (_Swap(tuple(records), tuple(tuple(w) for w in waits)), at)
                    for k, records, waits, at in data["swap"]}
            counts = {tuple(k): int(n) for k, n in data.get("counts", [])}
            edits = cls(remove, swap, counts)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--skip-syncs: not a sync-audit edit list ({exc}); it is written by "
                             "`streamcheck run --audit-syncs --prove`, not by hand") from None
        return edits

    def recorded_anyway(self, op) -> None:
        """A sync the program issued that the recorder saw only after it ran: if that occurrence
        was to be skipped or replaced, the rerun did not do what the proof says. The call a
        decide() counted (torch's callback reporting it after the entry point let it run, however
        many operations come between, or a replacement the recorder could not issue) is not
        counted again; a key no entry point decides (a sync torch makes inside C++) is counted here."""
        key = sync_key(op, self.names)
        if key is None or (key not in self.remove and key not in self.swap):
            return  # not one to edit (a replacement the recorder issued itself, among others)
        if key not in self._decided:
            self.issued[key] = self.issued.get(key, 0) + 1
        if self._edited(key, self.issued[key]) is not None:
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
        occurrence = self.issued[key] = self.issued.get(key, 0) + 1
        self._decided.add(key)
        plan = self._edited(key, occurrence)
        if plan is not None and any(event == SYNCED_EVENT for _, _, event in plan.waits):
            plan = _Swap(plan.records, tuple((stream, source, op.event if event == SYNCED_EVENT else event)
                                             for stream, source, event in plan.waits))
        return plan

    def stream_create(self, op):
        """`op` itself, or made non-blocking when its implicit legacy join is removed."""
        if not StreamKind.parse(op.kind).joins_legacy:
            return op
        key = legacy_join_key(op)
        self.issued[key] = self.issued.get(key, 0) + 1
        return replace(op, kind=StreamKind.NON_BLOCKING) if self._edited(key, 1) is _SKIP else op


class _Base:
    """The recorded run's own verdict, against which an edited trace's races count as new."""

    def __init__(self, ops):
        checker = _feed(ops)
        self.races = checker.races
        self.keys = {race.key for race in self.races}
        self.errors = {str(error) for error in checker.capture_errors}
        self.findings = self.keys | self.errors
        self.position = {id(op): index for index, op in enumerate(ops)}  # an access's place in the recorded trace


def _findings(ops) -> set:
    """The race keys and capture errors of a trace (a full check)."""
    checker = _feed(ops)
    return {race.key for race in checker.races} | {str(error) for error in checker.capture_errors}


def _feed(ops, stop=None, on_race=None, checker=None) -> Checker:
    """A checker fed `ops` (the native one where it is built); with `stop`, feeding ends as soon as
    stop(checker) is true; `on_race` told every race occurrence in order (the native checker's, read
    once fed; where hb.Checker checked, set before). In an edited trace whose capture CUDA refuses
    (a join dropped), the program would have got the error at end_capture and had no graph: that
    graph's launches are left out, not fed."""
    if checker is None:
        checker = new_checker()
    native = on_race is not None and getattr(checker, "native", False)
    if on_race is not None and not native:
        checker.on_race = on_race
    feed = checker.feed
    for op in ops:
        if type(op) is T.GraphLaunch and checker.capture_errors and not checker.has_graph(op.graph):
            continue
        feed(op)
        if stop is not None and stop(checker):
            break
    if native:
        found = checker.occurrences()
        if found is None:  # hb.Checker took over midway (a capture, a graph): it tells them as it checks
            return _feed(ops, stop, on_race, Checker())
        for first, second, key in found:
            on_race(first, second, key)
    return checker


@dataclass(frozen=True)
class _Pair:
    """One new race occurrence of an edited trace: its accesses' places in the recorded trace
    (None: not an operation of it, such as a graph's captured node) and the operations."""

    first: Optional[int]
    second: Optional[int]
    key: tuple
    host: bool  # the host is one of the two


def _pairs_of(ops, base: _Base, stop=None) -> tuple:
    """(checker, new race occurrences as _Pairs) of a trace."""
    pairs = []
    position = base.position

    def seen(first, second, key):
        if key not in base.keys:
            pairs.append(_Pair(position.get(id(first)), position.get(id(second)), key,
                               _actor(first) is None or _actor(second) is None))
    checker = _feed(ops, stop=stop, on_race=seen)
    return checker, pairs


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


# --- which occurrences are needed ------------------------------------------------------------

def _pinned(pairs, positions: list, ordinals: list) -> tuple:
    """Attribute race pairs to removed occurrences (trace `positions`, ascending, of `ordinals`):
    only syncs issued between two accesses can order them, so a pair with exactly one removed
    occurrence between its accesses needs that one. Returns ({ordinal: [pairs]}, pairs that fall
    between several or cannot be placed)."""
    pinned: dict = {}
    shared = []
    for pair in pairs:
        if pair.first is None or pair.second is None:
            shared.append(pair)
            continue
        lo = bisect.bisect_right(positions, pair.first)
        hi = bisect.bisect_left(positions, pair.second)
        if hi - lo == 1:
            pinned.setdefault(ordinals[lo], []).append(pair)
        elif hi - lo > 1:
            shared.append(pair)
    return pinned, shared


def _needed_occurrences(ops, base: _Base, sync: Sync, pairs, adds_order: set) -> tuple:
    """{ordinal: [pairs]} of the occurrences of `sync` that make a race removed alone, from the
    pairs of the trace without all of them; and how many re-checks it took. Occurrences that
    added no order are redundant alone without a check; the rest no pair pins are re-checked
    together, and one at a time only where they share every pair (each may cover the other)."""
    indexes = sync.indexes
    every = list(range(1, sync.count + 1))
    needed, _ = _pinned(pairs, list(indexes), every)
    unresolved = sorted(adds_order - set(needed))
    checks = 0
    while unresolved:
        positions = [indexes[n - 1] for n in unresolved]
        _, found = _pairs_of(edit(ops, drop=set(positions)), base)
        checks += 1
        if not found:
            break  # removed together they make no race: each is redundant alone
        pinned, shared = _pinned(found, positions, unresolved)
        if pinned:
            needed.update(pinned)
            unresolved = [n for n in unresolved if n not in pinned]
            continue
        for n in unresolved:  # every pair falls between several of them: one at a time
            stop = None if sync.host_blocking else (lambda c, k=len(base.keys): c.distinct_races > k)
            _, alone = _pairs_of(edit(ops, drop={indexes[n - 1]}), base, stop=stop)
            checks += 1
            if alone:
                needed[n] = alone
        break
    return needed, checks


# --- the audit -------------------------------------------------------------------------------

def audit(trace) -> Audit:
    """Audit the synchronizations of a recorded trace (a core.trace.Trace or a list of ops)."""
    ops = list(trace)
    base = _Base(ops)
    checks = 1
    syncs = find_syncs(ops)
    implied, via, adds_order = _provenance(ops, syncs)
    checks += 1
    numbers = {sync.key: (number, sync) for number, sync in enumerate(syncs, 1)}
    findings = []
    swaps: dict = {}
    alone_clean: dict = {}  # key -> the races and capture errors of the run without that sync (cached)
    for number, sync in enumerate(syncs, 1):
        every = (lambda verdict, n=sync.count: (verdict,) * n)
        if sync.kind == "query":
            findings.append(Finding(number, sync, Verdict.TIMING, _ALLOCATOR_QUERY if _allocators(sync) else
                                    "it ordered the host only because it returned done; a loop or branch on "
                                    "query() depends on timing, so it is never offered for removal",
                                    at=every(Verdict.TIMING)))
            continue
        if sync.kind != "legacy join" and not adds_order[sync.key] and not sync.captured:
            # It changed no clock at any occurrence, so the trace without it checks the same. (A captured
            # edge changes none when captured: it orders the graph's nodes, checked at each launch.)
            findings.append(Finding(number, sync, Verdict.REDUNDANT, _why_redundant(sync, implied, via, numbers),
                                    at=every(Verdict.REDUNDANT)))
            continue
        checker, pairs = _pairs_of(edit(ops, drop=set(sync.indexes)), base)
        checks += 1
        races, errors = _new(checker, base)
        if errors:
            findings.append(Finding(number, sync, Verdict.NECESSARY,
                                    f"without it CUDA refuses the capture: {errors[0]}", tuple(races),
                                    at=every(Verdict.NECESSARY)))
            continue
        if not races and sync.kind == "host read":
            # The host consumes what the read copied back into host memory, which the model does
            # not track as a device buffer: the synchronize is what makes that copy complete.
            copied = _copied_back(ops, sync)
            findings.append(Finding(number, sync, Verdict.HOST_NEEDED,
                                    f"the host reads what `{sync.key[-1]}` copied back; only this synchronize makes "
                                    "the device-to-host copy complete", host_bytes=copied,
                                    at=every(Verdict.HOST_NEEDED)))
            continue
        if not races:
            if sync.kind == "legacy join":
                reason = _why_redundant(sync, implied, via, numbers)
            else:  # it does order something: find the sync that gives the same order later
                reason, tried = _covered_by(ops, base, sync, syncs, numbers, alone_clean)
                checks += tried
            findings.append(Finding(number, sync, Verdict.REDUNDANT, reason, at=every(Verdict.REDUNDANT)))
            continue
        needed, tried = _needed_occurrences(ops, base, sync, pairs, adds_order[sync.key])
        checks += tried
        if not needed:  # redundant one at a time, needed together
            findings.append(Finding(number, sync, Verdict.REDUNDANT,
                                    "covered: removing every occurrence makes a race, removing any one alone does not "
                                    "(another occurrence of it, or another synchronization, gives the same order "
                                    "first); the minimal set keeps the ones it needs",
                                    at=every(Verdict.REDUNDANT)))
            continue
        by_key = {race.key: race for race in races}
        pinned_keys = list(dict.fromkeys(p.key for found in needed.values() for p in found))
        prevents = tuple(by_key[key] for key in pinned_keys if key in by_key)
        others = _why_others(syncs, sync, needed, adds_order[sync.key])
        if not sync.host_blocking:
            at = tuple(Verdict.NECESSARY if n in needed else Verdict.REDUNDANT for n in range(1, sync.count + 1))
            findings.append(Finding(number, sync, Verdict.NECESSARY,
                                    f"removing it alone makes {_count(prevents, 'race')}", prevents, at=at,
                                    others=others))
            continue
        host_at = {n for n, found in needed.items() if any(p.host for p in found)}
        device_at = sorted(set(needed) - host_at)
        host_races = [by_key[p.key] for n in sorted(host_at) for p in needed[n] if p.host and p.key in by_key]
        host_bytes = tuple(dict.fromkeys(_host_bytes(race) for race in host_races))
        replacements = ()
        device_verdict = Verdict.NECESSARY
        if device_at:
            device_pairs = [p for n in device_at for p in needed[n]]
            plan, replacements = _swap_for(ops, sync, device_pairs, by_key)
            checks += 1
            # Offered only once the trace with the replacement in it checks clean.
            if plan is not None and _clean(edit(ops, swap_at={sync.indexes[n - 1]: plan for n in device_at}), base):
                swaps[sync.key] = plan
                device_verdict = Verdict.DEVICE_SIDE
            else:
                replacements = ()
        at = tuple(Verdict.HOST_NEEDED if n in host_at else device_verdict if n in needed else Verdict.REDUNDANT
                   for n in range(1, sync.count + 1))
        verdict = max(set(at), key=DEMAND.get)
        if verdict is Verdict.HOST_NEEDED:
            reason = "the host itself touches bytes the device works on, so it must block"
        elif verdict is Verdict.DEVICE_SIDE:
            reason = ("only streams need this ordering (the host touches none of the bytes): a device-side wait "
                      "orders them and the host keeps issuing")
        else:
            reason = (f"removing it alone makes {_count(prevents, 'race')} between streams, and its device-side "
                      "replacement, checked in the trace, does not order every one")
        if host_at and device_at:
            reason += (f"; {occurrences_phrase(device_at, sync.count)} only streams need it: "
                       + ("a device-side wait suffices there" if device_verdict is Verdict.DEVICE_SIDE
                          else "its device-side replacement does not order every race there"))
        findings.append(Finding(number, sync, verdict, reason, prevents, replacement=tuple(replacements),
                                host_bytes=host_bytes, at=at, others=others))
    findings, tried = _minimal_set(ops, base, findings, swaps)
    checks += tried
    findings = _with_gains(ops, findings)
    implicit: dict = {}
    for op in ops:
        if type(op) is T.ImplicitSync:
            implicit[op.reason] = implicit.get(op.reason, 0) + 1
    return Audit(tuple(findings), tuple(base.races), tuple(implicit.items()), checks,
                 tuple((f.sync.key, swaps[f.sync.key]) for f in findings if f.replaced_at))


def _why_others(syncs, sync: Sync, needed: dict, adds_order: set) -> str:
    """Why the occurrences of a needed site that are redundant alone are, grouped by cause."""
    rest = [n for n in range(1, sync.count + 1) if n not in needed]
    if not rest:
        return ""
    last_sync = max(s.indexes[-1] for s in syncs)
    groups: dict = {}
    for n in rest:
        if n not in adds_order:
            cause = "implied: what it waits for was already ordered when it ran"
        elif any(m > n for m in needed):
            cause = "covered: a later occurrence of it that is needed gives the same order before anything relies on it"
        elif sync.indexes[n - 1] == last_sync:
            cause = "nothing after it relies on what it orders"
        else:
            cause = "what it orders is ordered again by the synchronizations after it before anything relies on it"
        groups.setdefault(cause, []).append(n)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{occurrences_phrase(at, sync.count)}, {cause}" for cause, at in groups.items())


def _minimal_set(ops, base: _Base, findings: list, swaps: dict) -> tuple:
    """The findings with the occurrences the minimal set keeps, replaces and removes; and the
    re-checks it took. Greedy over groups of occurrences, each step checked as a whole:
    host-blocking occurrences first (a redundant one dropped, then a device-side one replaced),
    then device-side waits, latest first (of a double wait the second goes). A group that
    races is halved, the later half tried first."""
    removed: set = set()  # trace indexes
    swapped: dict = {}  # trace index -> _Swap
    groups = []  # (finding, "remove" or "swap", ordinals latest first)
    for host in (True, False):
        for f in reversed(findings):
            if f.sync.host_blocking is host:
                redundant = [n for n, v in enumerate(f.at, 1) if v is Verdict.REDUNDANT]
                if redundant:
                    groups.append((f, "remove", redundant[::-1]))
        if host:
            for f in findings:
                device = [n for n, v in enumerate(f.at, 1) if v is Verdict.DEVICE_SIDE]
                if device:
                    groups.append((f, "swap", device[::-1]))
    checks = 0

    def trial(group_items) -> tuple:
        trial_removed, trial_swapped = set(removed), dict(swapped)
        for f, action, ordinals in group_items:
            for n in ordinals:
                index = f.sync.indexes[n - 1]
                if action == "remove":
                    trial_removed.add(index)
                else:
                    trial_swapped[index] = swaps[f.sync.key]
        return trial_removed, trial_swapped

    def clean(state) -> bool:
        nonlocal checks
        checks += 1
        return _clean(edit(ops, drop=state[0], swap_at=state[1]), base)

    if len(groups) > 1 or any(len(g[2]) > 1 for g in groups):
        state = trial(groups)
        if clean(state):  # the common case: all of them at once, one check
            removed, swapped = state
            groups = []
    pending = list(groups)
    while pending:
        f, action, ordinals = pending.pop(0)
        state = trial([(f, action, ordinals)])
        if clean(state):
            removed, swapped = state
        elif len(ordinals) > 1:
            half = (len(ordinals) + 1) // 2
            pending[:0] = [(f, action, ordinals[:half]), (f, action, ordinals[half:])]
    out = []
    for f in findings:
        at = range(1, f.sync.count + 1)
        gone = tuple(n for n in at if f.sync.indexes[n - 1] in removed)
        replaced = tuple(n for n in at if f.sync.indexes[n - 1] in swapped)
        kept = tuple(n for n in at if n not in gone and n not in replaced)
        out.append(replace(f, kept=kept, replaced_at=replaced, removed_at=gone))
    # A host synchronize kept though redundant alone: say what the host reads there, from the set
    # without it.
    for i, f in enumerate(out):
        if f.sync.host_blocking and any(f.at[n - 1] is Verdict.REDUNDANT for n in f.kept) and not f.host_bytes:
            without = removed | {f.sync.indexes[n - 1] for n in f.kept}
            checker, pairs = _pairs_of(edit(ops, drop=without, swap_at=swapped), base)
            checks += 1
            host = [race for race in checker.races if race.key not in base.keys
                    and any(p.host and p.key == race.key for p in pairs)]
            out[i] = replace(f, host_bytes=tuple(dict.fromkeys(_host_bytes(race) for race in host)))
    return out, checks


HOST_WORK = (T.Launch, T.Copy, T.GraphLaunch)  # what the host issues that the GPU can run meanwhile
SMALL_LEAD = 2  # a replacement issues an event record and a wait: two calls for the host's lead


def _with_gains(ops, findings: list) -> list:
    """Each host synchronize the minimal set replaces, with how far the host then gets ahead: the
    work it issues on its thread before a host synchronize the set keeps blocks it again (one pass,
    from the end). A lead of a call or two buys little, as the replacement itself adds two calls."""
    blocker = {f.sync.indexes[n - 1]: f.number for f in findings if f.sync.host_blocking for n in f.kept}
    wanted = {f.sync.indexes[n - 1]: f.number for f in findings for n in f.replaced_at}
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


def _host_bytes(race: Race) -> str:
    first, second = race.first, race.second
    if second.actor.startswith("host"):
        verb = "frees" if second.name == "free" else ("writes" if second.write else "reads")
        return (f"{verb} `{race.buffer}` bytes [{race.start}, {race.stop}) at {second.site}, which `{first.name}` on "
                f"{first.actor} ({first.site}) {'writes' if first.write else 'reads'}")
    return (f"{'writes' if first.write else 'reads'} `{race.buffer}` bytes [{race.start}, {race.stop}) at "
            f"{first.site} before `{second.name}` on {second.actor} ({second.site}) may use them")


def _swap_for(ops, sync: Sync, pairs, races: dict):
    """The device-side waits that replace host sync `sync` where `pairs` (its new race
    occurrences once removed) are all between streams: each consumer stream waits for its
    producer, through an event recorded where the host synchronized (for an event synchronize:
    on the event that occurrence synchronizes)."""
    op = ops[sync.indexes[0]]
    names = _Names()
    for each in ops:
        names.see(each)
    records, waits, replacements = [], [], []
    for pair in pairs:
        race = races.get(pair.key)
        if race is None or pair.first is None or pair.second is None:
            return None, ()
        source, target = _actor(ops[pair.first]), _actor(ops[pair.second])
        kind = type(op)
        if kind is T.EventSync:
            wait = (target, None, SYNCED_EVENT)
            rep = Replacement("", "", race.second.actor, f"`{race.second.name}` ({race.second.site})",
                              event=names.event(op.event), each=_recreated(ops, sync))
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


def _recreated(ops, sync: Sync) -> bool:
    """Whether the occurrences of a sync name different events (a loop that creates its event
    each step): a replacement must wait on each occurrence's own."""
    return len({ops[i].event for i in sync.indexes if hasattr(ops[i], "event")}) > 1


def _provenance(ops, syncs):
    """One pass over the whole trace: which occurrences of each sync add order (what they wait
    for was not ordered yet), and, for a sync whose occurrences add none, which sync had ordered
    it ("implied by"). Returns (implied, via, adds_order): implied[key] is "no-op" while no
    occurrence ordered anything at all (a never-recorded event), else True; adds_order[key]:
    the occurrences (1-based) that raised a clock."""
    occurrence = {}
    for sync in syncs:
        for ordinal, index in enumerate(sync.indexes, 1):
            occurrence[index] = (sync.key, ordinal)
    implied = {sync.key: "no-op" for sync in syncs}
    adds_order = {sync.key: ({1} if sync.kind == "legacy join" else set()) for sync in syncs}
    via: dict = {}  # key -> keys of the syncs that had ordered what it waits for, the latest first
    origin: dict = {}  # (ordered owner, source owner) -> (trace index, key) of the sync that ordered it last
    checker = new_checker()
    for index, op in enumerate(ops):
        found_at = occurrence.get(index)
        if found_at is not None and found_at[0][0] != "legacy join":
            key, ordinal = found_at
            clocks = checker.sync_clocks(op)
            if clocks is not None:
                implied[key] = True
                needed, have, ordered, source = clocks
                raised = [c for c, tick in needed.items() if tick > have.get(c, 0)]
                if raised:
                    adds_order[key].add(ordinal)
                    for c in raised:
                        origin[(ordered, c)] = (index, key)
                    checker.feed(op)
                    continue
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
    return implied, via, adds_order


def _why_redundant(sync: Sync, implied: dict, via: dict, numbers: dict) -> str:
    if sync.kind == "legacy join":
        return "removing it alone makes no race: nothing relies on the implicit join"
    state = implied.get(sync.key)
    if state == "no-op":
        return "it orders nothing: the event it waits on was never recorded when it ran (CUDA: a no-op)"
    if state is True:
        others = [numbers[k] for k in via.get(sync.key, ()) if k in numbers]
        if others:
            named = [f"#{number} ({other.what}, {other.site})" for number, other in others]
            return ("implied: what it waits for was already ordered by " +
                    (named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]))
        return "implied: what it waits for was already ordered (by stream order or the host's issue order)"
    return "implied: what it waits for was already ordered"


COVER_CANDIDATES = 3  # later syncs tried as the one that gives the same order (a check each)


def _covered_by(ops, base: _Base, sync: Sync, syncs, numbers: dict, alone_clean: dict) -> tuple:
    """Why a sync that adds order is still redundant alone: nothing of another actor touches the
    bytes it orders, a later sync gives that order before anything relies on it (removing both
    makes a race; those ordering the same actor are tried first), or the later syncs together
    give its order. Returns (reason, checks made)."""
    if not _shares_bytes(ops, sync):  # then no pair can depend on it, with or without another sync
        return ("it orders no shared bytes: no bytes accessed before it are accessed after it by another stream "
                "or host thread, one side a write"), 0
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
    keys = {s.key for s in later}
    tried += 2
    if not _findings(edit(ops, remove=keys | {sync.key})) - _findings(edit(ops, remove=keys)) - base.findings:
        return ("what it orders is ordered anyway, by stream order and the host's issue order: removing it with "
                "every later synchronization makes no race they do not make alone"), tried
    return (f"covered by the later synchronizations together: removing it with all {len(later)} of them makes a "
            f"race, with any one of the {min(len(later), COVER_CANDIDATES)} tried it does not"), tried


def _touches(op):
    """(buffer, start, stop, write) of what an operation accesses; None if it cannot be told."""
    kind = type(op)
    if kind in (T.Launch, T.Copy, T.HostAccess):
        return [(r.buffer, r.start, r.stop, False) for r in op.reads] + \
               [(r.buffer, r.start, r.stop, True) for r in op.writes]
    if kind is T.Free:
        return [(op.buffer, 0, float("inf"), True)]
    if kind is T.Alloc:  # an allocation handed freed bytes: their new owner (a FREE race ends here)
        return [(r.buffer, r.start, r.stop, True) for r in op.reuses]
    if kind is T.GraphLaunch:
        return None  # its nodes' accesses are in the capture: claim nothing
    return []


def _access_actor(op) -> tuple:
    """Who performs an access: its stream, or the host thread (a host access, a host free)."""
    stream = _actor(op)
    return ("host", op.thread) if stream is None else ("stream", stream)


def _shares_bytes(ops, sync: Sync) -> bool:
    """Whether bytes accessed before some occurrence are accessed after it by another actor, one
    side a write (a read then a write counts as much as two writes). Without that, no pair of
    accesses can depend on it: one actor's own accesses are ordered by stream order or program
    order (conservative: True when unsure)."""
    before: dict = {}  # buffer -> {(actor, write): {(start, stop)}}, issued before the latest occurrence passed
    since: list = []  # accesses issued after it
    occurrences = set(sync.indexes)
    for index, op in enumerate(ops):
        if index in occurrences:
            for buf, start, stop, write, who in since:
                before.setdefault(buf, {}).setdefault((who, write), set()).add((start, stop))
            since = []
        touched = _touches(op)
        if touched is None:
            return True
        if not touched:
            continue
        who = _access_actor(op)
        for buf, start, stop, write in touched:
            for (actor, wrote), ranges in before.get(buf, {}).items():
                if actor != who and (wrote or write) and any(s < stop and start < e for s, e in ranges):
                    return True
            since.append((buf, start, stop, write, who))
    return False


def _ordered_actor(op) -> tuple:
    """What a sync orders: a stream (a wait) or the host thread (a host synchronize)."""
    if type(op) is T.StreamWait:
        return ("stream", op.stream)
    return ("host", op.thread)
