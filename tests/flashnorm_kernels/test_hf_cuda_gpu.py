"""The FlashNorm subject on a real torch CUDA model: hf.attach(model, "cuda", plan).

Values against the plain model in bf16 / fp16 / fp32 on both paths (dual-stream below
prefill_rows, pre-scaled from it), biases included; the fixed plan generating the plain
model's tokens over 1024 tokens and at batch 16; the talk's plan stuttering with the one-step
lag when stream A is held back at a chosen decode step, and reported by streamcheck.instrument
as a RAW race between the matmul and the post-scale while it generates (the fixed plan: no
race); the decode step as one CUDA graph replaying to the eager tokens, and the talk's plan
refused at capture.

Run on a GPU machine:  python -m pytest -m gpu -q tests/flashnorm_kernels/test_hf_cuda_gpu.py
"""
from __future__ import annotations

import json

import pytest
import torch

from streamcheck.device.backends import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available() or not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU, CuPy (pip install 'streamcheck[gpu]') and a CUDA build of torch",
                allow_module_level=True)

from flashnorm_kernels.commands.repro import strike_hold, strike_policy  # noqa: E402
from flashnorm_kernels.generation import check_generation_cuda, run_generation_cuda  # noqa: E402
from flashnorm_kernels.hf import attach  # noqa: E402
from flashnorm_kernels.groups import RoutedProjection  # noqa: E402
from flashnorm_kernels.hf_cuda import (CudaNormProjection, GraphCaptureError,  # noqa: E402
                                       decode_with_graph, greedy_decode)
from flashnorm_kernels.plan import SyncPlan  # noqa: E402
from flashnorm_kernels.testing.fixtures import (PROMPT, cyclic_bytes, decode, encode,  # noqa: E402
                                                expected_continuation, load_fixture_model)
from tests.flashnorm_kernels.test_fold import tiny_model  # noqa: E402

PROMPT_IDS = encode(PROMPT)
P = len(PROMPT_IDS)
LONG = 1024  # tokens of the long generation (the fixture is verified over 1024)
TOL = {torch.float32: 1e-4, torch.float16: 1.5e-2, torch.bfloat16: 6e-2}  # of the largest |logit|


@pytest.fixture(scope="module")
def model():
    return load_fixture_model("tiny_llama_zen").to("cuda")


@pytest.fixture(scope="module")
def reference(model):
    """The plain model's greedy tokens (transformers' generate, fp32)."""
    ids = torch.tensor([PROMPT_IDS], device="cuda")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=LONG,
                             min_new_tokens=LONG)
    return out[0, P:].tolist()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.double()


# --- values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "phi3"])
@pytest.mark.parametrize("prefill_rows", [256, 1])
def test_logits_match_the_plain_model(arch, dtype, prefill_rows):
    # qwen2: q/k/v biases (added after the deferred scale); gemma2: the 1 + w gain; phi3: fused
    # projections. 2 × 12 = 24 rows: dual-stream below prefill_rows=256, pre-scaled with 1.
    plain = tiny_model(arch, dtype=dtype).to("cuda")
    ids = torch.randint(3, 180, (2, 12), generator=torch.Generator().manual_seed(0)).to("cuda")
    want = _logits(plain, ids)
    with attach(plain, "cuda", SyncPlan.correct(), max_tokens=24, prefill_rows=prefill_rows) as attachment:
        assert all(isinstance(g, CudaNormProjection) for g in attachment.groups)
        got = _logits(plain, ids)
        again = _logits(plain, ids)  # the persistent buffers reused: the same values
    err = (got - want).abs().max().item()
    assert err <= TOL[dtype] * want.abs().max().item(), f"max |Δlogit| {err:.3g}"
    assert torch.equal(got, again)


def test_detach_restores_the_original_modules_bit_for_bit(model):
    ids = torch.tensor([PROMPT_IDS], device="cuda")
    originals = dict(model.named_modules())
    before = _logits(model, ids)
    with attach(model, "cuda", max_tokens=P) as attachment:
        assert isinstance(model.model.layers[0].self_attn.q_proj, RoutedProjection)
        assert len(attachment.groups) == 5  # 2 layers x (q/k/v, gate/up) + lm_head
    assert dict(model.named_modules()) == originals
    assert torch.equal(_logits(model, ids), before)


# --- generation -----------------------------------------------------------------------------

