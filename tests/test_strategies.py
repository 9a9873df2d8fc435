"""Hypothesis strategies and profiles: what they draw, how they shrink, what they select."""
from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample

from flashnorm_kernels.pipeline import DTYPES, normalize_dtype
from flashnorm_kernels.plan import EDGES, SyncPlan
from streamcheck import strategies as sst
from streamcheck.device import Device
from streamcheck.oracle import is_safe
from streamcheck.trace import StreamKind


@given(sst.shapes(max_tokens=3, max_hidden=5, max_out=7))
def test_shapes_stay_within_bounds_and_pipeline_dtypes(shape):
    assert 1 <= shape.tokens <= 3 and 1 <= shape.hidden <= 5 and 1 <= shape.out <= 7
    assert normalize_dtype(shape.dtype) in DTYPES


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0), dict(max_hidden=-1), dict(max_out=1.5), dict(dtypes=())])
def test_bad_shape_bounds_are_refused(kwargs):
    with pytest.raises(ValueError, match=r"shapes\("):
        sst.shapes(**kwargs)


def test_plans_shrink_towards_the_fewest_missing_edges():
    assert find(sst.sync_plans(), lambda p: True) == SyncPlan.correct()
    assert find(sst.sync_plans(), lambda p: "join_mm" not in p.edges) == SyncPlan.implicit_join()
    smallest_unsafe = find(sst.sync_plans(), lambda p: not is_safe(p))
    assert len(set(EDGES) - smallest_unsafe.edges) == 1
    assert (smallest_unsafe.post_stream, smallest_unsafe.side_kind, smallest_unsafe.caller_kind) == \
        ("caller", "non_blocking", "legacy")


@given(sst.sync_plans(edges=["war", "join_back"], post_streams=["A"], caller_kinds=["blocking"]))
def test_restricted_plans_vary_only_what_was_asked(plan):
    assert set(EDGES) - plan.edges <= {"war", "join_back"}
    assert plan.post_stream == "A" and plan.caller_kind == "blocking"


def test_plan_strategies_can_reach_every_plan():
    # sampled/drawn from the same enumeration the fuzz tests walk, split by the oracle.
    safe, unsafe = sst._plans_by_verdict()
    assert len(safe) + len(unsafe) == len(sst.all_plans()) == 1152
    assert SyncPlan.correct() in safe and SyncPlan.implicit_join() in unsafe
    assert find(sst.sync_plans(), lambda p: p.edges == frozenset() and p.post_stream == "B"
                and p.side_kind == "blocking" and p.caller_kind == "non_blocking").edges == frozenset()


@given(sst.safe_plans(), sst.unsafe_plans())
def test_safe_and_unsafe_plans_follow_the_oracle(safe, unsafe):
    assert is_safe(safe) and not is_safe(unsafe)


def test_stream_kinds_can_leave_out_the_legacy_stream():
    assert find(sst.stream_kinds(), lambda k: k is StreamKind.LEGACY) is StreamKind.LEGACY
    with pytest.raises(NoSuchExample):
        find(sst.stream_kinds(legacy=False), lambda k: k is StreamKind.LEGACY)


def _racy(device):
    """A producer on A, a consumer on B, nothing between them."""
    a, b = device.stream("A"), device.stream("B")
    x = device.alloc(4, fill=0.0, name="x")
    y = device.alloc(4, fill=0.0, name="y")
    device.launch(lambda x: x.__setitem__(Ellipsis, 1.0), (x,), stream=a, writes=[x], name="produce")
    device.launch(lambda y, x: y.__setitem__(Ellipsis, x + 1), (y, x), stream=b, reads=[x], writes=[y],
                  name="consume")
    device.synchronize()
    return device.host_read(y)


@given(sst.schedule_choices())
def test_a_schedule_choice_replays_exactly(choice):
    first, again = choice.device(), choice.device()
    assert _racy(first).tolist() == _racy(again).tolist()
    assert first.schedule.compact() == again.schedule.compact()
    assert first.schedule.seed == choice.seed
    assert first.schedule.policy.startswith(choice.policy)
    assert len(first.races) == 1  # the checker's verdict does not depend on the schedule


def test_schedule_choice_parameters_per_backend():
    delay = sst.ScheduleChoice("delay", 3, delay_steps=5, delay_us=40)
    assert delay.params("sim") == {"steps": 5}
    assert delay.params("cupy") == {"delay_us": 40}
    assert sst.ScheduleChoice("pct", 1, pct_depth=3).params("sim") == {"depth": 3}
    assert sst.ScheduleChoice("random", 1).params("cupy") == {}
    assert delay.describe() == "delay seed=3 steps=5"
    assert isinstance(delay.device(), Device)


# --- profiles -------------------------------------------------------------------------------


def test_profiles_are_registered_with_their_promises():
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.print_blob and ci.database is None and ci.max_examples <= 50
    assert ci.deadline is None
    assert not settings.get_profile("dev").derandomize
    assert not settings.get_profile("fuzz").derandomize
    assert settings.get_profile("fuzz").max_examples >= 10_000


@pytest.fixture
def restore_profile():
    name = settings.get_current_profile_name()
    yield
    settings.load_profile(name)


@pytest.mark.parametrize("var", sst.PROFILE_ENV)
def test_load_profile_follows_the_environment(monkeypatch, restore_profile, var):
    for other in sst.PROFILE_ENV:
        monkeypatch.delenv(other, raising=False)
    assert sst.load_profile(default="ci") == "ci"
    monkeypatch.setenv(var, "dev")
    assert sst.load_profile(default="ci") == "dev"
    assert settings.get_current_profile_name() == "dev" and settings.default.max_examples == 60
    assert sst.load_profile("fuzz") == "fuzz"  # an explicit name wins
    monkeypatch.setenv(var, "nightly")
    with pytest.raises(ValueError, match="profile 'nightly' is not registered; .*STREAMCHECK_HYPOTHESIS_PROFILE"):
        sst.load_profile()
