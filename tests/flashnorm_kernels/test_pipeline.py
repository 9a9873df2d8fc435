"""The dual-stream deferred-normalization pipeline (FlashNorm Prop 2) on the sim backend:
values against an fp64 reference, every sync plan's races, stale reads under delay."""
from __future__ import annotations

import numpy as np
import pytest

from flashnorm_kernels import kernels_cpu
from flashnorm_kernels.pipeline import DeferredNormProjection, normalize_dtype, reference_norm_proj
from flashnorm_kernels.plan import SyncPlan
from streamcheck.device import Device
from streamcheck.core.trace import EventRecord, Launch, StreamWait

D = 64
OUTS = (32, 16, 16)  # q, k, v sharing one norm
EPS = 1e-5


def _weights(seed=0, outs=OUTS, d=D):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n, d)) / np.sqrt(d)).astype(np.float32) for n in outs]


def _inputs(steps, rows, seed=1, d=D):
    rng = np.random.default_rng(seed)
    # Rows of different scales: the 1/RMS factor differs per row, so a wrong r shows.
    scale = rng.uniform(0.5, 4.0, size=(steps, rows, 1))
    return (rng.standard_normal((steps, rows, d)) * scale).astype(np.float32)


def _caller(dev, plan):
    return dev.legacy if plan.caller_kind == "legacy" else dev.stream("caller", kind=plan.caller_kind)


def _run(plan=None, policy="eager", seed=0, steps=3, rows=4, dtype="float32", weights=None, xs=None,
         sync="caller", unscaled=(), **policy_params):
    """Run `steps` decode steps; each step's input goes to its own rows of one input buffer,
    uploaded on the caller's stream. Returns (device, module, xs, outputs per step)."""
    plan = SyncPlan.correct() if plan is None else plan
    dev = Device("sim", policy=policy, seed=seed, **policy_params)
    weights = _weights() if weights is None else weights
    xs = _inputs(steps, rows) if xs is None else xs
    mod = DeferredNormProjection(dev, weights, eps=EPS, plan=plan, dtype=dtype, max_tokens=8, name="qkv",
                                 unscaled=unscaled)
    caller = _caller(dev, plan)
    xbuf = mod.alloc_input(steps * rows, name="x")
    results = []
    for t in range(steps):
        x = xbuf[t * rows:(t + 1) * rows]
        dev.upload(x, mod.encode(xs[t]), stream=caller)
        outs = mod(x, caller)
        if sync == "device":
            dev.synchronize()
            results.append([mod.decode(dev.host_read(o)) for o in outs])
        else:
            results.append(mod.read(outs, caller))
    return dev, mod, xs, results


def _quantized(values, dtype):
    """What a `dtype` buffer holds for `values` (the reference uses the same inputs)."""
    dtype = normalize_dtype(dtype)
    if dtype == "bfloat16":
        return kernels_cpu.round_to_bf16(values)
    return np.asarray(values).astype(dtype).astype(np.float32)


def _races(dev, kind=None, buffer=None):
    return [r for r in dev.races if (kind is None or r.kind == kind) and (buffer is None or r.buffer == buffer)]


# --- values ---------------------------------------------------------------------------------

# Relative to the largest reference value: fp32 accumulates in fp32; fp16/bf16 round Y
# and the output once each (2^-11 and 2^-8 relative).
TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 3, 8], ids=["decode1", "decode3", "prefill8"])
def test_matches_fp64_reference(dtype, rows):
    weights = _weights()
    _, _, xs, results = _run(dtype=dtype, rows=rows, steps=2, weights=weights)
    qw = [_quantized(w, dtype) for w in weights]
    for t in range(2):
        want = reference_norm_proj(_quantized(xs[t], dtype), qw, EPS)
        for got, ref in zip(results[t], want):
            assert got.shape == ref.shape
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < TOL[dtype], f"{dtype} step {t}: relative error {err:.2e}"