def test_fixed_plan_generates_the_plain_models_tokens_over_1024_tokens(model, reference):
    assert bytes(reference) == expected_continuation(P, LONG)
    run = run_generation_cuda(model, PROMPT_IDS, LONG, SyncPlan.correct(), check=False)
    assert run.tokens == reference  # fp32: exact, token for token


def test_greedy_decode_and_generate_agree_on_the_attached_model(model, reference):
    ids = torch.tensor([PROMPT_IDS], device="cuda")
    with attach(model, "cuda", max_tokens=P):
        dynamic = greedy_decode(model, ids, 128)
        static = greedy_decode(model, ids, 128, static_cache=True)
    assert dynamic[0, P:].tolist() == reference[:128]
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("post_stream", ["caller", "A", "B"])
@pytest.mark.parametrize("side_kind", ["non_blocking", "blocking"])
def test_every_safe_post_stream_and_side_kind_gives_the_same_tokens(model, reference, post_stream, side_kind):
    plan = SyncPlan.correct(post_stream=post_stream, side_kind=side_kind)
    with attach(model, "cuda", plan, max_tokens=P):
        out = greedy_decode(model, PROMPT_IDS, 64)
        graphed = decode_with_graph(model, PROMPT_IDS, 64)
    assert out[0, P:].tolist() == reference[:64]
    assert torch.equal(graphed, out)


def _batch_prompts(batch: int) -> torch.Tensor:
    # Different rows (the prompt at different offsets of the cyclic text): rows mixed up would show.
    return torch.tensor([encode(cyclic_bytes(offset * 37, P)) for offset in range(batch)], device="cuda")


@pytest.mark.parametrize("graph", [False, True])
def test_batch_16_gives_the_plain_models_tokens_row_by_row(model, graph):
    # 16 × 34 = 544 prefill rows (the pre-scaled path), then 16-row decode steps (dual-stream).
    ids = _batch_prompts(16)
    want = greedy_decode(model, ids, 96)
    with attach(model, "cuda", max_tokens=16 * P):
        got = (decode_with_graph if graph else greedy_decode)(model, ids, 96)
    for row in range(16):
        assert got[row].tolist() == want[row].tolist(), f"row {row}"
    assert len({bytes(row[P:].tolist()) for row in want}) > 1  # the rows really differ


def test_prefill_at_prefill_rows_takes_the_single_stream_path(model, reference):
    # The talk's plan with stream A held back at step 0 (the prompt's): the pre-scaled path
    # has no post-scale to read Y early, so the text is right.
    with attach(model, "cuda", SyncPlan.implicit_join(), max_tokens=P, prefill_rows=P) as attachment:
        attachment.group("layers.0.input_layernorm").hold_matmul(2000, after=0, every=10_000)
        out = greedy_decode(model, PROMPT_IDS, 1)
    assert out[0, P:].tolist() == reference[:1]


def test_a_prompt_longer_than_max_tokens_is_refused_naming_it(model):
    with attach(model, "cuda", max_tokens=8):
        with pytest.raises(ValueError, match=rf"1 × {P} = {P} rows .* max_tokens=8; attach with max_tokens >= {P}"):
            greedy_decode(model, PROMPT_IDS, 4)
        with pytest.raises(ValueError, match=rf"got {P} rows .* but max_tokens=8; pass max_tokens >= {P}"):
            _logits(model, torch.tensor([PROMPT_IDS], device="cuda"))


def test_training_mode_forward_is_refused(model):
    with attach(model, "cuda", max_tokens=P):
        with pytest.raises(RuntimeError, match="torch.no_grad\\(\\)"):
            model(torch.tensor([PROMPT_IDS], device="cuda"))


# --- the talk's bug -------------------------------------------------------------------------

# The first divergence and the lag share: strikes other than the held ones would move them.
@pytest.mark.streamcheck_gpu_timing
@pytest.mark.parametrize("seed", [0, 7])
def test_talks_plan_stutters_with_a_one_step_lag_when_the_matmul_is_held(model, reference, seed):
    strike = strike_policy("cupy", seed)
    result = check_generation_cuda(model, PROMPT_IDS, 96, SyncPlan.implicit_join(), hold=strike_hold(strike),
                                   check=False)
    comparison = result.comparison
    first = strike["after"]
    assert result.reference.tokens == reference[:96]
    assert not comparison.matches
    assert first <= comparison.first_divergence < first + 4, result.message(decode)
    assert comparison.lag1_share > 0.5, result.message(decode)


