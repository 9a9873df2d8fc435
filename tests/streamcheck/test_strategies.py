"""Hypothesis strategies and profiles: what they draw, how they shrink, what they select."""
from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample

from flashnorm_kernels.pipeline import DTYPES, normalize_dtype
from flashnorm_kernels.plan import EDGES, SyncPlan
from flashnorm_kernels.testing import strategies as fst
from flashnorm_kernels.testing.oracle import is_safe
from streamcheck import strategies as sst
from streamcheck.core.trace import StreamKind
from streamcheck.device import Device


@given(fst.shapes(max_tokens=3, max_hidden=5, max_out=7))
def test_shapes_stay_within_bounds_and_pipeline_dtypes(shape):
    assert 1 <= shape.tokens <= 3 and 1 <= shape.hidden <= 5 and 1 <= shape.out <= 7
    assert normalize_dtype(shape.dtype) in DTYPES


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0), dict(max_hidden=-1), dict(max_out=1.5), dict(dtypes=())])
def test_bad_shape_bounds_are_refused(kwargs):
    with pytest.raises(ValueError, match=r"shapes\("):
        fst.shapes(**kwargs)


def test_plans_shrink_towards_the_fewest_missing_edges():
    assert find(fst.sync_plans(), lambda p: True) == SyncPlan.correct()
    assert find(fst.sync_plans(), lambda p: "join_mm" not in p.edges) == SyncPlan.implicit_join()
    smallest_unsafe = find(fst.sync_plans(), lambda p: not is_safe(p))
    assert len(set(EDGES) - smallest_unsafe.edges) == 1
    assert (smallest_unsafe.post_stream, smallest_unsafe.side_kind, smallest_unsafe.caller_kind) == \
        ("caller", "non_blocking", "legacy")


@given(fst.sync_plans(edges=["war", "join_back"], post_streams=["A"], caller_kinds=["blocking"]))
def test_restricted_plans_vary_only_what_was_asked(plan):
    assert set(EDGES) - plan.edges <= {"war", "join_back"}
    assert plan.post_stream == "A" and plan.caller_kind == "blocking"


def test_plan_strategies_can_reach_every_plan():
    # sampled/drawn from the same enumeration the fuzz tests walk, split by the oracle.
    safe, unsafe = fst._plans_by_verdict()
    assert len(safe) + len(unsafe) == len(fst.all_plans()) == 1152
    assert SyncPlan.correct() in safe and SyncPlan.implicit_join() in unsafe
    assert find(fst.sync_plans(), lambda p: p.edges == frozenset() and p.post_stream == "B"
                and p.side_kind == "blocking" and p.caller_kind == "non_blocking").edges == frozenset()


@given(fst.safe_plans(), fst.unsafe_plans())
def test_safe_and_unsafe_plans_follow_the_oracle(safe, unsafe):
    assert is_safe(safe) and not is_safe(unsafe)


@given(kind=sst.stream_kinds())
def test_every_drawn_stream_kind_makes_a_stream(kind):
    device = Device("sim")
    assert device.stream("s", kind=kind).kind is kind


def test_stream_kinds_draw_both_creatable_kinds_and_the_default_streams_only_when_asked():
    for kind in (StreamKind.BLOCKING, StreamKind.NON_BLOCKING):
        assert find(sst.stream_kinds(), lambda k, kind=kind: k is kind) is kind
    with pytest.raises(NoSuchExample):
        find(sst.stream_kinds(), lambda k: k in (StreamKind.LEGACY, StreamKind.PER_THREAD))
    for kind in (StreamKind.LEGACY, StreamKind.PER_THREAD):
        assert find(sst.stream_kinds(default_streams=True), lambda k, kind=kind: k is kind) is kind


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
    ci = settings.get_profile("streamcheck-ci")
    assert ci.derandomize and ci.print_blob and ci.database is None and ci.max_examples <= 50
    assert ci.deadline is None
    assert not settings.get_profile("streamcheck-dev").derandomize
    assert not settings.get_profile("streamcheck-fuzz").derandomize
    assert settings.get_profile("streamcheck-fuzz").max_examples >= 10_000
    # hypothesis's own profiles are not ours to change: its `ci` keeps the default count.
    assert settings.get_profile("ci").max_examples == settings.get_profile("default").max_examples == 100


def test_short_names_are_ours_and_other_names_pass_through():
    assert [sst.profile_name(n) for n in ("dev", "ci", "fuzz")] == list(sst.PROFILES)
    assert sst.profile_name("streamcheck-ci") == "streamcheck-ci"
    assert sst.profile_name("default") == "default" and sst.profile_name("nightly") == "nightly"


@pytest.fixture
def restore_profile():
    name = settings.get_current_profile_name()
    yield
    settings.load_profile(name)


def test_load_profile_follows_our_environment_variable(monkeypatch, restore_profile):
    monkeypatch.delenv(sst.PROFILE_ENV, raising=False)
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "dev")  # the user's variable: load_profile leaves it alone
    assert sst.load_profile(default="ci") == "streamcheck-ci"
    assert settings.get_current_profile_name() == "streamcheck-ci" and settings.default.max_examples == 15
    monkeypatch.setenv(sst.PROFILE_ENV, "dev")
    assert sst.load_profile(default="ci") == "streamcheck-dev"
    assert settings.get_current_profile_name() == "streamcheck-dev" and settings.default.max_examples == 60
    assert sst.load_profile("fuzz") == "streamcheck-fuzz"  # an explicit name wins
    monkeypatch.setenv(sst.PROFILE_ENV, "nightly")
    with pytest.raises(ValueError, match="profile 'nightly' is not registered; streamcheck registers: "
                                         "streamcheck-dev, .*STREAMCHECK_HYPOTHESIS_PROFILE"):
        sst.load_profile()


USER_TEST = """
import streamcheck.strategies  # noqa: F401  (what a user of our strategies imports)
from hypothesis import given, settings, strategies as st

calls = []

@given(st.integers())
def test_numbers(n):
    calls.append(n)

def test_the_profile_is_the_users():
    assert settings.get_current_profile_name() == "{name}"
    assert settings.default.max_examples == {count}
    assert len(calls) == {count}
"""


@pytest.fixture
def user_env(monkeypatch):
    for var in (sst.PROFILE_ENV, "HYPOTHESIS_PROFILE", "CI"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_a_users_ci_profile_survives_our_import_and_plugin(pytester, user_env):
    # Under CI=true hypothesis loads its `ci` profile (100 examples, derandomized); importing
    # our strategies with the plugin loaded must not swap in ours (15 examples).
    user_env.setenv("CI", "true")
    pytester.makepyfile(test_user=USER_TEST.format(name="ci", count=100))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_the_plugin_leaves_hypothesis_profile_to_the_user(pytester, user_env):
    # HYPOTHESIS_PROFILE is the user's (many conftests load it themselves, later than our plugin).
    user_env.setenv("HYPOTHESIS_PROFILE", "nightly")
    pytester.makepyfile(test_user=USER_TEST.format(name="default", count=100))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_our_profiles_are_chosen_by_our_variable_or_their_full_name(pytester, user_env):
    pytester.makepyfile(test_user=USER_TEST.format(name="streamcheck-ci", count=15))
    user_env.setenv(sst.PROFILE_ENV, "ci")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
    user_env.delenv(sst.PROFILE_ENV)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hypothesis-profile=streamcheck-ci") \
        .assert_outcomes(passed=2)
