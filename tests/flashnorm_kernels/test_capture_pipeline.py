"""FlashNorm's dual-stream step captured once as a CUDA graph and replayed, as inference
engines do (sim backend).

Under capture CUDA itself enforces the joins: a side stream forked from the capture must
be joined back before end_capture. So the talk's bug (the post-scale never waits for the
matmul) cannot hide in a graph: the capture is refused with cudaErrorStreamCaptureUnjoined,
and streamcheck says which stream and kernel were left dangling. Every unsafe sync plan
(the oracle decides) is refused or reported by the checker; every safe one captures and
replays to the eager values.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from flashnorm_kernels.pipeline import DeferredNormProjection
from flashnorm_kernels.plan import EDGES, POST_STREAMS, SIDE_KINDS, SyncPlan
from flashnorm_kernels.testing.oracle import is_safe
from streamcheck.core.capture import CaptureError
from streamcheck.device import Device

D, OUTS, ROWS, EPS, STEPS = 32, (16, 8, 8), 2, 1e-5, 3


def _weights():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((n, D)) / np.sqrt(D)).astype(np.float32) for n in OUTS]


def _inputs():
    rng = np.random.default_rng(1)
    scale = rng.uniform(0.5, 4.0, size=(STEPS, ROWS, 1))  # a wrong 1/RMS shows
    return (rng.standard_normal((STEPS, ROWS, D)) * scale).astype(np.float32)


WEIGHTS, XS = _weights(), _inputs()


@functools.lru_cache(maxsize=None)
def eager_reference(plan: SyncPlan) -> list:
    """The same steps issued without a graph, one kernel at a time."""
    dev = Device("sim", policy="sequential")
    mod = DeferredNormProjection(dev, WEIGHTS, eps=EPS, plan=plan, max_tokens=ROWS, name="qkv")
    caller = dev.stream("caller", kind=plan.caller_kind)
    x = mod.alloc_input(ROWS, name="x")
    results = []
    for step in range(STEPS):
        dev.upload(x, mod.encode(XS[step]), stream=caller)
        results.append(mod.read(mod(x, caller), caller))
    return results


def graph_run(plan: SyncPlan, policy: str = "sequential", seed: int = 0):
    """Capture one step on the caller's stream, then per step: upload x, launch, read.
    Returns (device, outputs per step)."""
    dev = Device("sim", policy=policy, seed=seed)
    mod = DeferredNormProjection(dev, WEIGHTS, eps=EPS, plan=plan, max_tokens=ROWS, name="qkv")
    caller = dev.stream("caller", kind=plan.caller_kind)
    x = mod.alloc_input(ROWS, name="x")
    # The weight upload ran on stream A outside the graph; a graph launch is ordered only
    # after its own stream, so finish it first (the checker reports the race otherwise).
    dev.synchronize()
    caller.begin_capture()
    outs = mod(x, caller)
    graph = caller.end_capture()
    results = []
    for step in range(STEPS):
        dev.upload(x, mod.encode(XS[step]), stream=caller)  # stream order: before the launch
        graph.launch(caller)
        results.append(mod.read(outs, caller))
    return dev, results


def same(a: list, b: list) -> bool:
    return all(np.array_equal(u, v) for sa, sb in zip(a, b) for u, v in zip(sa, sb))


@pytest.mark.parametrize("policy", ["random", "pct"])
def test_correct_plan_replays_to_the_eager_values_under_every_schedule(policy):
    plan = SyncPlan.correct(caller_kind="non_blocking")
    want = eager_reference(plan)
    for seed in range(25):
        dev, got = graph_run(plan, policy, seed)
        assert dev.races == [], dev.report()
        assert same(got, want), f"{policy} seed {seed}"


def test_talks_bug_cannot_hide_in_a_graph():
    plan = SyncPlan.implicit_join(caller_kind="non_blocking")
    with pytest.raises(CaptureError) as info:
        graph_run(plan)
    assert info.value.code == "cudaErrorStreamCaptureUnjoined"
    assert "stream qkv.A after `matmul`" in str(info.value)


def test_missing_weight_sync_before_launch_is_a_race():
    plan = SyncPlan.correct(caller_kind="non_blocking")
    dev = Device("sim")
    mod = DeferredNormProjection(dev, WEIGHTS, eps=EPS, plan=plan, max_tokens=ROWS, name="qkv")
    caller = dev.stream("caller", kind="non_blocking")
    x = mod.alloc_input(ROWS, name="x")
    caller.begin_capture()
    mod(x, caller)
    caller.end_capture().launch(caller)  # never waited for the weight upload on A
    races = [(r.kind, r.buffer) for r in dev.races]
    assert races == [("RAW", "qkv.W")]


PLANS = [SyncPlan(frozenset(edges), post, side, caller)
         for n in range(len(EDGES) + 1) for edges in itertools.combinations(EDGES, n)
         for post in POST_STREAMS for side in SIDE_KINDS for caller in ("non_blocking", "blocking")]


def test_every_plan_is_refused_reported_or_right():
    outcomes = {"refused": 0, "reported": 0, "right": 0}
    for plan in PLANS:
        try:
            dev, got = graph_run(plan, "random", seed=3)
        except CaptureError:
            assert not is_safe(plan), f"a safe plan was refused: {plan.describe()}"
            outcomes["refused"] += 1
            continue
        if dev.races:
            assert not is_safe(plan), f"a safe plan was reported: {plan.describe()}\n{dev.report()}"
            outcomes["reported"] += 1
            continue
        # Neither refused nor reported: only a safe plan may get here, and its values are right.
        assert is_safe(plan), f"an unsafe plan captured cleanly: {plan.describe()}"
        assert same(got, eager_reference(SyncPlan.correct(caller_kind=plan.caller_kind))), plan.describe()
        outcomes["right"] += 1
    assert outcomes["right"] == sum(is_safe(p) for p in PLANS)  # every safe plan captures
    assert outcomes["refused"] > outcomes["reported"] > 0  # most unsafe plans CUDA itself refuses
