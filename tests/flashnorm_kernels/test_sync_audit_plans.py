"""FlashNorm as the sync audit's first customer: the audit of DeferredNormProjection's decode
loop (flashnorm_kernels.commands.fuzz.run_program, the loop flashnorm_kernels.testing.oracle
models) against the plan oracle, edge by edge.

Each plan edge is one event the pipeline records and the waits on it (`war`: one per side stream
that does not run the post-scale); the event is named `<module>.<edge>`, so a wait_event finding
maps back to its edge. An edge is needed when one of its waits is.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings

from flashnorm_kernels.commands.fuzz import MODULE, run_program
from flashnorm_kernels.pipeline import DeferredNormProjection
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.oracle import is_safe
from flashnorm_kernels.testing.strategies import Shape, safe_plans
from streamcheck.analyses.sync_audit import Verdict, audit
from streamcheck.device import Device
from tests.streamcheck.analyses.test_sync_audit import assert_covers_hold

SHAPE = Shape(tokens=1, hidden=4, out=4)
STEPS = 3
EDGE_EVENT = re.compile(rf"waits on event `{re.escape(MODULE)}\.(\w+)`")


def audited(plan):
    device = Device("sim")
    run_program(plan, SHAPE, device, steps=STEPS)
    assert not device.races, device.report()
    return audit(device.trace)


def edge_of(finding):
    """The plan edge a wait_event finding is, or None for any other synchronization (a wait on
    an event the test made is no edge)."""
    if finding.sync.kind != "wait_event":
        return None
    match = EDGE_EVENT.search(finding.sync.what)
    return match.group(1) if match else None


def verdicts_by_edge(result) -> dict:
    """Edge -> NECESSARY if one of its waits is, else REDUNDANT (no other verdict for a wait here)."""
    edges = {}
    for finding in result.findings:
        edge = edge_of(finding)
        if edge is not None:
            assert finding.verdict in (Verdict.NECESSARY, Verdict.REDUNDANT), result.format()
            if edges.get(edge) is not Verdict.NECESSARY:
                edges[edge] = finding.verdict
    return edges


def kept_plan(plan, result) -> SyncPlan:
    """The plan with only the edges the audit's minimal set keeps (an edge inside one stream
    has no wait: it is no edge at all, in the pipeline and in the oracle alike)."""
    kept = set(result.keep) | set(result.replaced)
    # A plan names one kind for both side streams, so it cannot say "A joins the legacy stream,
    # B does not": the explicit waits must be what goes.
    dropped_joins = [f for f in result.findings if f.sync.kind == "legacy join" and f.number not in kept]
    assert not dropped_joins, result.format()
    edges = {edge_of(f) for f in result.findings if f.number in kept} - {None}
    return SyncPlan(frozenset(edges), plan.post_stream, plan.side_kind, plan.caller_kind)


@pytest.mark.parametrize("post_stream", ["caller", "A"])
def test_each_edge_of_the_correct_plan_is_judged_as_the_oracle_judges_it(post_stream):
    plan = SyncPlan.correct(post_stream=post_stream)
    result = audited(plan)
    edges = verdicts_by_edge(result)
    # Post-scale on A: join_mm is stream order, no wait; join_back carries the output to the caller.
    expected = {"fork_a", "fork_b", "join_rms", "war"} | ({"join_mm"} if post_stream == "caller" else {"join_back"})
    assert set(edges) == expected, result.format()
    for edge, verdict in edges.items():
        needed = not is_safe(plan.without(edge))
        assert verdict is (Verdict.NECESSARY if needed else Verdict.REDUNDANT), f"{edge}\n{result.format()}"
    assert {e for e, v in edges.items() if v is Verdict.NECESSARY} == expected - {"war"}
    # `war`: the host synchronizes the caller every step, after join_back, so step t+1's matmul
    # and rms are issued after step t's post-scale finished: the oracle needs no `war` either way.
    assert edges["war"] is Verdict.REDUNDANT and is_safe(plan.without("war"))
    # The loop's own synchronize before reading the output is the host's.
    (read,) = [f for f in result.findings if f.sync.kind == "stream synchronize"]
    assert read.verdict is Verdict.HOST_NEEDED and read.sync.count == STEPS
    assert "`fn.out0`" in read.host_bytes[0]


def test_an_over_synchronized_loop_is_shown_its_redundant_synchronizations():
    device = Device("sim")
    module = DeferredNormProjection(device, [np.eye(4, dtype=np.float32)], plan=SyncPlan.correct(), max_tokens=1,
                                    name=MODULE)
    caller = device.legacy
    x = module.alloc_input(STEPS, name="x")
    for t in range(STEPS):
        rows = x[t:t + 1]
        device.upload(rows, module.encode(np.full((1, 4), t + 1.0, dtype=np.float32)), stream=caller)
        outs = module(rows, caller)
        caller.wait_event(module.stream_a.record())  # extra: join_mm already ordered A's matmul
        np.testing.assert_allclose(module.read(outs, caller)[0], 1.0, rtol=1e-5)  # x / RMS(x), W = I
        device.synchronize()  # extra: the host blocks on every stream, every step
    assert not device.races
    result = audit(device.trace)
    extra = [f for f in result.findings if f.sync.kind == "device synchronize" or
             (f.sync.kind == "wait_event" and edge_of(f) is None)]
    assert [(f.sync.kind, f.verdict, f.sync.count) for f in extra] == [
        ("wait_event", Verdict.REDUNDANT, STEPS), ("device synchronize", Verdict.REDUNDANT, STEPS)], result.format()
    # The device synchronize names the read's synchronize that already ordered everything it
    # waits for; a sync named as the extra wait's cover must be what covers it.
    read = next(f.number for f in result.findings if f.sync.kind == "stream synchronize")
    assert extra[1].reason.startswith(f"implied: what it waits for was already ordered by #{read} "), result.format()
    assert_covers_hold(list(device.trace), result)
    assert {f.number for f in extra} <= set(result.removed)
    assert f"#{extra[0].number}" in result.summary() and f"#{extra[1].number}" in result.summary()
    # The plan's own edges keep their verdicts.
    assert verdicts_by_edge(result) == {"fork_a": Verdict.NECESSARY, "fork_b": Verdict.NECESSARY,
                                        "join_mm": Verdict.NECESSARY, "join_rms": Verdict.NECESSARY,
                                        "war": Verdict.REDUNDANT}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=safe_plans())
def test_the_minimal_set_of_any_safe_plan_is_a_minimal_safe_plan(plan):
    result = audited(plan)
    for edge, verdict in verdicts_by_edge(result).items():  # each edge alone, as the oracle says
        assert verdict is (Verdict.REDUNDANT if is_safe(plan.without(edge)) else Verdict.NECESSARY), (
            f"{edge} in {plan.describe()}\n{result.format()}")
    minimal = kept_plan(plan, result)
    assert is_safe(minimal), f"{plan.describe()} -> {minimal.describe()}\n{result.format()}"
    for edge in minimal.edges:
        assert not is_safe(minimal.without(edge)), (
            f"{minimal.describe()} is still safe without {edge}\n{result.format()}")
    event(f"{len(plan.edges) - len(minimal.edges)} edges dropped")
