"""hf.attach(model, "cuda") on streamcheck's emulated CUDA device (the sim, on the CPU): the
torch kernel path (hf_cuda, "Kernel paths") runs the FlashNorm dual-stream pipeline on the tiny
Llama fixture. The talk's plan (SyncPlan.implicit_join()) is reported as a RAW race between the
matmul on stream A and the post-scale, and its greedy tokens stutter once stream A is held back
(a delay on A, torch.cuda._sleep through hold_matmul, seeded PCT schedules); the correct plan
reports nothing and generates the plain model's tokens under the same schedules.

The model uses eager attention: scaled_dot_product_attention fails under the emulation (a gap
of the emulation; eager attention is as right on a GPU)."""
from __future__ import annotations

import copy
import inspect

import pytest
import torch

from flashnorm_kernels import hf_cuda
from flashnorm_kernels.fold import FlashNormError
from flashnorm_kernels.hf import attach
from flashnorm_kernels.hf_cuda import CudaNormProjection, greedy_decode
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, encode, expected_continuation, load_fixture_model
from streamcheck.device import Device
from streamcheck.emulation.torch_cuda import Emulation

PROMPT_IDS = encode(PROMPT)
P = len(PROMPT_IDS)
TOKENS = 4  # the prompt's token and 3 decode steps: enough for the one-step lag to show
PCT_SEEDS = (0, 1, 2)  # depth 1: random stream priorities, no change point spent on loading the model


def _line(text: str) -> int:
    """The line of hf_cuda.py that holds `text` (once)."""
    lines = [i for i, line in enumerate(inspect.getsource(hf_cuda).splitlines(), 1) if text in line]
    assert len(lines) == 1, text
    return lines[0]


MATMUL_LINE = _line("torch.mm(x, self.weight.t(), out=self.y[:m])")
POSTSCALE_LINE = _line("torch.mul(self.y[:m, start:stop], scale, out=out)")


@pytest.fixture(scope="module")
def model():
    model = load_fixture_model("tiny_llama_zen").requires_grad_(False)
    model.set_attn_implementation("eager")
    return model


@pytest.fixture(scope="module")
def plain_tokens(model):
    """The plain model's greedy tokens, on the CPU, no emulation."""
    tokens = greedy_decode(model, PROMPT_IDS, TOKENS)[0, P:].tolist()
    assert bytes(tokens) == expected_continuation(P, TOKENS)
    return tokens


def _on_emulated_cuda(model):
    """A copy of `model` on the emulated device (inside an Emulation)."""
    return copy.deepcopy(model).to("cuda")


def _generate(model, plan, hold_us=0, **policy):
    """(tokens, sim Device) of greedy decoding with `model` attached by `plan` on the sim under
    `policy`; `hold_us`: every group's hold_matmul from the first decode step on."""
    device = Device("sim", **policy)
    with Emulation(device):
        on_cuda = _on_emulated_cuda(model)
        with attach(on_cuda, "cuda", plan, max_tokens=P) as attachment:
            assert [g.kernels for g in attachment.groups] == ["torch"] * 5  # auto: CuPy is refused under the sim
            for group in attachment.groups:
                group.hold_matmul(hold_us, after=1)
            tokens = greedy_decode(on_cuda, PROMPT_IDS, TOKENS)[0, P:].tolist()
    return tokens, device


def _matmul_to_postscale(race) -> bool:
    return (race.kind == "RAW" and race.first.name == "aten.mm.out" and race.second.name == "aten.mul.out"
            and race.first.write and not race.second.write
            and race.first.site.file.endswith("hf_cuda.py") and race.first.site.line == MATMUL_LINE
            and race.second.site.file.endswith("hf_cuda.py") and race.second.site.line == POSTSCALE_LINE)


# The held-back matmuls: every group's stream A (s1, s3, ... : A and B are made in that order per
# group), from the first decode step on (the prompt step's 5 matmuls pass).
DELAY_ON_A = dict(policy="delay", streams=["s1", "s3", "s5", "s7", "s9"], kernels=["aten.mm.out"], steps=16,
                  after=5)


def test_the_talks_plan_is_reported_and_stutters_from_the_first_held_step_under_a_delay_on_a(model, plain_tokens):
    tokens, device = _generate(model, SyncPlan.implicit_join(), **DELAY_ON_A)
    raw = [race for race in device.races if _matmul_to_postscale(race)]
    assert len(raw) == 1, device.report()
    assert "missing edge: legacy default stream never waited for an event recorded on stream s1 after " \
           "`aten.mm.out`" in raw[0].format()
    # The prompt step is not held: its token is right. From the first decode step on, the
    # post-scale reads the previous step's Y.
    assert tokens[0] == plain_tokens[0] and tokens[1] != plain_tokens[1], (tokens, plain_tokens)


