"""Hypothesis strategies for stream programs, and the hypothesis profiles we run them under.

    from streamcheck import strategies as sst

    @given(plan=sst.sync_plans(), shape=sst.shapes(), choice=sst.schedule_choices())
    def test_plan(plan, shape, choice): ...

Plans are drawn as the set of edges *missing* from the correct plan, so a failing
example shrinks towards the fewest missing edges, the post-scale on the caller and
the default stream kinds: the smallest plan that still fails.

Profiles: `streamcheck-dev` (randomized, moderate), `streamcheck-ci` (derandomized and
bounded, so CI is fast and a failure reproduces on every run; prints the reproduce blob)
and `streamcheck-fuzz` (long). Importing this module registers them and loads none:
the user's hypothesis settings (hypothesis's own `ci` under a CI variable included) stay
as they were. Choose one with `--hypothesis-profile=streamcheck-ci` or
STREAMCHECK_HYPOTHESIS_PROFILE=ci (short names work there). A profile the user registers
later under the same name wins.
"""
from __future__ import annotations

import itertools
import os
from functools import lru_cache
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from .core.trace import StreamKind

if TYPE_CHECKING:  # pragma: no cover - typing only
    from flashnorm_kernels.plan import SyncPlan

# The pipeline's dtypes (flashnorm_kernels.pipeline.DTYPES); the sim emulates bfloat16.
DTYPES = ("float32", "float16", "bfloat16")
# Policies that reorder work; `sequential` is the reference, not a schedule to explore.
EXPLORING_POLICIES = ("delay", "random", "pct", "eager")
SEED_MAX = 2**32 - 1


# --- shapes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One norm + projection problem: x is [tokens, hidden], W* is [out, hidden]."""

    tokens: int  # M: tokens per step (<= max_tokens of the pipeline)
    hidden: int  # d
    out: int  # n: output features
    dtype: str = "float32"

    def describe(self) -> str:
        return f"M={self.tokens} d={self.hidden} n={self.out} {self.dtype}"


def shapes(*, max_tokens: int = 4, max_hidden: int = 32, max_out: int = 32,
           dtypes: Sequence[str] = DTYPES) -> st.SearchStrategy[Shape]:
    """Small shapes the sim runs in microseconds; raise the bounds on a GPU."""
    for name, bound in (("max_tokens", max_tokens), ("max_hidden", max_hidden), ("max_out", max_out)):
        if not isinstance(bound, int) or bound < 1:
            raise ValueError(f"shapes({name}={bound!r}): need an integer >= 1")
    if not dtypes:
        raise ValueError("shapes(dtypes=()): name at least one dtype")
    return st.builds(
        Shape,
        tokens=st.integers(1, max_tokens),
        hidden=st.integers(1, max_hidden),
        out=st.integers(1, max_out),
        dtype=st.sampled_from(tuple(dtypes)),
    )


# --- sync plans ---------------------------------------------------------------------------


def _plan_module():
    # Imported when a plan is first needed: importing the flashnorm_kernels package
    # imports torch, which profile selection (done by the plugin) must not pay for.
    from flashnorm_kernels import plan

    return plan


def _plan(missing: frozenset, post: str, side: str, caller: str) -> "SyncPlan":
    plan = _plan_module()
    return plan.SyncPlan(frozenset(plan.EDGES) - missing, post, side, caller)


def sync_plans(*, edges: Optional[Sequence[str]] = None, post_streams: Optional[Sequence[str]] = None,
               side_kinds: Optional[Sequence[str]] = None,
               caller_kinds: Optional[Sequence[str]] = None) -> "st.SearchStrategy[SyncPlan]":
    """Any plan: every subset of `edges` (default: all six) may be missing, the others are
    always present; post stream and kinds default to every choice plan.py allows."""
    plan = _plan_module()
    edges = plan.EDGES if edges is None else tuple(edges)
    # One "left out?" flag per edge: flags shrink to False, so a failing plan shrinks to
    # the fewest missing edges (a set-valued draw shrinks less well).
    missing = st.tuples(*(st.booleans() for _ in edges)).map(
        lambda flags: frozenset(e for e, out in zip(edges, flags) if out))
    return st.builds(
        _plan,
        missing,
        st.sampled_from(tuple(post_streams or plan.POST_STREAMS)),
        st.sampled_from(tuple(side_kinds or plan.SIDE_KINDS)),
        st.sampled_from(tuple(caller_kinds or plan.CALLER_KINDS)),
    )


def all_plans(*, post_streams: Optional[Sequence[str]] = None, side_kinds: Optional[Sequence[str]] = None,
              caller_kinds: Optional[Sequence[str]] = None) -> "list[SyncPlan]":
    """Every plan, fewest missing edges first: 2^6 edge subsets x post streams x kinds."""
    plan = _plan_module()
    subsets = [frozenset(c) for r in range(len(plan.EDGES) + 1) for c in itertools.combinations(plan.EDGES, r)]
    return [_plan(missing, post, side, caller)
            for missing in subsets
            for post in (post_streams or plan.POST_STREAMS)
            for side in (side_kinds or plan.SIDE_KINDS)
            for caller in (caller_kinds or plan.CALLER_KINDS)]


