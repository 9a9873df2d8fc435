"""Every sync plan of the FlashNorm pipeline, run on the sim: the checker's verdict
equals the oracle's, unsafe plans produce wrong values under injected schedules,
safe plans never do, and a reported example replays byte for byte.

The decode loop is commands/fuzz.run_program (upload x_t on the caller's stream,
one pipeline step, caller.synchronize(), read the output); oracle.py models the
same loop independently.

Which races cannot corrupt what the host reads: the write-after-read races on Y
and r (step t+1's matmul/rms overwriting what step t's post-scale still reads).
They never occur alone: unless the host's read of `out` is itself unordered (a RAW
race on `out`), caller.synchronize() and the host's issue order put step t+1's
matmul and rms after step t's post-scale. The wrong value the host sees comes
through that RAW race; the late post-scale of step t, fed step t+1's Y and r,
writes exactly step t+1's output. Every unsafe plan has at least one RAW race, and
every one of them is shown below to corrupt the values.
"""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given

from flashnorm_kernels.commands.fuzz import Example, run_example
from flashnorm_kernels.plan import CALLER_KINDS, EDGES, POST_STREAMS, SIDE_KINDS, SyncPlan
from flashnorm_kernels.testing import strategies as fst
from flashnorm_kernels.testing.oracle import hazards, is_safe, racy_buffers
from flashnorm_kernels.testing.strategies import Shape
from streamcheck import cli
from streamcheck import strategies as sst
from streamcheck.strategies import ScheduleChoice

TINY = Shape(tokens=2, hidden=8, out=4, dtype="float32")
STEPS = 2  # the oracle's claim, tested below: two steps show every hazard
KINDS = list(itertools.product(POST_STREAMS, SIDE_KINDS, CALLER_KINDS))
KIND_IDS = [f"post-{p}-{s}-caller-{c}" for p, s, c in KINDS]


def _plans(post, side, caller):
    """The 64 edge subsets for one (post stream, side kind, caller kind)."""
    return fst.all_plans(post_streams=[post], side_kinds=[side], caller_kinds=[caller])


def _buffers(races) -> frozenset:
    # fn.Y -> Y, fn.out0 -> out, x -> x: the oracle's names.
    return frozenset(re.sub(r"^fn\.", "", r.buffer).rstrip("0123456789") for r in races)


def test_enumeration_covers_every_plan_once():
    plans = fst.all_plans()
    assert len(plans) == 2 ** len(EDGES) * len(POST_STREAMS) * len(SIDE_KINDS) * len(CALLER_KINDS) == 1152
    assert len(set(plans)) == 1152
    assert plans[0] == SyncPlan.correct()


# --- the oracle on its own ------------------------------------------------------------------


def test_oracle_on_the_plans_the_design_names():
    assert is_safe(SyncPlan.correct())
    # The talk's bug: the post-scale reads Y with nothing ordering it after the matmul.
    bug = hazards(SyncPlan.implicit_join())
    assert {(h.kind, h.buffer, h.first.what, h.second.what) for h in bug} == {("RAW", "Y", "matmul", "postscale")}
    # Legacy caller + blocking side streams: the legacy stream's implicit joins are enough.
    assert is_safe(SyncPlan.implicit_join(side_kind="blocking"))
    assert is_safe(SyncPlan.correct(side_kind="blocking").without("fork_a", "fork_b", "join_rms"))
    # ... but blocking streams do not synchronize with each other.
    assert racy_buffers(SyncPlan.implicit_join(side_kind="blocking", caller_kind="blocking")) == {"Y"}
    assert racy_buffers(SyncPlan.correct(post_stream="B", side_kind="blocking").without("join_mm")) == {"Y"}
    # `war` is redundant while the caller waits (join_back) and forks; it matters without join_back.
    assert is_safe(SyncPlan.correct().without("war"))
    late = hazards(SyncPlan.correct(post_stream="A").without("join_back", "war"))
    assert ("WAR", "r", "postscale", "rms") in {(h.kind, h.buffer, h.first.what, h.second.what) for h in late}
    assert ("RAW", "out", "postscale", "read out") in {(h.kind, h.buffer, h.first.what, h.second.what)
                                                       for h in late}


def test_two_steps_show_every_hazard():
    for plan in fst.all_plans():
        two = {(h.kind, h.buffer.rstrip("0123456789")) for h in hazards(plan, 2)}
        three = {(h.kind, h.buffer.rstrip("0123456789")) for h in hazards(plan, 3)}
        assert two == three, plan.describe()


def test_war_races_never_come_alone():
    # The claim in the module docstring, checked over every plan.
    for plan in fst.all_plans():
        kinds = {(h.kind, h.buffer) for h in hazards(plan)}
        if any(kind == "WAR" for kind, _ in kinds):
            assert ("RAW", "out") in kinds, plan.describe()
        assert not kinds or any(kind == "RAW" for kind, _ in kinds)


# --- the checker against the oracle, every plan -------------------------------------------------


@pytest.mark.parametrize("post, side, caller", KINDS, ids=KIND_IDS)
def test_checker_verdict_equals_oracle_on_every_plan(post, side, caller):
    for plan in _plans(post, side, caller):
        outcome = run_example(Example(plan, TINY, ScheduleChoice("eager", 0), STEPS))
        assert _buffers(outcome.races) == racy_buffers(plan), f"{plan.describe()}\n{outcome.report}"


# Policies tried in turn until a plan's race strikes; fixed seeds, so the test is deterministic.
STRIKE_BUDGET = [ScheduleChoice(policy, seed, delay_steps=steps, pct_depth=depth)
                 for seed in range(8)
                 for policy, steps, depth in (("delay", 8, 2), ("pct", 8, 2), ("delay", 3, 3), ("pct", 8, 3))]


