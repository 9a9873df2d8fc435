"""hf.attach(model, "cuda") and hf_cuda's decoding, the parts that run without a GPU: bad input
refused before anything is replaced (the model left exactly as it was), the CuPy message,
greedy decoding against transformers' generate, and the plan analysis that names a capture's
missing join, checked against streamcheck's capture model. The GPU half is
test_hf_cuda_gpu.py."""
from __future__ import annotations

import sys

import pytest
import torch

from flashnorm_kernels import hf_cuda
from flashnorm_kernels.fold import FlashNormError, UnsupportedArchitectureError
from flashnorm_kernels.hf import attach
from flashnorm_kernels.hf_cuda import greedy_decode, unjoined_forks
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, encode, expected_continuation, load_fixture_model
from streamcheck.core.capture import CaptureError
from streamcheck.device import Device

PROMPT_IDS = encode(PROMPT)


@pytest.fixture
def model():
    return load_fixture_model("tiny_llama_zen")


def _snapshot(model) -> tuple:
    """Which module object sits at every path, and every tensor's values."""
    modules = {name: id(module) for name, module in model.named_modules()}
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    return modules, state


def _unchanged(model, snapshot) -> bool:
    modules, state = snapshot
    now = {name: id(module) for name, module in model.named_modules()}
    tensors = model.state_dict()
    return now == modules and tensors.keys() == state.keys() and all(
        tensors[k].dtype == v.dtype and torch.equal(tensors[k], v) for k, v in state.items())


@pytest.mark.parametrize("where", ["cuda", "cuda:0", torch.device("cuda")])
def test_a_model_on_the_cpu_passed_with_cuda_is_refused_and_left_as_it_was(model, where):
    before = _snapshot(model)
    with pytest.raises(FlashNormError, match=r"parameters are on cpu, not CUDA; move it first \(model.to\('cuda'\)\)"):
        attach(model, where, SyncPlan.correct())
    assert _unchanged(model, before)


def test_a_dtype_the_kernels_lack_is_refused_before_the_device_is_looked_at(model):
    model = model.double()
    before = _snapshot(model)
    with pytest.raises(FlashNormError, match="torch.float64, which the CUDA kernels do not support; use bfloat16, "
                                             "float16 or float32"):
        attach(model, "cuda")
    assert _unchanged(model, before)


def test_a_dtype_argument_that_disagrees_with_the_model_is_refused(model):
    with pytest.raises(FlashNormError, match="dtype='bfloat16' but the model is torch.float32"):
        attach(model, "cuda", dtype="bfloat16")


def test_an_unsupported_architecture_is_refused_on_both_paths_and_left_as_it_was():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0)
    gpt2 = GPT2LMHeadModel(config)
    before = _snapshot(gpt2)
    for devices in ("cuda", Device("sim")):
        with pytest.raises(UnsupportedArchitectureError, match=r"flashnorm attach.*model_type 'gpt2' is not "
                                                               r"supported. Supported model types: gemma"):
            attach(gpt2, devices)
        assert _unchanged(gpt2, before)


@pytest.mark.parametrize("devices", ["cuda", "sim"])
def test_a_group_that_is_not_what_the_layout_says_is_refused_before_any_group_is_replaced(model, devices):
    # Layer 1's up_proj is no Linear: layer 0's groups, checked first, must not be replaced either.
    model.model.layers[1].mlp.up_proj = torch.nn.Identity()
    before = _snapshot(model)
    with pytest.raises(FlashNormError, match=r"model.layers.1.mlp.up_proj is not a Linear with in_features=96 "
                                             r"\(got Identity\).*Nothing was attached"):
        attach(model, Device(devices) if devices == "sim" else devices)
    assert _unchanged(model, before)


def test_a_norm_without_its_gain_is_refused(model):
    model.model.layers[0].input_layernorm = torch.nn.LayerNorm(96, elementwise_affine=False)
    before = _snapshot(model)
    with pytest.raises(FlashNormError, match="model.layers.0.input_layernorm \\(LayerNorm\\) has no 1-D gain"):
        attach(model, "cuda")
    assert _unchanged(model, before)


