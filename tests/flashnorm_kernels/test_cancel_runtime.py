"""FlashNorm Prop 3 applied at runtime: `attach(model, device, cancel=True)` runs q_proj and
k_proj of a QK-norm model without the input norm's 1/RMS scale (q_norm / k_norm re-normalise
them), on the simulated dual-stream pipeline."""
from __future__ import annotations

import pytest
import torch

from flashnorm_kernels.cancel import NotCancellableError, cancellation_error_bound
from flashnorm_kernels.hf import _Identity, attach
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, encode, expected_continuation, load_fixture_model
from streamcheck.core.trace import Launch
from streamcheck.device import Device

PROMPT_IDS = encode(PROMPT)


@pytest.fixture(scope="module")
def qwen3():
    return load_fixture_model("tiny_qwen3_zen")


@pytest.fixture(autouse=True)
def _one_thread():
    # A 96-wide model decoded token by token is all tiny ops: more threads only add overhead.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _generate(model, new_tokens):
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, use_cache=True,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[0, len(PROMPT_IDS):].tolist()


class _Capture:
    """Forward hooks on each layer's input norm (its input x), q/k/v projections and q/k norms
    (their outputs)."""

    def __init__(self, model):
        self.values, self._hooks = {}, []
        for i, layer in enumerate(model.model.layers):
            self._hooks.append(layer.input_layernorm.register_forward_pre_hook(
                lambda mod, args, i=i: self.values.__setitem__(("x", i), args[0].detach().clone())))
            for name in ("q_proj", "k_proj", "v_proj", "q_norm", "k_norm"):
                self._hooks.append(getattr(layer.self_attn, name).register_forward_hook(
                    lambda mod, args, out, i=i, name=name: self.values.__setitem__((name, i), out.detach().clone())))

    def remove(self):
        for hook in self._hooks:
            hook.remove()


def _forward(model, device=None, cancel=False):
    """Prefill logits of the prompt, plus the captured x and q/k/v outputs of every layer."""
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        if device is None:
            capture = _Capture(model)
            try:
                return model(ids).logits, capture.values
            finally:
                capture.remove()
        with attach(model, device, SyncPlan.correct(), max_tokens=len(PROMPT_IDS), cancel=cancel) as attachment:
            capture = _Capture(model)  # on the routed modules (the norms are identities now)
            try:
                logits = model(ids).logits
            finally:
                capture.remove()
        return logits, capture.values, attachment


def test_cancel_attaches_q_and_k_unscaled_and_detach_restores_the_model(qwen3):
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        before = qwen3(ids).logits
    dev = Device("sim")
    logits, _, attachment = _forward(qwen3, dev, cancel=True)
    assert attachment.cancellation.skip_prescale == ("q_proj", "k_proj")
    by_name = {group.name: group.module for group in attachment.groups}
    assert by_name["layers.0.input_layernorm"].unscaled == (0, 1)  # q, k of [q, k, v]
    assert by_name["layers.1.input_layernorm"].unscaled == (0, 1)
    assert by_name["layers.0.post_attention_layernorm"].unscaled == ()
    assert by_name["norm"].unscaled == ()
    assert all(module.computes_rms for module in by_name.values())  # v still needs 1/RMS
    assert dev.races == []
    with torch.no_grad():
        after = qwen3(ids).logits
    assert torch.equal(before, after)
    assert not any(isinstance(m, _Identity) for m in qwen3.modules())


def test_cancelled_q_and_k_are_the_unscaled_projections_and_v_is_unchanged(qwen3):
    # So the other tests cannot pass with a cancellation that silently does nothing.
    _, plain, _ = _forward(qwen3, Device("sim"))
    _, cancelled, _ = _forward(qwen3, Device("sim"), cancel=True)
    x = plain[("x", 0)]
    torch.testing.assert_close(cancelled[("x", 0)], x, rtol=0, atol=0)  # layer 0 sees the same input
    eps = qwen3.config.rms_norm_eps
    c = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)  # the dropped scale
    assert float(c.min()) > 2  # the prompt's embeddings are small: c is far from 1 here
    for name in ("q_proj", "k_proj"):
        got, scaled = cancelled[(name, 0)], plain[(name, 0)]
        assert (got - scaled).abs().max() > 0.5 * scaled.abs().max()
        # W*·x, the same Y the scaled run multiplies by c: got·c equals it to fp32 rounding.
        torch.testing.assert_close(got.double() * c, scaled.double(), rtol=1e-5, atol=1e-6)
    assert torch.equal(cancelled[("v_proj", 0)], plain[("v_proj", 0)])  # same Y, same r, same kernel


