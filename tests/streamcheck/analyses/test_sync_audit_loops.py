"""The sync audit per occurrence, on the loop patterns where the waste usually is (issue 31):
a decode loop that synchronizes every step although the host reads after the last one; a token
read back every step that only every 2nd step consumes; a staging buffer the host rewrites every
other step; and the a/b example, where the minimal set must minimize what blocks the host.

Each program's verdicts per occurrence and its minimal set are written down by hand below, then
checked against the audit, and the minimal set checked as a whole by core.hb.check (race-free,
and every occurrence it keeps or replaces needed: dropping it on top makes a race).
"""
from __future__ import annotations

import re

import pytest

from streamcheck.analyses.sync_audit import SyncEdits, Verdict, audit, occurrences_phrase
from streamcheck.core import trace as T
from streamcheck.core.hb import check
from streamcheck.device import Device

R, N, D, H = Verdict.REDUNDANT, Verdict.NECESSARY, Verdict.DEVICE_SIDE, Verdict.HOST_NEEDED


def step(state):
    state[...] = state + 1


def produce(x):
    x[...] = x + 1


def consume(x, y):
    y[...] = x * 2


def decode_loop(dev, steps=3):
    """A decode loop that synchronizes after every step; the host reads the pinned output once,
    after the last (HabanaAI/vllm-fork#409)."""
    s = dev.stream("S")
    state, out = dev.alloc(4, name="state", fill=0), dev.alloc(4, name="out", fill=0)
    for _ in range(steps):
        dev.launch(step, (state,), stream=s, reads=[state], writes=[state], name="step")
        dev.copy(out, state, stream=s)  # into the pinned output
        s.synchronize()
    return dev.host_read(out)


def token_read_every_2nd(dev, steps=6):
    """A token copied back every step; only every 2nd step's host consumes it."""
    s = dev.stream("S")
    state, token = dev.alloc(4, name="state", fill=0), dev.alloc(4, name="token", fill=0)
    seen = []
    for k in range(1, steps + 1):
        dev.launch(step, (state,), stream=s, reads=[state], writes=[state], name="sample")
        dev.copy(token, state, stream=s)
        s.synchronize()
        if k % 2 == 0:
            seen.append(dev.host_read(token))
    return seen


def staging_rewritten_every_other_step(dev, steps=6):
    """The host rewrites a staging buffer at every other step; the stream reads it at every step."""
    s = dev.stream("S")
    staging, dst, acc = (dev.alloc(4, name=name, fill=0) for name in ("staging", "input", "acc"))
    for k in range(1, steps + 1):
        if k % 2 == 1:
            dev.host_write(staging, k)
        dev.copy(dst, staging, stream=s)
        dev.launch(consume, (dst, acc), stream=s, reads=[dst], writes=[acc], name="use")
        s.synchronize()
    return dev.get(acc, stream=s)


def a_then_b(dev, steps=3):
    """Issue 31 §2: per step, produce on A, a.synchronize(), consume on B, b.synchronize(); then
    dev.synchronize() and the host reads."""
    a, b = dev.stream("A"), dev.stream("B")
    x, y = dev.alloc(4, name="x", fill=0), dev.alloc(4, name="y", fill=0)
    for _ in range(steps):
        dev.launch(produce, (x,), stream=a, reads=[x], writes=[x], name="produce")
        a.synchronize()
        dev.launch(consume, (x, y), stream=b, reads=[x], writes=[y], name="consume")
        b.synchronize()
    dev.synchronize()
    return dev.host_read(y)


# (program, per finding: (kind, verdict of each occurrence, kept, replaced, removed), summary), by hand.
PATTERNS = {
    "decode loop": (decode_loop, [("stream synchronize", (R, R, H), (3,), (), (1, 2))],
                    "1 of 3 synchronizations are needed, at 1 of 1 site; removable: #1 (at occurrences 1, 2 of 3)"),
    "token every 2nd": (token_read_every_2nd, [("stream synchronize", (R, H) * 3, (2, 4, 6), (), (1, 3, 5))],
                        "3 of 6 synchronizations are needed, at 1 of 1 site; "
                        "removable: #1 (at occurrences 1, 3, 5 (every 2nd))"),
    # The host writes before steps 3 and 5: steps 2 and 4 must have read the staging buffer by
    # then. Step 6's synchronize and the get's (it adds no order after it) order the same read
    # of `acc`: of the two, the later goes.
    "staging": (staging_rewritten_every_other_step,
                [("stream synchronize", (R, H, R, H, R, R), (2, 4, 6), (), (1, 3, 5)), ("host read", (R,), (), (), (1,))],
                "3 of 7 synchronizations are needed, at 1 of 2 sites; removable: #1 (at occurrences 1, 3, 5 (every 2nd)), #2"),
    # a.synchronize() orders only B after A: a device-side wait every step. b.synchronize() orders
    # the next step's produce (A rewrites x while B reads it) at steps 1 and 2; at step 3 only the
    # host read needs it, which dev.synchronize() orders too. The host blocks once, at the end.
    "a/b": (a_then_b, [("stream synchronize", (D, D, D), (), (1, 2, 3), ()),
                       ("stream synchronize", (D, D, R), (3,), (1, 2), ()),
                       ("device synchronize", (R,), (), (), (1,))],
            "6 of 7 synchronizations are needed, at 2 of 3 sites (5 as device-side waits instead of host "
            "synchronizes); removable: #3"),
}