def test_gain_folded_weights_equal_rmsnorm_then_linear():
    # Prop 1 + Prop 2 together: with W* = W·diag(g), the pipeline computes Linear(RMSNorm(x)).
    rng = np.random.default_rng(5)
    g = rng.uniform(0.5, 1.5, D).astype(np.float32)
    w = (rng.standard_normal((24, D)) / 8).astype(np.float32)
    x = rng.standard_normal((3, D)).astype(np.float32)
    normed = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + EPS) * g
    want = normed @ w.T.astype(np.float64)
    _, _, _, results = _run(weights=[w * g[None, :]], xs=x[None], steps=1, rows=3)
    np.testing.assert_allclose(results[0][0], want, rtol=1e-5, atol=1e-5)


def test_reference_matches_torch_rms_norm():
    torch = pytest.importorskip("torch")
    x = _inputs(1, 5)[0]
    w = _weights()[0]
    want = torch.nn.functional.linear(
        torch.nn.functional.rms_norm(torch.from_numpy(x).double(), (D,), eps=EPS), torch.from_numpy(w).double())
    np.testing.assert_allclose(reference_norm_proj(x, [w], EPS)[0], want.numpy(), rtol=1e-12, atol=1e-12)


def test_bf16_is_emulated_on_the_bf16_grid():
    dev, mod, _, results = _run(dtype="bf16", steps=2)
    assert mod.storage.emulated_bf16 and mod.storage.alloc_dtype == np.float32
    for out in results[-1]:
        np.testing.assert_array_equal(kernels_cpu.round_to_bf16(out), out)
    y = dev.host_read(mod.y[:4])
    np.testing.assert_array_equal(kernels_cpu.round_to_bf16(y), y)
    # ... and not merely fp32 values: some fp32 results differ from their bf16 rounding.
    _, _, _, fp32 = _run(dtype="float32", steps=2)
    assert not np.array_equal(kernels_cpu.round_to_bf16(fp32[-1][0]), fp32[-1][0])


def test_round_to_bf16_is_round_to_nearest_even():
    one_ulp = 2.0 ** -7  # bf16 keeps 7 fraction bits
    cases = {
        1.0 + one_ulp / 2: 1.0,  # tie, 1.0 is even
        1.0 + 3 * one_ulp / 2: 1.0 + 2 * one_ulp,  # tie, odd neighbour below: round up
        1.0 + one_ulp / 2 + 2.0 ** -20: 1.0 + one_ulp,  # just above the tie
        -(1.0 + 3 * one_ulp / 2): -(1.0 + 2 * one_ulp),
        3.4e38: np.inf,  # past bf16's largest finite value (about 3.39e38)
    }
    got = kernels_cpu.round_to_bf16(np.array(list(cases), dtype=np.float32))
    np.testing.assert_array_equal(got, np.array(list(cases.values()), dtype=np.float32))
    assert np.isnan(kernels_cpu.round_to_bf16(np.array([np.nan], np.float32)))[0]


