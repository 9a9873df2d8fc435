"""A recorded run as Chrome Trace Event JSON that opens in Perfetto (ui.perfetto.dev).

The run's timeline model (timeline_model.py) written as trace events: one track per
lane, a complete event per slice, the racing pair in red, flow arrows for the
record -> wait and work -> host sync edges and for the wait a race lacks.
"""
from __future__ import annotations

import json

from ..atomic_files import write_text
from ..core.trace import site_path
# The model lived in this module before it had one of its own: its names stay importable from here.
from .timeline_model import (ISSUE_ORDER, MICROSECONDS, STEPS, Edge, Lane, LocatedRace, Model, Slice,
                             build_model, missing_label)

__all__ = ["ISSUE_ORDER", "MICROSECONDS", "PID", "RACE_PREFIX", "STEPS", "Edge", "Lane", "LocatedRace",
           "Model", "Slice", "build_model", "to_chrome_trace", "write_chrome_trace"]

RACE_PREFIX = "RACE: "
PID = 1


def _range_text(ranges) -> list:
    return [f"{name} bytes [{start}, {stop})" for name, start, stop in ranges]


def _timing(model: Model, s: Slice) -> str:
    if not s.measured or model.clock == ISSUE_ORDER:
        return "placed by issue order (not measured)"
    return "scheduler step" if model.clock == STEPS else "measured with CUDA events"


def _clock_note(model: Model) -> str:
    if model.clock == STEPS:
        return "sim scheduler steps: 1 step = 1 µs in this file"
    if model.clock == MICROSECONDS:
        return "microseconds measured with CUDA events; untimed operations placed by issue order"
    return "no times recorded: 1 µs per operation in issue order"


def _audit_marks(audit) -> dict:
    """trace index -> its synchronization's finding, for the occurrences the audit's minimal set
    drops or replaces by a device-side wait (a line in a loop may keep some occurrences)."""
    if audit is None:
        return {}
    return audit.edited_occurrences()


