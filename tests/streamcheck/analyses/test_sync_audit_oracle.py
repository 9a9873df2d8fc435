"""The sync audit against the exhaustive oracle of tests/streamcheck/core/test_hb_oracle.py.

The oracle derives "must execute before" from the CUDA rules, independently of core/hb.py and of
the audit. Each generated program is recorded as a trace (the oracle test's `to_trace`), audited,
edited as a verdict says (sync_audit.edit), turned back into a program and judged by the oracle:
its unordered conflicting pairs, by call-site line (operation i is at line i + 1, and edits
keep sites), are the races. The checker reports every operation that races with an earlier one
(not every earlier one it races with: test_hb_oracle's property 2), so "no new race" is judged
at that grain: the same racing operations. For every program:

- a sync called redundant, removed alone, leaves the racing operations as they were;
- a sync called necessary (host needed, device-side suffices) removed alone gives a new race, and
  each race it names is an unordered pair of that kind (a new one in a race-free run; in a racy
  run the checker may name, for an operation that raced already, an earlier partner it did not
  report before);
- the minimal set (drop `removed`, turn `replaced` into the waits its replacement text names)
  leaves the racing operations as they were; dropping any other sync on top adds a race.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from streamcheck.analyses.sync_audit import Verdict, audit, edit
from streamcheck.core import trace as T
from streamcheck.core.trace import CallSite, StreamKind, device_label, stream_label
from tests.streamcheck.analyses.test_sync_audit import cover_of
from tests.streamcheck.core.test_hb_oracle import (CELL, RANGES, TALK_BUG, TALK_FIX, _examples, ancestors,
                                                   must_happen_before, programs, to_trace, unordered_conflicts)

RANGE_NAMES = {cells: name for name, cells in RANGES.items()}
FRESH_EVENT = 100  # events the replacements record: above every event a program uses

NB = StreamKind.NON_BLOCKING
# A host synchronize whose only reader is another stream: the replacement must order it.
SYNC_FOR_A_STREAM = ((NB, NB), 2, (("launch", 0, (), ((0, "all"),)), ("ssync", 0),
                                   ("launch", 1, ((0, "all"),), ())))
# Two waits on one record, each redundant alone, one needed.
DOUBLE_WAIT = ((NB, NB), 2, (("launch", 0, (), ((0, "all"),)), ("record", 1, 0), ("wait", 1, 1), ("wait", 1, 1),
                             ("launch", 1, ((0, "all"),), ())))
# Two host synchronizes of one stream, the later one needed alone: the earlier orders `k0` before
# `k4` too, so removing both unorders a pair that removing the later alone does not.
SYNC_TWICE = ((NB, NB), 1, (("launch", 0, (), ((0, "all"),)), ("ssync", 0), ("launch", 0, (), ((0, "all"),)),
                            ("ssync", 0), ("launch", 1, (), ((0, "all"),))))
# A device synchronize then an event synchronize: the host reads after both.
TWO_HOST_SYNCS = ((NB, NB), 2, (("launch", 0, (), ((0, "all"),)), ("record", 1, 0), ("dsync", 0), ("esync", 1),
                                ("hread", (0, "all"))))


def program_of(ops, swaps=None):
    """The oracle's program for a trace (to_trace's inverse), with each host sync occurrence in
    `swaps` (id of its trace operation -> operations) replaced by those (record/wait) operations.
    Returns (kinds, n_buffers, program, devices, lines, origins): lines[i] is the call-site line
    of program operation i, origins[i] the id of the trace operation it comes from (edits keep
    the operations they do not change, so an occurrence is the same one before and after)."""
    swaps = swaps or {}
    kinds, devices, n_buffers, program, lines, origins = {}, {}, 0, [], [], []

    def access(rng):
        return rng.buffer, RANGE_NAMES[tuple(range(rng.start // CELL, rng.stop // CELL))]

    def add(op, line, origin):
        program.append(op)
        lines.append(line)
        origins.append(origin)

    for op in ops:
        kind, line = type(op), op.site.line
        if kind is T.StreamCreate:
            kinds[op.stream], devices[op.stream] = StreamKind.parse(op.kind), op.device
        elif kind is T.Alloc:
            n_buffers += 1
        elif id(op) in swaps and kind in (T.StreamSync, T.EventSync, T.DeviceSync):
            for replacement in swaps[id(op)]:
                add(replacement, line, id(op))
        elif kind is T.Launch:
            add(("launch", op.stream, tuple(map(access, op.reads)), tuple(map(access, op.writes))), line, id(op))
        elif kind is T.EventRecord:
            add(("record", op.event, op.stream), line, id(op))
        elif kind is T.StreamWait:
            add(("wait", op.stream, op.event), line, id(op))
        elif kind is T.StreamSync:
            add(("ssync", op.stream), line, id(op))
        elif kind is T.EventSync:
            add(("esync", op.event), line, id(op))
        elif kind is T.DeviceSync:
            add(("dsync", op.device), line, id(op))
        elif kind is T.HostAccess:
            add(("hread", access(op.reads[0])) if op.reads else ("hwrite", access(op.writes[0])), line, id(op))
    order = sorted(kinds)
    assert order == list(range(len(order)))
    return (tuple(kinds[s] for s in order), n_buffers, tuple(program), tuple(devices[s] for s in order),
            tuple(lines), tuple(origins))


def oracle_races(ops, swaps=None) -> dict:
    """(line of first, line of second) -> race kinds, for every pair the oracle leaves unordered."""
    kinds, _, program, devices, lines, _ = program_of(ops, swaps)
    pairs = unordered_conflicts(program, ancestors(must_happen_before(kinds, program, devices)))
    return {(lines[i], lines[j]): found for (i, j), found in pairs.items()}


def oracle_pairs(ops, swaps=None) -> set:
    """(first, second) trace operations (by id) of every pair the oracle leaves unordered: one
    line run several times is several operations."""
    kinds, _, program, devices, _, origins = program_of(ops, swaps)
    pairs = unordered_conflicts(program, ancestors(must_happen_before(kinds, program, devices)))
    return {(origins[i], origins[j]) for i, j in pairs}


def replacement_ops(ops, finding) -> list:
    """The record/wait operations a device-side-suffices finding's replacement text names, with
    streams and events found by the labels and names reports use."""
    streams, events = {}, {}
    for op in ops:
        if type(op) is T.StreamCreate:
            label = stream_label(StreamKind.parse(op.kind), op.name, op.stream, op.thread)
            streams[label] = streams[device_label(label, op.device)] = op.stream
        elif type(op) is T.EventCreate:
            events[op.name] = op.event
    records, waits = [], []
    for replacement in finding.replacement:
        if replacement.event:
            waits.append(("wait", streams[replacement.wait_on], events[replacement.event]))
            continue
        source = streams[replacement.record_on]
        record = ("record", FRESH_EVENT + source, source)
        if record not in records:
            records.append(record)
        waits.append(("wait", streams[replacement.wait_on], FRESH_EVENT + source))
    return records + waits


def minimal_set(ops, result, drop=()):
    """The audit's minimal set as the oracle's races; `drop`: numbers of syncs removed on top."""
    by_number = {f.number: f for f in result.findings}
    removed = {by_number[n].sync.key for n in drop}
    return oracle_races(*minimal_edit(ops, result, removed))


def minimal_edit(ops, result, removed=(), drop_at=()):
    """(the trace as the minimal set edits it, its swaps for program_of); `removed`: keys dropped
    on top (every occurrence), `drop_at`: trace indexes dropped on top."""
    gone = set(drop_at) | {f.sync.indexes[n - 1] for f in result.findings for n in f.removed_at}
    swaps = {}
    for finding in result.findings:
        if finding.replaced_at and finding.sync.key not in removed:
            for n in finding.replaced_at:
                if finding.sync.indexes[n - 1] not in gone:
                    swaps[id(ops[finding.sync.indexes[n - 1]])] = replacement_ops(ops, finding)
    return edit(ops, remove=set(removed), drop=gone), swaps


def racing(races: dict) -> set:
    """The lines of the operations that race with an earlier one."""
    return {second for _, second in races}


def race_line(race) -> tuple:
    return race.first.site.line, race.second.site.line


@settings(max_examples=_examples(floor=200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(TALK_BUG)
@example(TALK_FIX)
@example(SYNC_FOR_A_STREAM)
@example(DOUBLE_WAIT)
@example(TWO_HOST_SYNCS)
@example(SYNC_TWICE)
@given(programs())
def test_every_verdict_holds_by_the_oracle(program):
    kinds, n_buffers, prog, *devices = program
    ops = list(to_trace(kinds, n_buffers, prog, devices[0] if devices else None))
    recorded = oracle_races(ops)
    result = audit(ops)
    assert bool(result.races) == bool(recorded), result.format()
    for finding in result.findings:
        event(finding.verdict.value)
        without = oracle_races(edit(ops, remove={finding.sync.key}))
        new = {pair: found for pair, found in without.items() if pair not in recorded}
        if finding.verdict is Verdict.REDUNDANT:
            assert racing(without) == racing(recorded), f"#{finding.number} is not redundant: {new}\n{result.format()}"
            cover = cover_of(result, finding)
            if cover is not None:  # removing both unorders a pair that removing the cover alone does not
                alone = oracle_races(edit(ops, remove={cover.sync.key}))
                both = oracle_races(edit(ops, remove={finding.sync.key, cover.sync.key}))
                assert set(both) - set(alone), f"#{finding.number} is not covered by #{cover.number}\n{result.format()}"
            if finding.reason.startswith("it orders no shared bytes"):  # then not even with all the others gone
                others = {f.sync.key for f in result.findings if f is not finding}
                assert oracle_races(edit(ops, remove=others | {finding.sync.key})) == oracle_races(
                    edit(ops, remove=others)), f"#{finding.number} does order shared bytes\n{result.format()}"
        else:
            assert finding.verdict is not Verdict.TIMING  # no queries in these programs
            assert new, f"#{finding.number} removed alone makes no race\n{result.format()}"
            for race in finding.prevents:  # in a racy run, a pair the checker did not report before
                assert race.kind in without.get(race_line(race), ()), (
                    f"#{finding.number}: the oracle has no {race.kind} at {race_line(race)}: {new}\n"
                    f"{result.format()}")

    assert racing(minimal_set(ops, result)) == racing(recorded), f"the minimal set is not sufficient\n{result.format()}"
    for number in result.keep + result.replaced:
        assert minimal_set(ops, result, drop=(number,)) != recorded, (
            f"the minimal set still holds without #{number}\n{result.format()}")
    event(f"{result.needed} of {len(result.findings)} needed")


def test_the_examples_reach_each_verdict():
    """The property's own examples get the verdicts they were written for (else it checks little)."""
    R, N, D, H = Verdict.REDUNDANT, Verdict.NECESSARY, Verdict.DEVICE_SIDE, Verdict.HOST_NEEDED
    for program, verdicts, needed in [(SYNC_FOR_A_STREAM, [D], 1), (DOUBLE_WAIT, [R, R], 1),
                                      (TWO_HOST_SYNCS, [R, R], 1), (TALK_FIX, [N, H], 2)]:
        result = audit(list(to_trace(*program)))
        assert [f.verdict for f in result.findings] == verdicts, result.format()
        assert result.needed == needed, result.format()


