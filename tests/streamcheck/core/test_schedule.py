"""Schedule policies: deterministic given a seed, different across seeds, replayable
decision by decision, and loud about bad input."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcheck.device import Device
from streamcheck.core.schedule import (HOST, POLICIES, PCT, Delay, Policy, Schedule, ScheduleError, compact,
                                  directed_delay, make_policy, parse_compact)

EXPLORING = [("random", {}), ("pct", {}), ("pct", {"depth": 3}), ("delay", {}), ("delay", {"streams": ["A"]})]


def racy_program(dev, steps=4):
    """Three streams, shared buffers, some joins missing: the interleaving shows in the values."""
    a, b, c = dev.stream("A"), dev.stream("B"), dev.stream("C")
    x = dev.alloc((4,), "float32", name="x", fill=0.0)
    y = dev.alloc((4,), "float32", name="y", fill=0.0)
    log = dev.alloc((3 * steps, 4), "float32", name="log", fill=-1.0)

    def bump(x, by):
        x += by

    def snap(row, src):
        row[...] = src

    row = 0
    for t in range(steps):
        dev.launch(lambda x, t=t: bump(x, t + 1), (x,), stream=a, writes=[x], name="bump_x")
        dev.launch(snap, (log[row:row + 1], x), stream=b, reads=[x], writes=[log[row:row + 1]])
        row += 1
        if t % 2:
            c.wait_event(a.record())
        dev.launch(lambda y, x: np.add(y, x, out=y), (y, x), stream=c, reads=[x], writes=[y], name="acc")
        dev.launch(snap, (log[row:row + 1], y), stream=b, reads=[y], writes=[log[row:row + 1]])
        row += 1
        dev.launch(snap, (log[row:row + 1], x), stream=a, reads=[x], writes=[log[row:row + 1]])
        row += 1
        if t == 1:
            b.synchronize()
    dev.synchronize()
    return dev.host_read(log)


def run(policy, seed=0, **params):
    dev = Device("sim", check=False, policy=policy, seed=seed, **params)
    values = racy_program(dev)
    return dev, values


def order(dev):
    """The executed order: trace indices sorted by their execution step."""
    return tuple(sorted(dev.backend.op_times, key=dev.backend.op_times.get))


# --- determinism ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy, params", EXPLORING)
def test_same_seed_gives_the_same_order_and_values(policy, params):
    for seed in (0, 1, 17):
        first, v1 = run(policy, seed, **params)
        second, v2 = run(policy, seed, **params)
        assert first.schedule.compact() == second.schedule.compact()
        assert first.backend.op_times == second.backend.op_times
        assert v1.tobytes() == v2.tobytes()


@pytest.mark.parametrize("policy", ["random", "pct"])
def test_different_seeds_give_different_orders(policy):
    # Not deterministic unless seeded: across seeds the policy explores.
    runs = [run(policy, seed) for seed in range(20)]
    assert len({order(dev) for dev, _ in runs}) >= 2
    assert len({values.tobytes() for _, values in runs}) >= 2


def test_sequential_and_eager_ignore_the_seed_and_never_leave_work_pending():
    for policy in ("sequential", "eager"):
        orders = {order(run(policy, seed)[0]) for seed in range(5)}
        assert len(orders) == 1
    dev = Device("sim", policy="sequential")
    a = dev.stream("A")
    x = dev.alloc((1,), "float32", fill=0.0)
    dev.launch(lambda x: x.fill(1), (x,), stream=a, writes=[x])
    assert dev.backend.pending() == 0 and dev.host_read(x)[0] == 1.0


# --- replay --------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy, params", EXPLORING)
def test_replay_of_the_compact_string_reproduces_order_and_values_byte_for_byte(policy, params):
    for seed in range(5):
        original, values = run(policy, seed, **params)
        replayed, again = run(f"replay:{original.schedule.compact()}")
        assert order(replayed) == order(original)
        assert replayed.backend.op_times == original.backend.op_times
        assert again.tobytes() == values.tobytes()
        assert replayed.schedule.compact() == original.schedule.compact()
        assert replayed.backend.policy.remaining == 0


def test_replay_accepts_the_printed_schedule_line():
    original, values = run("pct", 5, depth=3)
    printed = str(original.schedule)
    assert printed.startswith("pct(seed=5, depth=3) seed=5 schedule=")
    replayed, again = run(f"replay:{printed}")
    assert again.tobytes() == values.tobytes() and order(replayed) == order(original)


def test_replay_hint_rebuilds_the_run_both_ways():
    original, values = run("delay", 3, steps=5, streams=["A", "C"])
    sched = original.schedule
    assert sched.seed_args() == {"policy": "delay", "seed": 3, "steps": 5, "streams": ["A", "C"]}
    assert sched.replay_args() == {"policy": "replay:" + sched.compact()}
    for args in (sched.seed_args(), sched.replay_args()):
        dev = Device("sim", check=False, **args)
        assert racy_program(dev).tobytes() == values.tobytes()
        assert order(dev) == order(original)
    hint = sched.replay_hint()
    assert "policy='delay', seed=3, steps=5, streams=['A', 'C']" in hint and sched.compact() in hint


def test_replay_of_a_string_that_does_not_fit_the_program_raises():
    original, _ = run("random", 4)
    text = original.schedule.compact()
    # Another program: the recorded stream ids are not ready there.
    with pytest.raises(ScheduleError, match="does not fit this program"):
        dev = Device("sim", policy="replay:" + text)
        s = dev.stream("only")
        x = dev.alloc((1,), "float32", fill=0.0)
        for _ in range(20):
            dev.launch(lambda x: None, (x,), stream=s, writes=[x])
        dev.synchronize()
    # The same program, cut short: the schedule runs out.
    cut = compact(parse_compact(text)[: len(parse_compact(text)) // 2])
    with pytest.raises(ScheduleError, match="needs more"):
        run("replay:" + cut)
    # A host decision where the host is blocked in a synchronize.
    with pytest.raises(ScheduleError, match="blocked in a synchronize"):
        dev = Device("sim", policy="replay:h.h.h.h")
        a = dev.stream("A")
        x = dev.alloc((1,), "float32", fill=0.0)  # h
        dev.launch(lambda x: None, (x,), stream=a, writes=[x])  # h: left pending
        a.synchronize()  # wants stream 1, the string says h


def test_replay_remaining_reports_a_program_that_ended_early():
    original, _ = run("random", 2)
    dev = Device("sim", policy="replay:" + original.schedule.compact() + ".h.h")
    racy_program(dev)
    assert dev.backend.policy.remaining == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just(HOST), st.integers(0, 12)), max_size=40))
def test_compact_round_trips(decisions):
    text = compact(decisions)
    assert parse_compact(text) == decisions
    assert parse_compact(f"random(seed=1) seed=1 schedule={text or '-'}") == decisions


def test_compact_is_run_length_encoded():
    assert compact([2, 2, 2, HOST, 1, HOST, HOST]) == "2x3.h.1.hx2"
    assert parse_compact("2x3.h.1.hx2") == [2, 2, 2, HOST, 1, HOST, HOST]


@pytest.mark.parametrize("bad", ["2x", "x3", "h2", "-1", "2x0", "a", "1..2", "1.2.", "١"])
def test_bad_schedule_strings_raise_a_clear_error(bad):
    with pytest.raises(ScheduleError, match="bad schedule string token"):
        make_policy("replay:" + bad)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, params, message", [
    ("fifo", {}, "unknown schedule policy 'fifo'; choose one of: sequential, eager, delay, random, pct"),
    ("Delay", {}, "unknown schedule policy"),
    ("replay", {}, "needs the schedule string"),
    ("delay", {"steps": -1}, "delay: steps must be an integer >= 0, got -1"),
    ("delay", {"steps": 2.5}, "steps must be an integer"),
    ("delay", {"steps": True}, "steps must be an integer"),
    ("delay", {"streams": [1]}, "streams must be non-empty strings"),
    ("delay", {"kernels": 3}, "kernels must be a name or a list of names"),
    ("pct", {"depth": 0}, "pct: depth must be an integer >= 1, got 0"),
    ("pct", {"depth": -2}, "depth must be an integer >= 1"),
    ("pct", {"horizon": 0}, "horizon must be an integer >= 1"),
    ("random", {"steps": 3}, "policy 'random' does not take steps; it takes: no parameters"),
    ("pct", {"steps": 3}, "policy 'pct' does not take steps; it takes: depth, horizon"),
    ("replay:1", {"depth": 2}, "replay takes no parameters"),
])
def test_bad_policy_input_raises_schedule_error(name, params, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_policy(name, 0, **params)
    with pytest.raises(ValueError):  # ScheduleError is a ValueError: usage errors stay catchable as such
        Device("sim", policy=name, **params)


def test_bad_seed_and_policy_types_raise():
    with pytest.raises(ScheduleError, match="seed must be an integer"):
        make_policy("random", "7")
    with pytest.raises(ScheduleError, match="policy must be a string"):
        make_policy(3)


def test_none_parameters_take_their_defaults():
    assert make_policy("delay", 0, steps=None).steps == Delay().steps
    assert make_policy("eager", 0, steps=None).name == "eager"


def test_every_named_policy_builds():
    for name in POLICIES:
        policy = make_policy("replay:" if name == "replay" else name, 1)
        assert policy.name == name


def test_a_policy_that_picks_an_unready_stream_is_refused():
    class Wrong(Policy):
        def choose(self, ready, host_may_continue):
            return 99 if ready else HOST

    dev = Device("sim", policy=Wrong())
    a = dev.stream("A")
    x = dev.alloc((1,), "float32", fill=0.0)
    with pytest.raises(ScheduleError, match="chose stream 99, which has no ready operation"):
        dev.launch(lambda x: None, (x,), stream=a, writes=[x])


def test_a_policy_that_lets_a_blocked_host_go_on_is_refused():
    class Lazy(Policy):
        def choose(self, ready, host_may_continue):
            return HOST

    dev = Device("sim", policy=Lazy())
    a = dev.stream("A")
    x = dev.alloc((1,), "float32", fill=0.0)
    dev.launch(lambda x: None, (x,), stream=a, writes=[x])
    with pytest.raises(ScheduleError, match="blocked in a synchronize"):
        a.synchronize()


# --- the policies themselves ---------------------------------------------------------------------


def test_pct_draws_depth_minus_one_change_points_within_the_horizon():
    for depth in (1, 2, 5):
        pct = PCT(seed=3, depth=depth, horizon=50)
        assert len(pct.change_points) == depth - 1
        assert all(1 <= p <= 50 for p in pct.change_points)
    assert PCT(seed=1, depth=3).change_points == PCT(seed=1, depth=3).change_points


def test_pct_with_depth_one_runs_a_fixed_priority_order():
    # Without change points the highest-priority participant always wins: the same
    # participant is chosen every time it is one of the options.
    pct = PCT(seed=0, depth=1)
    choices = [pct.choose([0, 1, 2], True) for _ in range(20)]
    assert len(set(choices)) == 1


def test_pct_change_point_demotes_the_running_participant():
    pct = PCT(seed=0, depth=2, horizon=1)  # the change point is the first decision
    first = max([0, 1, HOST], key=pct._prio)
    assert pct.choose([0, 1], True) != first
    assert pct.priority[first] < min(p for who, p in pct.priority.items() if who != first)


def test_random_offers_the_host_as_an_option():
    policy = make_policy("random", 0)
    picks = {policy.choose([1, 2], True) for _ in range(200)}
    assert picks == {1, 2, HOST}
    assert {policy.choose([1, 2], False) for _ in range(100)} == {1, 2}


def test_delay_reports_targets_that_never_matched():
    # Streams and kernels together target those launches on those streams.
    dev = Device("sim", policy="delay", streams=["A", "matmul"], kernels=["rms", "postscale"])
    a = dev.stream("A")
    x = dev.alloc((1,), "float32", fill=0.0)
    dev.launch(lambda x: None, (x,), stream=a, writes=[x], name="rms")
    assert dev.backend.policy.unmatched() == ["matmul", "postscale"]


def test_delay_after_and_every_pick_which_targeted_launches_strike():
    dev = Device("sim", policy="delay", streams=["A"], kernels=["k"], steps=100, after=2, every=3)
    a = dev.stream("A")
    x = dev.alloc((1,), "float32", fill=0.0)
    held = []
    for i in range(9):
        dev.launch(lambda x: None, (x,), stream=a, writes=[x], name="k")
        held.append(dev.backend.pending() > 0)  # still queued: held back
        a.synchronize()  # drains it regardless of the delay
    assert held == [False, False, True, False, False, True, False, False, True]


def test_delay_holds_for_exactly_its_steps_of_host_calls():
    # steps=3: the held launch runs once the third later host call is issued, not one call later.
    dev = Device("sim", check=False, policy="delay", streams=["A"], steps=3)
    a, b = dev.stream("A"), dev.stream("B")
    x, y = dev.alloc((1,), "float32", fill=0.0), dev.alloc((1,), "float32", fill=0.0)
    dev.launch(lambda x: None, (x,), stream=a, writes=[x], name="held")
    pending = [dev.backend.pending()]
    for _ in range(5):
        dev.launch(lambda y: None, (y,), stream=b, writes=[y], name="other")
        pending.append(dev.backend.pending())
    assert pending == [1, 1, 1, 0, 0, 0]


def test_the_race_directed_delay_of_a_free_or_a_copy_is_by_stream_alone():
    # A free or a copy has no kernel name a delay could match: the delay names its stream only.
    dev = Device("sim", check=True)
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((4,), "float32", name="x", fill=0.0)
    dev.launch(lambda x: None, (x,), stream=a, writes=[x], name="produce")
    dev.launch(lambda x: None, (x,), stream=b, reads=[x], name="consume")
    (race,) = dev.races
    assert directed_delay(race) == ("A", "produce")
    for first in ("free", "copy D2H"):
        moved = dataclasses.replace(race, first=dataclasses.replace(race.first, name=first))
        assert directed_delay(moved) == ("A", None)
    host = dataclasses.replace(race, first=dataclasses.replace(race.first, actor="host thread 0"))
    assert directed_delay(host) is None  # the host's access: nothing to delay


def test_schedule_prints_policy_seed_and_string():
    dev, _ = run("delay", 2, steps=3, streams=["B"])
    text = str(dev.schedule)
    assert text.startswith("delay(steps=3, streams=B) seed=2 schedule=")
    assert isinstance(dev.schedule, Schedule) and text.endswith(dev.schedule.compact())