def test_attaching_twice_is_refused_and_detach_restores_the_originals(model):
    originals = {name: module for name, module in model.named_modules()}
    with torch.no_grad():
        want = model(torch.tensor([PROMPT_IDS])).logits
    attachment = attach(model, Device("sim"), max_tokens=len(PROMPT_IDS))
    assert not isinstance(model.model.layers[0].self_attn.q_proj, torch.nn.Linear)  # routed through the sim
    with pytest.raises(FlashNormError, match="already attached\\? detach\\(\\) first"):
        attach(model, "cuda")
    attachment.detach()
    attachment.detach()  # a second detach does nothing
    assert {name: module for name, module in model.named_modules()} == originals
    with torch.no_grad():
        assert torch.equal(model(torch.tensor([PROMPT_IDS])).logits, want)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
    (dict(max_tokens=True), "max_tokens must be an integer >= 1, got True"),
    (dict(prefill_rows=0), "prefill_rows must be an integer >= 1, got 0"),
    (dict(plan="correct"), "plan must be a SyncPlan"),
    (dict(cancel=True), "cancel=True \\(Prop 3\\) runs on the device API only"),
])
def test_bad_arguments_of_the_cuda_path(model, kwargs, message):
    before = _snapshot(model)
    with pytest.raises(ValueError, match=message):
        attach(model, "cuda", **kwargs)
    assert _unchanged(model, before)


def test_prefill_rows_belongs_to_the_cuda_path(model):
    with pytest.raises(ValueError, match="prefill_rows applies to the CUDA path"):
        attach(model, Device("sim"), prefill_rows=16)


def test_without_cupy_the_message_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'streamcheck\[gpu\]'"):
        hf_cuda.import_cupy()


@pytest.mark.parametrize("static_cache", [False, True])
def test_greedy_decode_matches_transformers_generate(model, static_cache):
    ids = torch.tensor([PROMPT_IDS, PROMPT_IDS])
    got = greedy_decode(model, ids, 48, static_cache=static_cache)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48,
                              min_new_tokens=48)
    assert got.dtype == torch.long and got.shape == (2, len(PROMPT_IDS) + 48)
    assert torch.equal(got, want)
    assert bytes(got[1, len(PROMPT_IDS):].tolist()) == expected_continuation(len(PROMPT_IDS), 48)


def test_greedy_decode_takes_a_list_prompt_and_one_token(model):
    got = greedy_decode(model, PROMPT_IDS, 1)
    assert got.shape == (1, len(PROMPT_IDS) + 1)
    assert bytes(got[0, -1:].tolist()) == expected_continuation(len(PROMPT_IDS), 1)


@pytest.mark.parametrize("bad, message", [(0, "max_new_tokens must be an integer >= 1"),
                                          (2.0, "max_new_tokens must be an integer >= 1")])
def test_greedy_decode_bad_token_counts(model, bad, message):
    with pytest.raises(ValueError, match=message):
        greedy_decode(model, PROMPT_IDS, bad)


def test_greedy_decode_refuses_an_empty_prompt(model):
    with pytest.raises(ValueError, match="at least one token"):
        greedy_decode(model, [], 4)


def test_decode_with_graph_needs_the_model_on_cuda(model):
    with pytest.raises(ValueError, match="decode_with_graph: the model is on cpu"):
        hf_cuda.decode_with_graph(model, PROMPT_IDS, 4)


def test_the_talks_plan_leaves_the_matmul_stream_unjoined():
    assert unjoined_forks(SyncPlan.correct()) == []
    assert unjoined_forks(SyncPlan.implicit_join()) == [
        "stream A (the matmul) is never joined back into the capturing stream: missing join_mm"]
    assert unjoined_forks(SyncPlan(post_stream="B").without("join_back")) == [
        "stream A (the matmul) is never joined back into the capturing stream: missing join_back",
        "stream B (the RMS) is never joined back into the capturing stream: missing join_back"]


def test_unjoined_forks_agrees_with_streamcheck_s_capture_model_on_every_plan():
    # Every plan captured on the sim (the device API's pipeline, the same edges in the same order):
    # a plan named unjoined is refused (unjoined, or an isolation error CUDA finds first), and
    # every unjoined refusal is a plan named unjoined.
    from tests.flashnorm_kernels.test_capture_pipeline import PLANS, graph_run

    seen = set()
    for plan in PLANS:
        try:
            graph_run(plan)
            code = None
        except CaptureError as exc:
            code = exc.code
        named = bool(unjoined_forks(plan))
        seen.add((code, named))
        assert (code == "cudaErrorStreamCaptureUnjoined") <= named, plan.describe()
        assert named <= (code is not None), plan.describe()
    assert ("cudaErrorStreamCaptureUnjoined", True) in seen and (None, False) in seen