def test_bf16_rounding_and_bits_agree_with_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(20000) * np.exp(rng.uniform(-30, 30, 20000))).astype(np.float32)
    t = torch.from_numpy(a).to(torch.bfloat16)
    np.testing.assert_array_equal(kernels_cpu.round_to_bf16(a), t.float().numpy())
    np.testing.assert_array_equal(kernels_cpu.bf16_bits(a), t.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(kernels_cpu.bf16_from_bits(kernels_cpu.bf16_bits(a)), t.float().numpy())


def test_shared_norm_one_rms_one_matmul_and_precise_regions():
    dev, mod, _, _ = _run(steps=2, rows=3)
    launches = [op for op in dev.trace if isinstance(op, Launch)]
    names = [op.name for op in launches]
    assert names.count("rms") == 2 and names.count("matmul") == 2 and names.count("postscale") == 2
    matmul = next(op for op in launches if op.name == "matmul")
    assert matmul.writes == (mod.y[:3].byte_range(),)
    post = next(op for op in launches if op.name == "postscale")
    assert set(post.reads) == {mod.y[:3].byte_range(), mod.r[:3].byte_range()}
    assert set(post.writes) == {o[:3].byte_range() for o in mod.outputs}


# --- schedules ------------------------------------------------------------------------------

PLANS = {
    "caller-legacy": SyncPlan.correct(),
    "post-A": SyncPlan.correct(post_stream="A"),
    "post-B-blocking": SyncPlan.correct(post_stream="B", side_kind="blocking"),
    "caller-nonblocking": SyncPlan.correct(caller_kind="non_blocking"),
}


@pytest.mark.parametrize("plan", list(PLANS.values()), ids=list(PLANS))
def test_correct_plan_is_bitwise_sequential_under_every_schedule(plan):
    xs = _inputs(4, 3, seed=11)
    _, _, _, want = _run(plan, policy="sequential", steps=4, rows=3, xs=xs)
    for policy in ("eager", "random", "pct", "delay"):
        for seed in range(6):
            dev, _, _, got = _run(plan, policy=policy, seed=seed, steps=4, rows=3, xs=xs)
            assert dev.races == [], dev.report()
            for t in range(4):
                for g, w in zip(got[t], want[t]):
                    np.testing.assert_array_equal(g, w, err_msg=f"{policy} seed={seed} step {t}")


def test_implicit_join_eager_is_right_but_the_race_is_reported():
    _, _, _, want = _run(policy="sequential")
    dev, mod, _, got = _run(SyncPlan.implicit_join(), policy="eager")
    for t in range(3):
        for g, w in zip(got[t], want[t]):
            np.testing.assert_array_equal(g, w)
    races = dev.races
    assert len(races) == 1, dev.report()
    race = races[0]
    assert (race.kind, race.buffer) == ("RAW", "qkv.Y")
    assert (race.first.actor, race.first.name, race.first.write) == ("stream qkv.A", "matmul", True)
    assert (race.second.name, race.second.write) == ("postscale", False)
    assert "stream qkv.A" in race.missing_edge and "`matmul`" in race.missing_edge
    assert race.count == 3  # once per step


@pytest.mark.parametrize("target", [dict(streams=("qkv.A",)), dict(kernels=("matmul",))],
                         ids=["stream-A", "matmul-kernel"])
def test_implicit_join_under_delay_reads_the_previous_steps_y(target):
    steps, rows = 4, 3
    xs = _inputs(steps, rows, seed=7)
    weights = _weights()
    dev, mod, _, got = _run(SyncPlan.implicit_join(), policy="delay", steps=steps, rows=rows, xs=xs,
                            weights=weights, sync="device", **target)
    w = np.concatenate(weights)
    ys, rs = [], []
    for t in range(steps):
        y = np.empty((rows, w.shape[0]), np.float32)
        r = np.empty(rows, np.float32)
        kernels_cpu.matmul(xs[t], w, y)
        kernels_cpu.rms(xs[t], r, eps=EPS)
        ys.append(y)
        rs.append(r)
    assert all(np.isnan(o).all() for o in got[0])  # step 0 read Y before anything was written
    for t in range(1, steps):
        for i, (start, stop) in enumerate(mod.columns):
            stale = np.empty((rows, stop - start), np.float32)
            kernels_cpu.postscale(ys[t - 1], rs[t], stale, columns=[(start, stop)])
            np.testing.assert_array_equal(got[t][i], stale, err_msg=f"step {t} output {i}")
            right = reference_norm_proj(xs[t], [weights[i]], EPS)[0]
            assert np.abs(got[t][i] - right).max() > 0.1  # and that is visibly wrong
    assert [r.buffer for r in dev.races] == ["qkv.Y"]

    # The fixed plan under the same delay: right values, no race.
    dev, _, _, fixed = _run(SyncPlan.correct(), policy="delay", steps=steps, rows=rows, xs=xs, weights=weights,
                            sync="device", **target)
    assert dev.races == []
    for t in range(steps):
        for g, w_i in zip(fixed[t], reference_norm_proj(xs[t], weights, EPS)):
            np.testing.assert_allclose(g, w_i, rtol=1e-5, atol=1e-5)


def test_blocking_side_streams_with_legacy_caller_need_no_join():
    # CUDA's legacy-stream rule: work on the legacy stream waits for all earlier work on
    # blocking streams. So the implicit join is *correct* there (docs/cuda-rules.md; measured on an H200, docs/gpu-results.md).
    plan = SyncPlan.implicit_join(side_kind="blocking")
    dev, _, _, got = _run(plan, policy="delay", streams=("qkv.A",), sync="device")
    assert dev.races == []
    _, _, _, want = _run(policy="sequential")
    for t in range(3):
        for g, w in zip(got[t], want[t]):
            np.testing.assert_array_equal(g, w)
    # ... but not when the caller is a blocking user stream: blocking streams do not
    # synchronize with each other, only with the legacy stream.
    dev, _, _, _ = _run(SyncPlan.implicit_join(side_kind="blocking", caller_kind="blocking"))
    assert [(r.kind, r.buffer, r.first.name) for r in dev.races] == [("RAW", "qkv.Y", "matmul")]


# Each missing edge, in a plan where it matters, and the race the checker must name.
MISSING = {
    "fork_a": (SyncPlan.correct().without("fork_a"), "RAW", "x", "copy H2D", "matmul"),
    "fork_b": (SyncPlan.correct().without("fork_b"), "RAW", "x", "copy H2D", "rms"),
    "join_mm": (SyncPlan.correct(post_stream="B").without("join_mm"), "RAW", "qkv.Y", "matmul", "postscale"),
    "join_rms": (SyncPlan.correct().without("join_rms"), "RAW", "qkv.r", "rms", "postscale"),
    "join_back": (SyncPlan.correct(post_stream="A").without("join_back"), "RAW", "qkv.out0", "postscale",
                  "host read"),
}


@pytest.mark.parametrize("edge", list(MISSING))
def test_missing_edge_is_reported(edge):
    plan, kind, buffer, first, second = MISSING[edge]
    dev, _, _, _ = _run(plan)
    found = [(r.kind, r.buffer, r.first.name, r.second.name) for r in dev.races]
    assert (kind, buffer, first, second) in found, dev.report()


@pytest.mark.parametrize("post, buffer, writer, stream", [("B", "qkv.Y", "matmul", "stream qkv.A"),
                                                          ("A", "qkv.r", "rms", "stream qkv.B")])
def test_missing_war_edge_is_reported_when_the_caller_does_not_wait(post, buffer, writer, stream):
    # With join_back the caller orders the next step after this one, which also covers the
    # write-after-read on the persistent Y and r; without it only `war` stops step t+1's
    # matmul (A) and RMS (B) overwriting them while step t's post-scale may still read them.
    base = SyncPlan.correct(post_stream=post).without("join_back")
    dev, _, _, _ = _run(base)
    assert not [r for r in dev.races if r.kind == "WAR"], dev.report()
    dev, _, _, _ = _run(base.without("war"))
    war = [(r.kind, r.buffer, r.first.name, r.second.name, r.second.actor) for r in dev.races if r.kind == "WAR"]
    assert ("WAR", buffer, "postscale", writer, stream) in war, dev.report()


@pytest.mark.parametrize("plan", [SyncPlan.correct().without("join_back"),
                                  SyncPlan.correct(post_stream="A").without("join_mm"),
                                  SyncPlan.correct(post_stream="B").without("join_rms")],
                         ids=["post-on-caller-no-join_back", "post-on-A-no-join_mm", "post-on-B-no-join_rms"])
def test_an_edge_within_one_stream_is_not_needed(plan):
    # Stream order already gives it: no race, right values under a hostile schedule.
    _, _, _, want = _run(policy="sequential")
    for seed in range(4):
        dev, _, _, got = _run(plan, policy="random", seed=seed)
        assert dev.races == [], dev.report()
        for t in range(3):
            for g, w in zip(got[t], want[t]):
                np.testing.assert_array_equal(g, w)


# --- bad input ------------------------------------------------------------------------------

def _module(dev=None, **kw):
    dev = dev or Device("sim")
    args = dict(weights=_weights(), eps=EPS, plan=SyncPlan.correct(), dtype="float32", max_tokens=8, name="qkv")
    args.update(kw)
    return DeferredNormProjection(dev, **args)


@pytest.mark.parametrize("kw, match", [
    (dict(weights=_weights()[0]), "weights must be a list"),
    (dict(weights=[]), "weights is empty"),
    (dict(weights=[np.ones(D, np.float32)]), r"weights\[0\] has shape \(64,\)"),
    (dict(weights=[_weights()[0], np.ones((8, D + 1), np.float32)]), "disagree on the input size"),
    (dict(weights=[np.ones((D, D), np.float32).T[:, :D - 1]]), r"weights\[0\] is not C-contiguous"),
    (dict(weights=[np.ones((8, D), np.int32)]), r"weights\[0\] has dtype int32"),
    (dict(dtype="float64"), "dtype 'float64' is not supported"),
    (dict(dtype="int8"), "dtype 'int8' is not supported"),
    (dict(eps=-1.0), "eps must be"),
    (dict(max_tokens=0), "max_tokens must be"),
    (dict(plan="correct"), "plan must be a SyncPlan"),
    (dict(name=""), "name must be"),
])
def test_bad_construction_is_a_clear_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        _module(**kw)


def test_torch_transposed_weight_is_refused():
    torch = pytest.importorskip("torch")
    w = torch.ones(D, 16).t()  # [16, D] but a transposed view: probably a mistake
    with pytest.raises(ValueError, match=r"weights\[0\] is not contiguous"):
        _module(weights=[w])
    _module(weights=[torch.ones(16, D)])  # a plain Linear.weight is fine


def test_bad_step_input_is_a_clear_value_error():
    dev = Device("sim")
    mod = _module(dev)
    x = mod.alloc_input(16)
    with pytest.raises(ValueError, match=r"x .* has no rows \(M = 0\)"):
        mod(x[0:0])
    with pytest.raises(ValueError, match="M = 9 rows but max_tokens = 8"):
        mod(x[0:9])
    with pytest.raises(ValueError, match=r"expected \[M, 64\]"):
        mod(dev.alloc((4, D + 1), "float32", name="wide"))
    with pytest.raises(ValueError, match="has dtype float16; this module computes in float32"):
        mod(dev.alloc((4, D), "float16", name="half"))
    with pytest.raises(ValueError, match="x must be a device Region or Buffer"):
        mod(np.ones((4, D), np.float32))
    with pytest.raises(ValueError, match="belongs to another Device"):
        mod(_module().alloc_input(4))
    user = dev.stream("user")
    with pytest.raises(ValueError, match="caller_kind is 'legacy' but caller 'user' is non_blocking"):
        mod(x[0:4], user)
    nb = _module(dev, plan=SyncPlan.correct(caller_kind="non_blocking"), name="nb")
    with pytest.raises(ValueError, match="pass caller=<that stream>"):
        nb(nb.alloc_input(4))
    with pytest.raises(ValueError, match="own side streams"):
        mod(x[0:4], mod.stream_a)
    # A buffer whose backend array is strided (e.g. adopted from a transposed external array):
    # its rows are not `in` consecutive elements, which the kernels assume.
    strided = mod.alloc_input(4, name="strided")
    strided.storage = np.asfortranarray(strided.storage)
    with pytest.raises(ValueError, match="x .*strided.* is not C-contiguous"):
        mod(strided)
    assert dev.races == []


# --- Prop 3: unscaled outputs ---------------------------------------------------------------

def _step_with_y(mod, dev, x_values):
    """One step from the legacy stream; returns (outputs, Y as stored after the step)."""
    x = mod.alloc_input(len(x_values), name="x1")
    dev.upload(x, mod.encode(x_values), stream=dev.legacy)
    outs = mod(x, dev.legacy)
    got = mod.read([*outs, mod.y[:len(x_values)]], dev.legacy)
    return got[:-1], got[-1]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("unscaled", [(0, 1), (2,), (0, 1, 2)], ids=["q-k", "v", "all"])
@pytest.mark.parametrize("rows", [1, 8], ids=["decode1", "prefill8"])
def test_unscaled_outputs_are_y_as_stored_and_the_rest_are_unchanged(dtype, unscaled, rows):
    weights = _weights()
    xs = _inputs(1, rows, seed=4)[0]
    dev = Device("sim", policy="random", seed=3)
    mod = DeferredNormProjection(dev, weights, eps=EPS, dtype=dtype, max_tokens=8, name="qkv", unscaled=unscaled)
    got, y = _step_with_y(mod, dev, xs)
    plain_dev = Device("sim")
    plain = DeferredNormProjection(plain_dev, weights, eps=EPS, dtype=dtype, max_tokens=8, name="qkv")
    want, plain_y = _step_with_y(plain, plain_dev, xs)
    np.testing.assert_array_equal(y, plain_y)  # same matmul either way
    qx = _quantized(xs, dtype)
    ref = reference_norm_proj(qx, [_quantized(w, dtype) for w in weights], EPS)
    rms = np.sqrt(np.mean(qx.astype(np.float64) ** 2, axis=1, keepdims=True) + EPS)
    for i, (start, stop) in enumerate(mod.columns):
        if i in unscaled:
            np.testing.assert_array_equal(got[i], y[:, start:stop], err_msg=f"output {i}")  # bit for bit
            # ... which is the projection of the unnormalised x: the reference times rms(x).
            err = np.abs(got[i] - ref[i] * rms).max() / np.abs(ref[i] * rms).max()
            assert err < TOL[dtype], f"{dtype} unscaled output {i}: relative error {err:.2e}"
            assert np.abs(got[i] - ref[i]).max() > 0.1 * np.abs(ref[i]).max()  # really not scaled
        else:
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"output {i}")  # as without `unscaled`
            err = np.abs(got[i] - ref[i]).max() / np.abs(ref[i]).max()
            assert err < TOL[dtype], f"{dtype} output {i}: relative error {err:.2e}"
    assert dev.races == []


