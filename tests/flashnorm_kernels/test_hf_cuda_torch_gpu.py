"""hf.attach(model, "cuda", kernels="torch") on a real GPU: the torch kernel path (hf_cuda,
"Kernel paths"; its CPU twin on the emulated device is test_hf_cuda_sim.py). Values against the
plain model in fp32 / fp16 / bf16; the correct plan generating the plain model's tokens on every
post-scale stream, eager and as a CUDA graph; the talk's plan stuttering from the step where
torch.cuda._sleep holds stream A back, reported by streamcheck.instrument as a RAW race between
the matmul and the post-scale, and refused at graph capture.

Run on a GPU machine:  python -m pytest -m gpu -q tests/flashnorm_kernels/test_hf_cuda_torch_gpu.py
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and an NVIDIA GPU", allow_module_level=True)

from flashnorm_kernels.hf import attach  # noqa: E402
from flashnorm_kernels.hf_cuda import GraphCaptureError, decode_with_graph, greedy_decode  # noqa: E402
from flashnorm_kernels.plan import SyncPlan  # noqa: E402
from flashnorm_kernels.testing.fixtures import PROMPT, encode, load_fixture_model  # noqa: E402
from tests.flashnorm_kernels.test_fold import tiny_model  # noqa: E402

PROMPT_IDS = encode(PROMPT)
P = len(PROMPT_IDS)
TOL = {torch.float32: 1e-4, torch.float16: 1.5e-2, torch.bfloat16: 6e-2}  # of the largest |logit|, as the CuPy path


@pytest.fixture(scope="module")
def model():
    return load_fixture_model("tiny_llama_zen").to("cuda")


@pytest.fixture(scope="module")
def reference(model):
    return greedy_decode(model, PROMPT_IDS, 64)[0, P:].tolist()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "phi3"])
def test_logits_match_the_plain_model(arch, dtype):
    plain = tiny_model(arch, dtype=dtype).to("cuda")
    ids = torch.randint(3, 180, (2, 12), generator=torch.Generator().manual_seed(0)).to("cuda")
    want = _logits(plain, ids)
    with attach(plain, "cuda", SyncPlan.correct(), max_tokens=24, kernels="torch") as attachment:
        assert [g.kernels for g in attachment.groups] == ["torch"] * len(attachment.groups)
        got = _logits(plain, ids)
        again = _logits(plain, ids)
    err = (got - want).abs().max().item()
    assert err <= TOL[dtype] * want.abs().max().item(), f"max |Δlogit| {err:.3g}"
    assert torch.equal(got, again)


@pytest.mark.parametrize("post_stream", ["caller", "A", "B"])
def test_every_post_stream_gives_the_plain_models_tokens_eager_and_graphed(model, reference, post_stream):
    with attach(model, "cuda", SyncPlan.correct(post_stream=post_stream), max_tokens=P, kernels="torch"):
        eager = greedy_decode(model, PROMPT_IDS, 64)
        graphed = decode_with_graph(model, PROMPT_IDS, 64)
    assert eager[0, P:].tolist() == reference
    assert torch.equal(graphed, eager)


def _held(model, plan, us=2000.0):
    """Tokens with every group's stream A slept `us` µs before its matmul from decode step 1 on."""
    torch.cuda._sleep(1000)  # torch's sleep kernel loaded before the held steps
    torch.cuda.synchronize()
    with attach(model, "cuda", plan, max_tokens=P, kernels="torch") as attachment:
        for group in attachment.groups:
            group.hold_matmul(us, after=1)
        return greedy_decode(model, PROMPT_IDS, 16)[0, P:].tolist()


def test_talks_plan_stutters_from_the_held_step_and_the_fixed_plan_survives_it(model, reference):
    tokens = _held(model, SyncPlan.implicit_join())
    assert tokens[0] == reference[0] and tokens[1] != reference[1], (tokens, reference[:16])
    assert _held(model, SyncPlan.correct()) == reference[:16]


def test_instrument_reports_the_missing_wait(model):
    from streamcheck.record import instrument

    session = instrument.start()
    try:
        with attach(model, "cuda", SyncPlan.implicit_join(), max_tokens=P, kernels="torch"):
            greedy_decode(model, PROMPT_IDS, 8)
    finally:
        instrument.stop()
    raw = [r for r in session.races if r.kind == "RAW" and r.first.name == "aten.mm.out"
           and r.second.name == "aten.mul.out"]
    assert raw, session.report()
    assert raw[0].first.write and not raw[0].second.write and raw[0].first.actor != raw[0].second.actor


def test_talks_plan_is_refused_at_capture(model):
    with attach(model, "cuda", SyncPlan.implicit_join(), max_tokens=P, kernels="torch"):
        with pytest.raises(GraphCaptureError, match="stream A \\(the matmul\\) is never joined back into the "
                                                    "capturing stream: missing join_mm"):
            decode_with_graph(model, PROMPT_IDS, 8)