@lru_cache(maxsize=1)
def _plans_by_verdict() -> tuple:
    from .oracle import is_safe

    plans = all_plans()
    return tuple(p for p in plans if is_safe(p)), tuple(p for p in plans if not is_safe(p))


def safe_plans() -> "st.SearchStrategy[SyncPlan]":
    """Plans the oracle calls safe (no required ordering missing)."""
    return st.sampled_from(_plans_by_verdict()[0])


def unsafe_plans() -> "st.SearchStrategy[SyncPlan]":
    """Plans the oracle calls unsafe: a race the checker must report."""
    return st.sampled_from(_plans_by_verdict()[1])


def stream_kinds(*, legacy: bool = True) -> st.SearchStrategy[StreamKind]:
    """Stream kinds; `legacy=False` leaves out the legacy default stream."""
    return st.sampled_from([k for k in StreamKind if legacy or k is not StreamKind.LEGACY])


# --- schedules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleChoice:
    """A schedule to run under: the policy, its seed and its parameters."""

    policy: str
    seed: int = 0
    delay_steps: int = 8  # sim, delay: host calls a held operation waits
    pct_depth: int = 2  # pct: bug depth searched for
    delay_us: int = 200  # cupy, delay and pct: spin before a delayed launch

    def params(self, backend: str = "sim") -> dict:
        """Keyword arguments for Device(backend, policy=..., seed=..., **params)."""
        params = {}
        if self.policy == "delay":
            params = {"delay_us": self.delay_us} if backend == "cupy" else {"steps": self.delay_steps}
        elif self.policy == "pct":
            params = {"depth": self.pct_depth}
            if backend == "cupy":
                params["delay_us"] = self.delay_us
        return params

    def device(self, backend: str = "sim", *, check: bool = True):
        """A fresh Device running this schedule."""
        from .device import Device

        return Device(backend, check=check, policy=self.policy, seed=self.seed, **self.params(backend))

    def describe(self, backend: str = "sim") -> str:
        params = "".join(f" {k}={v}" for k, v in self.params(backend).items())
        return f"{self.policy} seed={self.seed}{params}"


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, SEED_MAX)


def schedule_choices(*, policies: Sequence[str] = EXPLORING_POLICIES, max_delay_steps: int = 16,
                     max_depth: int = 3) -> st.SearchStrategy[ScheduleChoice]:
    """Policy x seed x (delay steps | pct depth). Shrinks towards the first policy, seed 0."""
    if not policies:
        raise ValueError("schedule_choices(policies=()): name at least one policy")
    return st.builds(
        ScheduleChoice,
        policy=st.sampled_from(tuple(policies)),
        seed=seeds(),
        delay_steps=st.integers(0, max_delay_steps),
        pct_depth=st.integers(1, max_depth),
    )


# --- profiles -------------------------------------------------------------------------------

# Our profiles have names of their own: hypothesis's `default` and `ci` belong to the user
# (hypothesis loads `ci` itself when a CI variable is set), and re-registering the profile
# that is loaded would change every hypothesis test in the process.
PREFIX = "streamcheck-"
PROFILE_ENV = "STREAMCHECK_HYPOTHESIS_PROFILE"

# Simulated steps take variable time on a loaded machine: per-example deadlines would
# flake, so every profile turns them off.
PROFILES = {
    "streamcheck-dev": dict(max_examples=60, deadline=None, derandomize=False),
    "streamcheck-ci": dict(max_examples=15, derandomize=True, deadline=None, print_blob=True, database=None,
                           suppress_health_check=[HealthCheck.too_slow]),
    "streamcheck-fuzz": dict(max_examples=100_000, deadline=None, derandomize=False, print_blob=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]),
}


def register_profiles() -> None:
    """Register streamcheck-dev/-ci/-fuzz (loading none). Their parent is hypothesis's
    `default`, not whatever profile is loaded at import time (under CI that is `ci`), so
    they mean the same everywhere. Runs once, on import: a profile the user registers
    afterwards under one of these names wins."""
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, settings.get_profile("default"), **kwargs)


def profile_name(name: str) -> str:
    """Our full profile name for a short one (`ci` -> `streamcheck-ci`); other names unchanged.
    Only our own inputs take short names: STREAMCHECK_HYPOTHESIS_PROFILE, load_profile and
    `streamcheck fuzz --profile`; `--hypothesis-profile` is hypothesis's and takes full names."""
    return PREFIX + name if PREFIX + name in PROFILES else name


def profile_from_env() -> Optional[str]:
    value = os.environ.get(PROFILE_ENV, "").strip()
    return value or None


def load_profile(name: Optional[str] = None, default: Optional[str] = None) -> Optional[str]:
    """Load `name`, else the profile STREAMCHECK_HYPOTHESIS_PROFILE names, else `default`;
    return the full name loaded (None: nothing was chosen, hypothesis keeps its own)."""
    chosen = name or profile_from_env() or default
    if chosen is None:
        return None
    chosen = profile_name(chosen)
    try:
        settings.load_profile(chosen)
    except InvalidArgument:
        known = ", ".join(PROFILES)
        raise ValueError(f"hypothesis profile {chosen!r} is not registered; streamcheck registers: {known} "
                         f"(short names dev, ci, fuzz work too; set {PROFILE_ENV} or pass "
                         "--hypothesis-profile)") from None
    return chosen


register_profiles()