def test_fixed_plan_survives_the_same_hold(model, reference):
    run = run_generation_cuda(model, PROMPT_IDS, 96, SyncPlan.correct(), hold=strike_hold(strike_policy("cupy", 0)),
                              check=False)
    assert run.tokens == reference[:96]


def test_instrument_reports_the_missing_wait_while_it_generates(model, reference):
    run = run_generation_cuda(model, PROMPT_IDS, 48, SyncPlan.implicit_join())  # no hold: it may well hide
    raw = [r for r in run.races if r.kind == "RAW" and "aten.mm" in r.first.name
           and r.second.name.startswith("postscale")]
    assert raw, run.report()
    assert raw[0].first.write and not raw[0].second.write
    assert raw[0].first.actor != raw[0].second.actor  # stream A against the caller's stream


def test_instrument_finds_nothing_in_the_fixed_plan(model, reference):
    run = run_generation_cuda(model, PROMPT_IDS, 48, SyncPlan.correct())
    assert run.tokens == reference[:48]
    assert run.races == [] and run.device.capture_errors == [], run.report()


def test_fixed_plan_under_the_streamcheck_gpu_fixture(model, reference, streamcheck_gpu):
    # The fixture fails the test on any race it records (torch ops, CuPy kernels, the events).
    with attach(model, "cuda", SyncPlan.correct(), max_tokens=P):
        out = greedy_decode(model, PROMPT_IDS, 32)
    assert out[0, P:].tolist() == reference[:32]


# --- CUDA graphs ----------------------------------------------------------------------------

def test_graph_decode_of_the_plain_model_matches_eager(model, reference):
    assert decode_with_graph(model, PROMPT_IDS, 128)[0, P:].tolist() == reference[:128]


@pytest.mark.parametrize("batch", [1, 4])
def test_graph_decode_replays_to_the_eager_tokens(model, reference, batch):
    ids = _batch_prompts(batch) if batch > 1 else torch.tensor([PROMPT_IDS], device="cuda")
    with attach(model, "cuda", SyncPlan.correct(), max_tokens=batch * P):
        eager = greedy_decode(model, ids, 256, static_cache=True)
        graphed = decode_with_graph(model, ids, 256)
        eager_after = greedy_decode(model, ids, 64)  # eager again after the graph: no stale war wait
    assert torch.equal(graphed, eager)
    assert torch.equal(eager_after, eager[:, :P + 64])
    if batch == 1:
        assert graphed[0, P:].tolist() == reference[:256]


def test_talks_plan_is_refused_at_capture_naming_the_missing_join(model, reference):
    torch.cuda.manual_seed(7)
    torch.randn(8, device="cuda")
    expected_draw = torch.randn(8, device="cuda")  # the draw after the refusal continues the sequence
    torch.cuda.manual_seed(7)
    torch.randn(8, device="cuda")
    with attach(model, "cuda", SyncPlan.implicit_join(), max_tokens=P):
        with pytest.raises(GraphCaptureError) as info:
            decode_with_graph(model, PROMPT_IDS, 8)
    # The refused capture left the random generator as it was (pytorch/pytorch#171263 leaves it in
    # capture mode, and every later draw raised "Offset increment outside graph capture").
    assert torch.equal(torch.randn(8, device="cuda"), expected_draw)
    message = str(info.value)
    assert "stream A (the matmul) is never joined back into the capturing stream: missing join_mm" in message
    assert "cudaErrorStreamCaptureUnjoined" in message and "SyncPlan.correct()" in message
    # CUDA's refusal ends the capture: the GPU and torch work on as before.
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert greedy_decode(model, PROMPT_IDS, 32)[0, P:].tolist() == reference[:32]


def test_repro_cupy_runs_the_cuda_path(capsys, tmp_path):
    from streamcheck.cli import main

    report, trace = tmp_path / "repro.json", tmp_path / "race.json"
    status = main(["repro", "implicit-join", "--backend", "cupy", "--tokens", "48", "--seed", "0",
                   "--json", str(report), "--trace", str(trace)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "explained by a one-step lag" in out and "RAW race on `torch tensor" in out, out
    assert "second: " in out and "`postscale_f32" in out, out
    assert "SyncPlan.correct() under the same delay: tokens match the sequential reference (48 tokens); 0 races" in out
    data = json.loads(report.read_text())
    assert data["reproduced"] and data["fixed"] and data["implicit_join"]["races"]
    assert "traceEvents" in json.loads(trace.read_text())