def recorded(program) -> list:
    dev = Device("sim")
    program(dev)
    assert not dev.races
    return list(dev.trace)


@pytest.mark.parametrize("name", PATTERNS)
def test_each_occurrence_gets_its_verdict_and_the_minimal_set_keeps_occurrences(name):
    program, want, summary = PATTERNS[name]
    ops = recorded(program)
    result = audit(ops)
    text = result.format(width=10_000)
    got = [(f.sync.kind, f.at, f.kept, f.replaced_at, f.removed_at) for f in result.findings]
    assert got == want, text
    assert result.summary() == summary, text
    # The set as a whole: race-free; each occurrence it keeps or replaces, dropped on top, races.
    assert check(result.apply(ops)) == [], text
    for f in result.findings:
        for n in f.kept + f.replaced_at:
            assert check(result.apply(ops, drop_at=((f.number, n),))), f"#{f.number} at {n} is not needed\n{text}"
    # And each verdict per occurrence: removing a redundant one alone leaves the run race-free,
    # removing a needed one alone does not.
    from streamcheck.analyses.sync_audit import edit
    for f in result.findings:
        for n, verdict in enumerate(f.at, 1):
            races = check(edit(ops, drop={f.sync.indexes[n - 1]}))
            assert bool(races) is (verdict is not R) or f.sync.kind == "host read", f"#{f.number} at {n}\n{text}"


def test_a_site_needed_at_its_last_occurrence_says_synchronize_once_after_the_loop():
    result = audit(recorded(decode_loop))
    text = result.format(width=10_000)
    (finding,) = result.findings
    assert finding.where == "at the last of 3 occurrences: synchronize once after the loop"
    assert re.search(r"^  1  host needed \(1 of 3\)  stream synchronize", text, re.M), text
    assert "  #1 host needed at the last of 3 occurrences: synchronize once after the loop; " in text
    assert "      the other 2 occurrences are redundant: covered: a later occurrence of it" in text
    # Why the host synchronize stays: what the host reads there.
    assert re.search(r"^    #1 \(at the last of 3 occurrences\) stays a host synchronize: the host reads `out` "
                     r"bytes \[0, 16\) at \S+:\d+, which `copy D2D` on stream S", text, re.M), text
    data = result.to_dict()
    assert (data["needed"], data["total"], data["sites"]) == (1, 3, 1)
    assert data["findings"][0]["occurrences"] == ["redundant", "redundant", "host needed"]
    assert data["findings"][0]["kept"] == [3] and data["findings"][0]["removed"] == [1, 2]


def test_a_site_needed_every_2nd_occurrence_says_so():
    result = audit(recorded(token_read_every_2nd))
    (finding,) = result.findings
    assert finding.where == "at occurrences 2, 4, 6 (every 2nd)"
    assert "  #1 host needed at occurrences 2, 4, 6 (every 2nd); " in result.format(width=10_000)


def test_a_site_needed_at_every_occurrence_reads_as_a_site_seen_once():
    def every_step(dev):
        s = dev.stream("S")
        x = dev.alloc(4, name="x", fill=0)
        out = []
        for _ in range(3):
            dev.launch(produce, (x,), stream=s, reads=[x], writes=[x], name="produce")
            s.synchronize()
            out.append(dev.host_read(x))
        return out

    result = audit(recorded(every_step))
    (finding,) = result.findings
    assert finding.at == (H, H, H) and finding.where == ""
    text = result.format(width=10_000)
    assert re.search(r"^  1  host needed  stream synchronize", text, re.M), text
    assert f"  #1 host needed: {finding.reason}" in text
    assert result.summary() == "3 of 3 synchronizations are needed, at 1 of 1 site"