def test_unscaled_launches_read_ones_and_full_cancellation_launches_no_rms():
    dev, mod, _, results = _run(steps=2, rows=3, unscaled=(0, 1))
    launches = [op for op in dev.trace if isinstance(op, Launch)]
    assert [op.name for op in launches] == ["matmul", "rms", "postscale"] * 2
    post = launches[2]
    assert set(post.reads) == {mod.y[:3].byte_range(), mod.r[:3].byte_range(), mod.ones[:3].byte_range()}
    assert set(post.writes) == {o[:3].byte_range() for o in mod.outputs}

    dev, mod, xs, results = _run(steps=3, rows=3, unscaled=(2, 0, 1), policy="random", seed=2)
    assert mod.unscaled == (0, 1, 2) and not mod.computes_rms
    launches = [op for op in dev.trace if isinstance(op, Launch)]
    assert [op.name for op in launches] == ["matmul", "postscale"] * 3  # no `rms` at all
    assert not [op for op in launches if op.stream == mod.stream_b.id]
    post = launches[1]
    assert set(post.reads) == {mod.y[:3].byte_range(), mod.ones[:3].byte_range()}  # r is neither computed nor read
    assert np.isnan(dev.host_read(mod.r)).all()  # never written: the sim's garbage
    w = np.concatenate(_weights())
    for t in range(3):
        y = np.empty((3, w.shape[0]), np.float32)
        kernels_cpu.matmul(xs[t], w, y)
        for i, (start, stop) in enumerate(mod.columns):
            np.testing.assert_array_equal(results[t][i], y[:, start:stop], err_msg=f"step {t} output {i}")
    assert dev.races == []