def to_chrome_trace(source, audit=None) -> dict:
    """Chrome Trace Event JSON (a dict) of a run; open the written file in ui.perfetto.dev.
    `source`: a Device, a Trace, a mapping (see timeline_model.build_model) or a Model. `audit`:
    the run's sync audit (analyses.sync_audit.Audit): redundant and replaceable synchronizations
    the minimal set drops or replaces are marked (name prefixed with their verdict, yellow, the
    finding in their args)."""
    model = source if isinstance(source, Model) else build_model(source)
    marks = _audit_marks(audit)
    tids = {lane.key: n + 1 for n, lane in enumerate(model.lanes)}  # tid order = track order
    events = []
    backend = model.backend or "trace"
    events.append({"name": "process_name", "ph": "M", "pid": PID, "tid": 0,
                   "args": {"name": f"streamcheck {backend} ({_clock_note(model)})"}})
    for n, lane in enumerate(model.lanes):
        tid = tids[lane.key]
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": lane.label}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": n}})

    roles = model.race_roles()
    body = []
    for index in sorted(model.slices, key=lambda i: (model.slices[i].start, i)):
        s = model.slices[index]
        args = {"trace index": index, "site": site_path(s.site), "function": s.site.function, "file": s.site.file,
                "lane": model.lane(s.lane).label, "time": _timing(model, s)}
        if s.site.innermost is not None:
            args["innermost"] = site_path(s.site.innermost)
        if s.site.stack:
            args["stack"] = [f"{site_path(frame)} in {frame.function}" for frame in s.site.stack]
        if s.reads:
            args["reads"] = _range_text(s.reads)
        if s.writes:
            args["writes"] = _range_text(s.writes)
        event = {"name": s.name, "cat": s.category, "ph": "X", "ts": s.start, "dur": s.duration,
                 "pid": PID, "tid": tids[s.lane], "args": args}
        finding = marks.get(index)
        if finding is not None:
            verdict, reason = finding.occurrence(index)  # this occurrence's own
            event["name"] = f"[{verdict.value} #{finding.number}] {s.name}"
            event["cname"] = "yellow"
            event["cat"] += ",sync audit"
            args["sync audit"] = {"number": finding.number, "verdict": verdict.value, "reason": reason,
                                  "replacement": [r.describe() for r in finding.replacement]}
        if index in roles:
            event["name"] = RACE_PREFIX + s.name
            event["cname"] = "terrible"  # the trace viewers' reserved red
            event["cat"] += ",race"
            args["race"] = True
            args["races"] = [{"kind": loc.race.kind, "buffer": loc.race.buffer,
                              "bytes": f"[{loc.race.start}, {loc.race.stop})", "role": role,
                              "access": (loc.race.first if role == "first" else loc.race.second).describe(),
                              "missing edge": loc.race.missing_edge, "fix": loc.race.hint}
                             for loc, role in roles[index]]
        body.append(event)

    for d in model.delays:
        body.append({"name": d.name, "cat": "delay", "ph": "X", "ts": d.start, "dur": d.duration, "pid": PID,
                     "tid": tids[d.lane], "args": {"delayed": model.slices[d.index].name, "trace index": d.index,
                                                   "why": "spin kernel injected by the delay schedule"}})

    for index, text in model.notes:
        s = model.slices[index]
        body.append({"name": text, "cat": "note", "ph": "i", "s": "t", "ts": s.start,
                     "pid": PID, "tid": tids[s.lane], "args": {"site": str(s.site)}})

    for loc in model.races:
        consumer = model.slices.get(loc.second)
        if consumer is None or loc.first is None:
            continue
        # Marks where the wait belongs: the consumer's stream, at the consumer's start.
        body.append({"name": missing_label(loc.race), "cat": "race", "ph": "i", "s": "t",
                     "ts": consumer.start, "pid": PID, "tid": tids[consumer.lane], "cname": "terrible",
                     "args": {"race": True, "kind": loc.race.kind, "buffer": loc.race.buffer,
                              "missing edge": loc.race.missing_edge, "fix": loc.race.hint,
                              "struck in this run": model.struck(loc)}})

    for flow_id, edge in enumerate(model.edges, start=1):
        body.extend(_flow(flow_id, edge, model.slices[edge.src], model.slices[edge.dst], tids))

    events.extend(sorted(body, key=lambda e: (e["ts"], _PHASE_ORDER[e["ph"]])))
    return {
        "traceEvents": events,
        "otherData": {
            "generator": "streamcheck",
            "backend": model.backend,
            "clock": _clock_note(model),
            "schedule": model.schedule,
            "races": [loc.race.format() for loc in model.races],
        },
    }


# Slices first at equal timestamps, so instants and flow ends nest inside them.
_PHASE_ORDER = {"X": 0, "i": 1, "s": 2, "f": 3}


def _flow(flow_id: int, edge: Edge, src: Slice, dst: Slice, tids: dict) -> list:
    """A flow arrow as an s/f pair bound to the enclosing slices.

    Perfetto reads events in timestamp order and binds `s` and `f` to the slice open
    on their track at that moment, so the `s` must come first in time. When a race
    struck, the consumer ran *before* the producer finished: the arrow then starts
    at the consumer (the earlier slice) and the name says which way the edge goes.
    Both ends sit inside their slices (a quarter and three quarters in)."""
    name = edge.label if edge.kind != "missing" else edge.label.split(":")[0]
    cat = {"event": "event", "sync": "sync", "missing": "race"}[edge.kind]
    first, second = src, dst
    if not (src.start + 0.25 * src.duration < dst.start + 0.75 * dst.duration):
        first, second = dst, src
    common = {"name": name, "cat": cat, "id": flow_id, "pid": PID}
    return [
        dict(common, ph="s", ts=first.start + 0.25 * first.duration, tid=tids[first.lane]),
        dict(common, ph="f", bp="e", ts=second.start + 0.75 * second.duration, tid=tids[second.lane]),
    ]


def write_chrome_trace(source, path, audit=None) -> str:
    """Write the run as Chrome Trace Event JSON to `path` (open it in ui.perfetto.dev): the whole
    file or, if writing fails or the process is killed, none (atomic_files.write_file). `audit`:
    as to_chrome_trace's."""
    return write_text(path, json.dumps(to_chrome_trace(source, audit), indent=1))