@pytest.mark.parametrize("ordinals, count, phrase", [
    ((1, 2, 3), 3, "at every occurrence"),
    ((3,), 3, "at the last of 3 occurrences"),
    ((1,), 3, "at the first of 3 occurrences"),
    ((2,), 3, "at occurrence 2 of 3"),
    ((2, 4, 6), 6, "at occurrences 2, 4, 6 (every 2nd)"),
    ((3, 6, 9), 9, "at occurrences 3, 6, 9 (every 3rd)"),
    ((1, 2, 5), 6, "at occurrences 1, 2, 5 of 6"),
    (tuple(range(2, 33)), 32, "at every occurrence but the first"),
    (tuple(range(1, 32)), 32, "at every occurrence but the last"),
    (tuple(n for n in range(1, 33) if n not in (4, 9)), 32, "at every occurrence but occurrences 4, 9"),
    (tuple(range(3, 33)), 32, "at every occurrence but occurrences 1, 2"),
    (tuple(range(4, 33)), 32, "at occurrences 4, 5, 6, 7, 8, 9, 10, 11, ... of 32"),
])
def test_occurrences_are_said_the_way_a_user_changes_code(ordinals, count, phrase):
    assert occurrences_phrase(ordinals, count) == phrase


def test_the_minimal_set_keeps_one_host_synchronize_at_the_end_and_says_why():
    """Issue 31 §2: the set with both loop syncs as device-side waits and one host block at the
    end, not b.synchronize() kept three times; and the replaced a.synchronize() is not 'little to
    gain', since the host now runs ahead to the end."""
    result = audit(recorded(a_then_b))
    text = result.format(width=10_000)
    blocking = sum(len(f.kept) for f in result.findings if f.sync.host_blocking)
    assert blocking == 1, text
    first, second, _ = result.findings
    assert "little to gain" not in first.gain and first.gain.startswith("after it the host issues "), text
    assert re.search(r"^    #2 \(at the last of 3 occurrences\) stays a host synchronize: the host reads `y` bytes "
                     r"\[0, 16\) at \S+:\d+, which `consume` on stream B", text, re.M), text
    assert "    replace by device-side waits: #1, #2 (at occurrences 1, 2 of 3)" in text


def test_edits_skip_occurrences_not_whole_sites():
    """SyncEdits counts each key's occurrences as the program issues them: the rerun of the
    decode loop makes the last synchronize only."""
    ops = recorded(decode_loop)
    result = audit(ops)
    edits = result.edits()
    rerun = Device("sim", policy="sequential")
    rerun.edit_syncs(edits)
    value = decode_loop(rerun)
    assert value.tolist() == [3, 3, 3, 3] and not rerun.races
    syncs = [op for op in rerun.trace if type(op) is T.StreamSync]
    assert len(syncs) == 1 and edits.every_edit_met
    assert edits.same_path({result.findings[0].sync.key: 3})
    # The same edits travel as JSON (the GPU proof's reruns) with their occurrences.
    again = SyncEdits.from_json(edits.to_json())
    assert again.remove == {result.findings[0].sync.key: frozenset({1, 2})}
    assert again.counts == {result.findings[0].sync.key: 3}


@pytest.mark.parametrize("name", PATTERNS)
def test_the_sim_proof_skips_the_occurrences_the_set_drops_and_the_reruns_agree(name):
    """The minimal set of each pattern, executed: the reruns skip (or replace) exactly those
    occurrences under delays and random schedules, and give the sequential run's values with no
    race."""
    from streamcheck.proofs.sync_proof import prove

    program, want, _ = PATTERNS[name]
    proof = prove(program, schedules=4)
    assert [(f.kept, f.replaced_at, f.removed_at) for f in proof.audit.findings] == [w[2:] for w in want]
    assert proof.removable is True and len(proof.runs) == 4, proof.format()
    edits = proof.audit.edits()
    rerun = Device("sim", policy="delay", seed=1)
    rerun.edit_syncs(edits)
    program(rerun)
    host_syncs = sum(1 for op in rerun.trace if type(op) in (T.StreamSync, T.DeviceSync))
    assert host_syncs == sum(len(f.kept) for f in proof.audit.findings if f.sync.host_blocking), proof.format()


def test_a_line_whose_occurrences_cover_each_other_keeps_one():
    """The same wait twice in a row from a loop: either occurrence alone orders the consumer,
    so each is redundant alone, and the set keeps one (the earlier: the later goes first)."""
    def wait_twice(dev):
        a, b = dev.stream("A"), dev.stream("B")
        x, y = dev.alloc(4, name="x", fill=0), dev.alloc(4, name="y", fill=0)
        dev.launch(produce, (x,), stream=a, reads=[x], writes=[x], name="produce")
        done = a.record(dev.event("done"))
        for _ in range(2):
            b.wait_event(done)
        dev.launch(consume, (x, y), stream=b, reads=[x], writes=[y], name="consume")
        return dev.get(y, stream=b)

    ops = recorded(wait_twice)
    result = audit(ops)
    wait = result.findings[0]
    assert wait.sync.kind == "wait_event" and wait.at == (R, R), result.format()
    assert wait.reason.startswith("covered: removing every occurrence makes a race, removing any one alone does not")
    assert (wait.kept, wait.removed_at) == ((1,), (2,))
    assert check(result.apply(ops)) == [] and check(result.apply(ops, drop_at=((1, 1),)))