def test_cancelled_q_k_norms_and_logits_stay_within_the_eps_bound(qwen3):
    plain, plain_values = _forward(qwen3)
    routed, _, _ = _forward(qwen3, Device("sim"))
    logits, values, _ = _forward(qwen3, Device("sim"), cancel=True)
    config = qwen3.config
    eps, head_dim = config.rms_norm_eps, config.head_dim
    # cancel.py's bound for every (layer, token, head) of q and k in the cancelled run: dropping
    # the scale multiplies each q_norm / k_norm output head by a factor k with |k - 1| <= bound.
    bounds = {}
    for i in range(config.num_hidden_layers):
        x = values[("x", i)].double()
        c = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        for name in ("q", "k"):
            y = values[(f"{name}_proj", i)].double().unflatten(-1, (-1, head_dim))  # W*·x per head
            bounds[(name, i)] = cancellation_error_bound(y.pow(2).mean(-1), c, eps)
    # Layer 0 sees the same input in both runs, so there the bound applies exactly, per head.
    for name in ("q", "k"):
        got, want = values[(f"{name}_norm", 0)].double(), plain_values[(f"{name}_norm", 0)].double()
        measured = (got - want).norm(dim=-1) / want.norm(dim=-1)
        assert bool((measured <= bounds[(name, 0)] + 1e-5).all())  # + fp32 rounding of the norms
        assert measured.max() > 1e-3  # and ε visibly matters
    e = max(float(b.max()) for b in bounds.values())
    assert 1e-4 < e < 0.05, e  # ε = 1e-5 over small q/k mean squares (c is far from 1 here)
    # Logits: every attention score q·k is scaled by k_q·k_k, within (1 ± e)², a relative change
    # of at most 2e + e²; nothing else in the model changes. We give the logits that relative
    # budget against the largest logit, plus the pipeline's fp32 rounding. A first-order budget,
    # not a proof (softmax and the layers above may amplify it); measured it holds ~9x over.
    scale = plain.abs().max()
    rounding = (routed - plain).abs().max()
    diff = (logits - plain).abs().max()
    assert diff <= (2 * e + e * e) * scale + 2 * rounding, (diff, e, scale)
    assert diff > 10 * rounding  # the ε effect, not rounding: the test could fail


def test_cancelled_pipeline_equals_prop3_computed_in_torch(qwen3):
    # The same model with q/k fed W·(g ⊙ x) in plain torch (no pipeline): equal to fp32 rounding,
    # so the pipeline applies exactly Prop 3 and nothing else.
    logits, _, _ = _forward(qwen3, Device("sim", policy="random", seed=4), cancel=True)
    originals, hooks = [], []

    class Unscaled(torch.nn.Module):
        def __init__(self, linear, norm, captured):
            super().__init__()
            self.linear, self.norm, self.captured = linear, norm, captured

        def forward(self, normed):
            return self.linear(self.norm.weight * self.captured["x"])

    for layer in qwen3.model.layers:
        captured = {}
        hooks.append(layer.input_layernorm.register_forward_pre_hook(
            lambda mod, args, captured=captured: captured.__setitem__("x", args[0])))
        for name in ("q_proj", "k_proj"):
            linear = getattr(layer.self_attn, name)
            originals.append((layer.self_attn, name, linear))
            setattr(layer.self_attn, name, Unscaled(linear, layer.input_layernorm, captured))
    try:
        with torch.no_grad():
            want = qwen3(torch.tensor([PROMPT_IDS])).logits
    finally:
        for owner, name, linear in originals:
            setattr(owner, name, linear)
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)


def test_cancelled_greedy_generation_equals_the_plain_models(qwen3):
    want = _generate(qwen3, 64)
    assert bytes(want) == expected_continuation(len(PROMPT_IDS), 64)
    dev = Device("sim", policy="random", seed=7)
    with attach(qwen3, dev, max_tokens=len(PROMPT_IDS), cancel=True):
        got = _generate(qwen3, 64)
    assert got == want
    assert dev.races == [], dev.report()
    steps = [op for op in dev.trace if isinstance(op, Launch) and op.name == "matmul"]
    assert len(steps) == 64 * 5  # prefill + 63 decode steps, 5 groups each: really ran on the pipeline


def test_full_cancellation_hf_group_launches_no_rms(monkeypatch, qwen3):
    # Qwen3 cancels q and k only; if v also had a following norm (Gemma 3n), the input norm's
    # group would need no RMS at all. Pretend so through the table cancel.py reads.
    from flashnorm_kernels import cancel

    monkeypatch.setitem(cancel.FOLLOWING_NORMS, "qwen3", {"q_proj": "q_norm", "k_proj": "k_norm",
                                                          "v_proj": "q_norm"})
    dev = Device("sim")
    with attach(qwen3, dev, max_tokens=len(PROMPT_IDS), cancel=True) as attachment:
        with torch.no_grad():
            qwen3(torch.tensor([PROMPT_IDS[:5]]))
    by_name = {group.name: group.module for group in attachment.groups}
    input_norm = by_name["layers.0.input_layernorm"]
    assert input_norm.unscaled == (0, 1, 2) and not input_norm.computes_rms
    rms_streams = {op.stream for op in dev.trace if isinstance(op, Launch) and op.name == "rms"}
    assert input_norm.stream_b.id not in rms_streams
    assert by_name["layers.0.post_attention_layernorm"].stream_b.id in rms_streams


def test_llama_with_cancel_is_refused_before_anything_is_attached():
    model = load_fixture_model("tiny_llama_zen")
    modules = dict(model.named_modules())
    with pytest.raises(NotCancellableError, match="'llama' has no norm after its q/k/v projections"):
        attach(model, Device("sim"), cancel=True)
    assert dict(model.named_modules()) == modules
    with pytest.raises(ValueError, match="cancel must be True or False"):
        attach(model, Device("sim"), cancel="yes")


def test_check_generation_with_cancellation_still_catches_the_talks_bug(qwen3):
    # Both runs cancel q and k; the talk's plan under delay must still diverge and be reported.
    from flashnorm_kernels.generation import check_generation
    from flashnorm_kernels.plan import SyncPlan

    check = check_generation(qwen3, PROMPT_IDS, 48, SyncPlan.implicit_join(), policy="delay",
                             kernels=("matmul",), steps=40, cancel=True)
    for run in (check.reference, check.candidate):
        assert any(op.name.endswith(".ones") for op in run.device.trace if type(op).__name__ == "Alloc")
    assert check.reference.tokens != check.candidate.tokens
    assert ("RAW", "matmul", "postscale") in {(r.kind, r.first.name, r.second.name) for r in check.candidate.races}