@pytest.mark.parametrize("post, side, caller", KINDS, ids=KIND_IDS)
def test_unsafe_plans_produce_wrong_values_under_delay_or_pct(post, side, caller):
    for plan in _plans(post, side, caller):
        if is_safe(plan):
            continue
        for choice in STRIKE_BUDGET:
            outcome = run_example(Example(plan, TINY, choice, STEPS))
            assert outcome.races, plan.describe()
            if outcome.wrong:
                break
        else:
            pytest.fail(f"{plan.describe()}: no wrong value in {len(STRIKE_BUDGET)} delay/pct schedules")


@pytest.mark.parametrize("post, side, caller", KINDS, ids=KIND_IDS)
def test_safe_plans_are_bitwise_sequential_under_random_schedules(post, side, caller):
    for plan in _plans(post, side, caller):
        if not is_safe(plan):
            continue
        for seed in range(3):
            outcome = run_example(Example(plan, TINY, ScheduleChoice("random", seed), STEPS))
            assert not outcome.races and not outcome.wrong, f"{plan.describe()} random seed {seed}\n{outcome.report}"


@given(plan=fst.sync_plans(), shape=fst.shapes(), choice=sst.schedule_choices())
def test_drawn_examples_agree_with_the_oracle(plan, shape, choice):
    # Any shape and dtype, any schedule: races iff the oracle says unsafe; a safe plan's values
    # are exactly the sequential run's.
    outcome = run_example(Example(plan, shape, choice, STEPS))
    assert _buffers(outcome.races) == racy_buffers(plan), outcome.report
    if is_safe(plan):
        assert not outcome.wrong


# --- replay -----------------------------------------------------------------------------------


def _struck(plan):
    """The first example of `plan` whose race strikes, from the fixed budget."""
    for choice in STRIKE_BUDGET:
        outcome = run_example(Example(plan, TINY, choice, 3))
        if outcome.wrong:
            return outcome
    raise AssertionError(f"{plan.describe()} never struck")


def test_replaying_a_reported_example_reproduces_it_byte_for_byte():
    first = _struck(SyncPlan.implicit_join())
    again = run_example(Example.parse(first.example.token()))
    assert again.example == first.example
    assert again.wrong and again.schedule == first.schedule and again.report == first.report
    assert [o.tobytes() for o in again.outputs] == [o.tobytes() for o in first.outputs]
    # The recorded decisions replay the interleaving with no seed at all.
    assert first.decisions and first.decisions in first.schedule
    replayed = run_example(Example(first.example.plan, TINY, ScheduleChoice(f"replay:{first.decisions}"), 3))
    assert [o.tobytes() for o in replayed.outputs] == [o.tobytes() for o in first.outputs]
    # The stale value is the talk's symptom: step t reads step t-1's Y.
    assert not np.array_equal(first.outputs[-1], run_example(
        Example(SyncPlan.correct(), TINY, first.example.choice, 3)).outputs[-1])


# --- the command ------------------------------------------------------------------------------


def test_fuzz_command_finds_unsafe_plans_and_prints_replays(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # each replay on one line
    status = cli.main(["fuzz", "--budget", "1.5s", "--plans", "unsafe", "--seed", "1", "--steps", "2"])
    out = capsys.readouterr()
    assert status == 1, out.out
    assert re.search(r"streamcheck fuzz: (\d+) examples in [\d.]+ s \([\d.]+ examples/s\)", out.out)
    assert "oracle disagreements: 0" in out.out
    assert out.err == ""  # the progress bar is drawn only on a terminal
    replay = re.search(r"replay: streamcheck fuzz --backend sim --replay (\S+)", out.out).group(1)
    status = cli.main(["fuzz", "--replay", replay.strip("'")])
    first = capsys.readouterr().out
    assert status == 1 and "race" in first
    assert cli.main(["fuzz", "--replay", replay.strip("'")]) == 1
    assert capsys.readouterr().out == first  # byte for byte


def test_fuzz_command_on_safe_plans_finds_nothing(capsys):
    status = cli.main(["fuzz", "--examples", "300", "--plans", "safe", "--quiet", "--seed", "2"])
    out = capsys.readouterr()
    assert status == 0, out.out
    assert out.out.startswith("streamcheck fuzz: 300 examples in ")
    assert "races found in 0 plans, wrong values in 0; oracle disagreements: 0" in out.out
    assert out.err == ""


@pytest.mark.parametrize("args, message", [
    (["--budget", "soon"], "--budget 'soon': expected a duration like 60s"),
    (["--budget", "0s"], "the budget must be positive"),
    (["--steps", "1"], "--steps 1: need at least 2"),
    (["--profile", "nope"], "--profile 'nope' is not a registered hypothesis profile"),
    (["--replay", "missing=bogus"], "replay token lacks"),
])
def test_fuzz_command_bad_options_exit_2(capsys, args, message):
    assert cli.main(["fuzz", *args]) == 2
    assert message in capsys.readouterr().err


def test_fuzz_command_cupy_without_a_gpu_exits_2(capsys):
    from streamcheck.device.backends import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present: --backend cupy is valid here")
    assert cli.main(["fuzz", "--backend", "cupy", "--budget", "1s"]) == 2
    assert "--backend cupy needs an NVIDIA GPU and CuPy" in capsys.readouterr().err


def test_fuzz_command_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["fuzz", "--plans", "some"])
    assert exc.value.code == 2
    assert "invalid choice: 'some'" in capsys.readouterr().err