def test_hold_matmul_is_torch_cuda_sleep_on_a(model, plain_tokens):
    # 20 ms at the emulated device's 2 GHz: 40 M cycles, a hold of 40 host steps on A.
    tokens, device = _generate(model, SyncPlan.implicit_join(), hold_us=20_000, policy="eager")
    assert any(_matmul_to_postscale(race) for race in device.races)
    assert tokens[0] == plain_tokens[0] and tokens[1] != plain_tokens[1], (tokens, plain_tokens)
    fixed, device = _generate(model, SyncPlan.correct(), hold_us=20_000, policy="eager")
    assert fixed == plain_tokens and not device.races, device.report()


def test_the_talks_plan_stutters_under_a_seeded_pct_schedule(model, plain_tokens):
    runs = {seed: _generate(model, SyncPlan.implicit_join(), policy="pct", seed=seed, depth=1)
            for seed in PCT_SEEDS}
    assert all(any(_matmul_to_postscale(race) for race in device.races) for _, device in runs.values())
    assert any(tokens != plain_tokens for tokens, _ in runs.values()), {s: t for s, (t, _) in runs.items()}


@pytest.mark.parametrize("policy", [dict(policy="sequential"), DELAY_ON_A] +
                         [dict(policy="pct", seed=seed, depth=1) for seed in PCT_SEEDS],
                         ids=["sequential", "delay-on-A"] + [f"pct-{seed}" for seed in PCT_SEEDS])
def test_the_correct_plan_generates_the_plain_models_tokens_and_reports_no_race(model, plain_tokens, policy):
    tokens, device = _generate(model, SyncPlan.correct(), **policy)
    assert not device.races, device.report()
    assert tokens == plain_tokens


def test_the_torch_path_computes_the_plain_models_logits(model):
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        want = model(ids).logits
    with Emulation(Device("sim", policy="sequential")):
        on_cuda = _on_emulated_cuda(model)
        with attach(on_cuda, "cuda", max_tokens=P, kernels="torch"), torch.no_grad():
            dual = on_cuda(ids.to("cuda")).logits.cpu()  # 34 rows: the dual-stream path
        with attach(on_cuda, "cuda", max_tokens=P, prefill_rows=1), torch.no_grad():
            prescaled = on_cuda(ids.to("cuda")).logits.cpu()  # the pre-scaled single-stream path
    scale = want.abs().max().item()
    assert (dual - want).abs().max().item() <= 1e-5 * scale
    assert (prescaled - want).abs().max().item() <= 1e-5 * scale


def test_a_plan_with_blocking_side_streams_is_refused_on_the_torch_path(model):
    with Emulation(Device("sim")):
        on_cuda = _on_emulated_cuda(model)
        names = {name: id(module) for name, module in on_cuda.named_modules()}
        for kernels, took in (("torch", ""), ("auto", " took the torch path \\(CuPy does not import here\\) and")):
            with pytest.raises(FlashNormError, match=rf"^flashnorm attach\(model, 'cuda', kernels='{kernels}'\){took}: "
                                                     r"the plan has blocking side streams \(side_kind='blocking'\), "
                                                     r"which torch cannot make .* use kernels='cupy'"):
                attach(on_cuda, "cuda", SyncPlan.correct(side_kind="blocking"), kernels=kernels)
        assert {name: id(module) for name, module in on_cuda.named_modules()} == names  # nothing attached
        with pytest.raises(FlashNormError, match="side_kind='blocking'"):
            CudaNormProjection("norm", on_cuda.model.norm, [on_cuda.lm_head], "llama", eps=1e-6,
                               plan=SyncPlan.implicit_join(side_kind="blocking"), max_tokens=4, kernels="torch")


def test_kernels_cupy_under_the_sim_says_how_to_install_cupy(model):
    with Emulation(Device("sim")):
        on_cuda = _on_emulated_cuda(model)
        with pytest.raises(ImportError, match=r"pip install 'streamcheck\[gpu\]'"):
            attach(on_cuda, "cuda", kernels="cupy")


@pytest.mark.parametrize("devices", ["cuda", "sim"])
def test_bad_kernels_values(model, devices):
    if devices == "sim":
        with pytest.raises(ValueError, match="kernels='torch' applies to the CUDA path"):
            attach(copy.deepcopy(model), Device("sim"), kernels="torch")
        return
    with pytest.raises(ValueError, match="kernels must be one of 'auto', 'cupy', 'torch', got 'triton'"):
        attach(copy.deepcopy(model), "cuda", kernels="triton")
