"""The dual-stream deferred-normalization pipeline on a real GPU (cupy backend):
values for every dtype and shape class, correct() identical to sequential execution,
and the implicit join reading the previous step's Y under injected delay.

Run on a GPU machine:  pytest -m gpu tests/flashnorm_kernels/test_pipeline_gpu.py
"""
from __future__ import annotations

import numpy as np
import pytest

from streamcheck.device.backends import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available():
    pytest.skip("needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]')", allow_module_level=True)

from flashnorm_kernels import kernels_cpu  # noqa: E402
from flashnorm_kernels.pipeline import DeferredNormProjection, reference_norm_proj  # noqa: E402
from flashnorm_kernels.plan import SyncPlan  # noqa: E402
from streamcheck.device import Device  # noqa: E402
from streamcheck.core.trace import Launch  # noqa: E402

EPS = 1e-5
DTYPES = ["bfloat16", "float16", "float32"]
# name: (M, d, out features). d and the outputs shrink as M grows to keep the run short;
# "unaligned" has widths that are not multiples of 8, so the kernels take their scalar path.
SHAPES = {
    "decode1": (1, 1024, (1024, 256, 256)),
    "decode16": (16, 1024, (1024, 256, 256)),
    "decode64": (64, 1024, (1024, 256, 256)),
    "prefill512": (512, 1024, (512, 256, 256)),
    "prefill4096": (4096, 256, (256, 64, 64)),
    "prefill8192": (8192, 128, (128, 64)),
    "unaligned": (33, 100, (36, 20)),
}
# Largest error relative to the largest reference value. fp32: cuBLAS fp32 (no TF32);
# fp16 / bf16: Y and the output are each rounded once (2^-11, 2^-8 relative).
TOL = {"float32": 1e-4, "float16": 3e-3, "bfloat16": 2e-2}


def _need_dtype(dtype):
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch", reason="the bf16 GEMM runs through torch")
        if not torch.cuda.is_available():
            pytest.skip("the bf16 GEMM runs through torch; needs a CUDA build of torch")


def _weights(outs, d, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n, d)) / np.sqrt(d)).astype(np.float32) for n in outs]


def _inputs(steps, rows, d, seed=1):
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 4.0, size=(steps, rows, 1))
    return (rng.standard_normal((steps, rows, d)) * scale).astype(np.float32)


def _device(policy="eager", seed=0, **params):
    dev = Device("cupy", policy=policy, seed=seed, **params)
    dev.backend.warm_up()  # first cuBLAS call, module loads, pool growth: not edges, but they hide races
    return dev


def _run(dev, plan, weights, xs, dtype, warmup_steps=0, unscaled=()):
    """Steps over xs (one input per step, each in its own rows, uploaded on the caller's
    stream); after each step synchronize the device and read Y, r and the outputs."""
    steps, rows, d = xs.shape
    mod = DeferredNormProjection(dev, weights, eps=EPS, plan=plan, dtype=dtype, max_tokens=rows, name="qkv",
                                 unscaled=unscaled)
    caller = dev.legacy if plan.caller_kind == "legacy" else dev.stream("caller", kind=plan.caller_kind)
    xbuf = mod.alloc_input(steps * rows, name="x")
    outs, ys, rs = [], [], []
    for t in range(steps):
        x = xbuf[t * rows:(t + 1) * rows]
        dev.upload(x, mod.encode(xs[t]), stream=caller)
        regions = mod(x, caller)
        dev.synchronize()
        outs.append([mod.decode(dev.host_read(o)) for o in regions])
        ys.append(mod.decode(dev.host_read(mod.y[:rows])))
        rs.append(dev.host_read(mod.r[:rows]))
    return mod, outs, ys, rs