# --- occurrences: the same lines run several times -------------------------------------------

def looped(program, repeats: int) -> list:
    """The trace of `program`'s operations run `repeats` times as a loop body: each operation
    keeps its line at every iteration, so each synchronization is one site seen `repeats` times."""
    kinds, n_buffers, body, *devices = program
    ops = list(to_trace(kinds, n_buffers, body * repeats, devices[0] if devices else None))
    return [replace(op, site=CallSite(op.site.file, (op.site.line - 1) % len(body) + 1)) if op.site.line else op
            for op in ops]


# Issue 31's decode loop in the oracle's words: each step writes on stream 0 and syncs it; the
# host reads only after the last step, so only the last synchronize is needed.
DECODE_LOOP = ((NB, NB), 1, (("launch", 0, ((0, "all"),), ((0, "all"),)), ("ssync", 0)))
DECODE_LOOP_READ = ((NB, NB), 1, (("launch", 0, ((0, "all"),), ((0, "all"),)), ("ssync", 0), ("hread", (0, "all"))))


@settings(max_examples=_examples(floor=150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(DECODE_LOOP, 3)
@example(SYNC_FOR_A_STREAM, 2)
@example(DOUBLE_WAIT, 3)
@example(TALK_FIX, 2)
@given(programs(), st.integers(2, 3))
def test_every_occurrence_verdict_and_the_occurrence_level_set_hold_by_the_oracle(program, repeats):
    """Each occurrence's verdict (removing that occurrence alone), and the minimal set of
    occurrences as a whole, judged by the oracle on the operations that race (one line run
    several times is several operations)."""
    ops = looped(program, repeats)
    recorded = oracle_pairs(ops)
    result = audit(ops)
    racing_before = {second for _, second in recorded}
    for finding in result.findings:
        assert len(finding.at) == finding.sync.count
        for n, verdict in enumerate(finding.at, 1):
            event(f"occurrence {verdict.value}")
            without = oracle_pairs(edit(ops, drop={finding.sync.indexes[n - 1]}))
            if verdict is Verdict.REDUNDANT:
                assert {second for _, second in without} == racing_before, (
                    f"#{finding.number} at occurrence {n} is not redundant\n{result.format()}")
            else:
                assert without - recorded, f"#{finding.number} at occurrence {n} removed alone makes no race\n" \
                                           f"{result.format()}"
    edited, swaps = minimal_edit(ops, result)
    assert {second for _, second in oracle_pairs(edited, swaps)} == racing_before, (
        f"the minimal set is not sufficient\n{result.format()}")
    for finding in result.findings:
        for n in finding.kept + finding.replaced_at:
            edited, swaps = minimal_edit(ops, result, drop_at={finding.sync.indexes[n - 1]})
            assert oracle_pairs(edited, swaps) - recorded, (
                f"the minimal set still holds without #{finding.number} at occurrence {n}\n{result.format()}")
    partial = [f for f in result.findings if 0 < len(f.kept) + len(f.replaced_at) < f.sync.count]
    event("a site kept at some occurrences only" if partial else "every site kept whole or dropped")


def test_the_decode_loop_keeps_only_its_last_synchronize():
    """The loop example above gets the verdicts it was written for (else it checks little)."""
    R, H = Verdict.REDUNDANT, Verdict.HOST_NEEDED
    (finding,) = audit(looped(DECODE_LOOP_READ, 3)).findings
    assert finding.at == (H, H, H)  # the host reads after every step: each one is needed
    (finding,) = audit(looped(DECODE_LOOP, 3)).findings
    assert finding.at == (R, R, R)  # nothing reads: none is
    program = ((NB, NB), 1, DECODE_LOOP[2])
    ops = looped(program, 3) + [T.HostAccess(0, CallSite("oracle_program.py", 9), reads=(T.Range(0, 0, 8),),
                                             name="read after the loop")]
    (finding,) = audit(ops).findings
    assert finding.at == (R, R, H) and finding.kept == (3,) and finding.removed_at == (1, 2)
