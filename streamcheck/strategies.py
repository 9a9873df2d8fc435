"""Hypothesis strategies for stream programs, and the hypothesis profiles we run them under.

    from streamcheck import strategies as sst

    @given(choice=sst.schedule_choices())
    def test_program(choice):
        device = choice.device()  # a Device running the drawn schedule
        ...

Strategies of a program under test belong with it: FlashNorm's shapes and sync plans are
in its own package (testing/strategies.py there), which streamcheck never imports.

Profiles: `streamcheck-dev` (randomized, moderate), `streamcheck-ci` (derandomized and
bounded, so CI is fast and a failure reproduces on every run; prints the reproduce blob)
and `streamcheck-fuzz` (long). Importing this module registers them and loads none:
the user's hypothesis settings (hypothesis's own `ci` under a CI variable included) stay
as they were. Choose one with `--hypothesis-profile=streamcheck-ci` or
STREAMCHECK_HYPOTHESIS_PROFILE=ci (short names work there). A profile the user registers
later under the same name wins.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from .core.trace import StreamKind

# Policies that reorder work; `sequential` is the reference, not a schedule to explore.
EXPLORING_POLICIES = ("delay", "random", "pct", "eager")
SEED_MAX = 2**32 - 1


# --- streams ------------------------------------------------------------------------------


def stream_kinds(*, default_streams: bool = False) -> st.SearchStrategy[StreamKind]:
    """The kinds `device.stream(kind=...)` creates: blocking and non-blocking.
    `default_streams=True` adds the legacy and per-thread default streams, which exist already
    (`device.legacy`, `device.per_thread_stream()`): CUDA creates no stream of those kinds."""
    creatable = (StreamKind.BLOCKING, StreamKind.NON_BLOCKING)
    return st.sampled_from([k for k in StreamKind if default_streams or k in creatable])


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