@pytest.mark.parametrize("unscaled", [(0, 1), (0, 1, 2)], ids=["partial", "full"])
@pytest.mark.parametrize("plan", [PLANS["caller-legacy"], PLANS["post-B-blocking"]], ids=["caller", "post-B"])
def test_correct_plan_with_unscaled_outputs_is_bitwise_sequential(plan, unscaled):
    xs = _inputs(3, 3, seed=12)
    _, _, _, want = _run(plan, policy="sequential", steps=3, rows=3, xs=xs, unscaled=unscaled)
    for policy in ("random", "pct", "delay"):
        for seed in range(3):
            dev, _, _, got = _run(plan, policy=policy, seed=seed, steps=3, rows=3, xs=xs, unscaled=unscaled)
            assert dev.races == [], dev.report()
            for t in range(3):
                for g, w in zip(got[t], want[t]):
                    np.testing.assert_array_equal(g, w, err_msg=f"{policy} seed={seed} step {t}")


@pytest.mark.parametrize("unscaled", [(0, 1), (0, 1, 2)], ids=["partial", "full"])
def test_implicit_join_with_unscaled_outputs_still_races_and_reads_the_previous_y(unscaled):
    # The post-scale of unscaled outputs is still a read of Y: the talk's bug stays visible.
    dev, _, _, _ = _run(SyncPlan.implicit_join(), policy="eager", unscaled=unscaled)
    assert [(r.kind, r.buffer, r.first.name, r.second.name, r.count) for r in dev.races] == [
        ("RAW", "qkv.Y", "matmul", "postscale", 3)], dev.report()

    steps, rows = 4, 3
    xs = _inputs(steps, rows, seed=7)
    weights = _weights()
    dev, mod, _, got = _run(SyncPlan.implicit_join(), policy="delay", steps=steps, rows=rows, xs=xs,
                            weights=weights, sync="device", unscaled=unscaled, streams=("qkv.A",))
    assert [r.buffer for r in dev.races] == ["qkv.Y"]
    w = np.concatenate(weights)
    for t in range(1, steps):
        prev = np.empty((rows, w.shape[0]), np.float32)
        kernels_cpu.matmul(xs[t - 1], w, prev)
        r = np.empty(rows, np.float32)
        kernels_cpu.rms(xs[t], r, eps=EPS)
        for i, (start, stop) in enumerate(mod.columns):
            stale = prev[:, start:stop].copy()
            if i not in unscaled:
                kernels_cpu.postscale(prev, r, stale, columns=[(start, stop)])
            np.testing.assert_array_equal(got[t][i], stale, err_msg=f"step {t} output {i}")