def _quantized(values, dtype):
    if dtype == "bfloat16":
        return kernels_cpu.round_to_bf16(values)
    return np.asarray(values, np.float32).astype(dtype).astype(np.float32)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(dtype, shape):
    _need_dtype(dtype)
    rows, d, outs = SHAPES[shape]
    weights = _weights(outs, d)
    xs = _inputs(2, rows, d)
    dev = _device()
    _, got, _, rs = _run(dev, SyncPlan.correct(), weights, xs, dtype)
    assert dev.races == []
    qw = [_quantized(w, dtype) for w in weights]
    for t in range(2):
        qx = _quantized(xs[t], dtype).astype(np.float64)
        want_r = 1.0 / np.sqrt(np.mean(qx * qx, axis=1) + EPS)
        np.testing.assert_allclose(rs[t], want_r, rtol=1e-5)
        for i, (g, ref) in enumerate(zip(got[t], reference_norm_proj(qx, qw, EPS))):
            err = np.abs(g - ref).max() / np.abs(ref).max()
            assert err < TOL[dtype], f"{dtype} {shape} step {t} output {i}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_correct_plan_is_identical_to_sequential(dtype):
    _need_dtype(dtype)
    rows, d, outs = SHAPES["decode16"]
    weights = _weights(outs, d)
    xs = _inputs(4, rows, d, seed=3)
    _, want, _, _ = _run(_device("sequential"), SyncPlan.correct(), weights, xs, dtype)
    for policy, params in [("eager", {}), ("random", {}), ("pct", {}),
                           ("delay", dict(kernels=("matmul",), delay_us=2000)),
                           ("delay", dict(streams=("qkv.B",), delay_us=2000))]:
        for seed in range(2):
            dev = _device(policy, seed, **params)
            _, got, _, _ = _run(dev, SyncPlan.correct(), weights, xs, dtype)
            assert dev.races == []
            for t in range(4):
                for g, w in zip(got[t], want[t]):
                    np.testing.assert_array_equal(g, w, err_msg=f"{dtype} {policy} {params} seed={seed} step {t}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_implicit_join_under_delay_reads_the_previous_step(dtype):
    _need_dtype(dtype)
    rows, d, outs = SHAPES["decode1"]
    weights = _weights(outs, d)
    xs = _inputs(6, rows, d, seed=5)
    # 5 ms of spin before every matmul: far longer than the host takes to issue the rest of the step.
    dev = _device("delay", kernels=("matmul",), delay_us=5000)
    mod, got, ys, rs = _run(dev, SyncPlan.implicit_join(), weights, xs, dtype)
    assert [(r.kind, r.buffer, r.first.name, r.second.name) for r in dev.races] == [
        ("RAW", "qkv.Y", "matmul", "postscale")]
    qw = [_quantized(w, dtype) for w in weights]
    for t in range(2, 6):  # steps 0-1 also warm up torch/cuBLAS on the new streams
        for i, (start, stop) in enumerate(mod.columns):
            # Exactly the previous step's Y scaled by this step's r (same rounding as the kernel).
            stale = np.empty((rows, stop - start), np.float32)
            kernels_cpu.postscale(ys[t - 1], rs[t], stale, columns=[(start, stop)], bf16=dtype == "bfloat16")
            if dtype == "float16":
                stale = stale.astype(np.float16).astype(np.float32)
            np.testing.assert_array_equal(got[t][i], stale, err_msg=f"step {t} output {i}")
            right = reference_norm_proj(_quantized(xs[t], dtype), [qw[i]], EPS)[0]
            assert np.abs(got[t][i] - right).max() > 0.1 * np.abs(right).max()

    # The fixed plan under the same delay is right.
    dev = _device("delay", kernels=("matmul",), delay_us=5000)
    _, fixed, _, _ = _run(dev, SyncPlan.correct(), weights, xs, dtype)
    assert dev.races == []
    for t in range(6):
        for g, ref in zip(fixed[t], reference_norm_proj(_quantized(xs[t], dtype), qw, EPS)):
            assert np.abs(g - ref).max() / np.abs(ref).max() < TOL[dtype]


def test_blocking_side_streams_with_legacy_caller_are_safe_without_join():
    # The legacy default stream waits for earlier work on blocking streams (docs/cuda-rules.md, measured on an H200).
    rows, d, outs = SHAPES["decode1"]
    weights = _weights(outs, d)
    xs = _inputs(4, rows, d, seed=9)
    dev = _device("delay", kernels=("matmul",), delay_us=5000)
    _, got, _, _ = _run(dev, SyncPlan.implicit_join(side_kind="blocking"), weights, xs, "float32")
    assert dev.races == []
    for t in range(4):
        for g, ref in zip(got[t], reference_norm_proj(xs[t], weights, EPS)):
            assert np.abs(g - ref).max() / np.abs(ref).max() < TOL["float32"]


# --- Prop 3: unscaled outputs (the same post-scale kernel, a buffer of ones as the scale) ---

def _postscaled(y, r, start, stop, dtype):
    """What the post-scale kernel writes for Y's columns [start, stop) and scale r (its rounding)."""
    out = np.empty((y.shape[0], stop - start), np.float32)
    kernels_cpu.postscale(y, r, out, columns=[(start, stop)], bf16=dtype == "bfloat16")
    return out.astype(np.float16).astype(np.float32) if dtype == "float16" else out


@pytest.mark.parametrize("shape", ["decode1", "prefill512"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_unscaled_outputs_match_the_sim_twin(dtype, shape):
    _need_dtype(dtype)
    rows, d, outs = SHAPES[shape]
    weights = _weights(outs, d)
    xs = _inputs(2, rows, d, seed=13)
    dev = _device("random", seed=1)
    mod, got, ys, rs = _run(dev, SyncPlan.correct(), weights, xs, dtype, unscaled=(0, 1))
    assert dev.races == []
    assert [op.name for op in dev.trace if isinstance(op, Launch)] == ["matmul", "rms", "postscale"] * 2
    _, twin, _, _ = _run(Device("sim"), SyncPlan.correct(), weights, xs, dtype, unscaled=(0, 1))
    for t in range(2):
        for i, (start, stop) in enumerate(mod.columns):
            if i in (0, 1):  # bit for bit the GPU's own Y: y·1 rounded once is y
                np.testing.assert_array_equal(got[t][i], ys[t][:, start:stop], err_msg=f"step {t} output {i}")
            else:  # the scaled output, exactly as without unscaled=
                np.testing.assert_array_equal(got[t][i], _postscaled(ys[t], rs[t], start, stop, dtype),
                                              err_msg=f"step {t} output {i}")
            # cuBLAS and numpy round Y differently: the sim twin agrees to the dtype's tolerance.
            err = np.abs(got[t][i] - twin[t][i]).max() / np.abs(twin[t][i]).max()
            assert err < TOL[dtype], f"{dtype} {shape} step {t} output {i}: {err:.2e} from the sim twin"


@pytest.mark.parametrize("dtype", DTYPES)
def test_full_cancellation_launches_no_rms(dtype):
    _need_dtype(dtype)
    rows, d, outs = SHAPES["decode16"]
    weights = _weights(outs, d)
    xs = _inputs(3, rows, d, seed=17)
    dev = _device("delay", kernels=("matmul",), delay_us=2000)  # stream B carries only events now
    mod, got, ys, _ = _run(dev, SyncPlan.correct(), weights, xs, dtype, unscaled=(0, 1, 2))
    assert dev.races == []
    assert [op.name for op in dev.trace if isinstance(op, Launch)] == ["matmul", "postscale"] * 3
    for t in range(3):
        for i, (start, stop) in enumerate(mod.columns):
            np.testing.assert_array_equal(got[t][i], ys[t][:, start:stop], err_msg=f"step {t} output {i}")