def test_full_cancellation_keeps_the_plans_edges_but_needs_no_join_rms():
    # Stream B computes nothing, so only its events remain: the same waits are issued...
    def syncs(dev):
        return [(type(op).__name__, op.stream, op.event) for op in dev.trace
                if isinstance(op, (EventRecord, StreamWait))]

    full, _, _, _ = _run(unscaled=(0, 1, 2))
    plain, _, _, _ = _run()
    # Per step: fork_a, fork_b, join_mm, join_rms (a record and a wait each), the war record;
    # from step 2 on, the war waits of A and B.
    assert len(syncs(plain)) == 3 * 9 + 2 * 2
    assert syncs(full) == syncs(plain)
    # ... and without join_rms there is nothing on B for the post-scale to race with.
    dev, _, _, _ = _run(SyncPlan.correct().without("join_rms"), unscaled=(0, 1, 2))
    assert dev.races == []
    dev, _, _, _ = _run(SyncPlan.correct().without("join_rms"), unscaled=(0, 1))
    assert [(r.kind, r.buffer, r.first.name) for r in dev.races] == [("RAW", "qkv.r", "rms")]


@pytest.mark.parametrize("unscaled, match", [
    ((3,), r"unscaled index 3 is out of range: weights has 3 projections \(indices 0\.\.2\)"),
    ((-1,), "unscaled index -1 is out of range"),
    ((0, 1, 0), "unscaled names projection 0 twice"),
    (("q",), "unscaled holds 'q'; it takes indices into weights"),
    ((True,), "unscaled holds True"),
    ((1.0,), "unscaled holds 1.0"),
    (1, "unscaled must be a list or tuple"),
    ("01", "unscaled must be a list or tuple"),
    (None, "unscaled must be a list or tuple"),
])
def test_bad_unscaled_is_a_clear_value_error(unscaled, match):
    with pytest.raises(ValueError, match=match):
        _module(unscaled=unscaled)


def test_good_unscaled_forms():
    assert _module(unscaled=[np.int64(1), 0]).unscaled == (0, 1)
    assert _module(unscaled=range(3)).unscaled == (0, 1, 2)
    mod = _module()
    assert mod.unscaled == () and mod.ones is None and mod.computes_rms
    assert "unscaled=[1]" in repr(_module(unscaled=(1,)))
