"""FlashNorm Prop 3 (pre-norm cancellation): which projections qualify, and the ε error bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

pytest.importorskip("transformers")
import transformers  # noqa: E402

from flashnorm_kernels.cancel import (  # noqa: E402
    FOLLOWING_NORMS,
    NotCancellableError,
    cancellable_projections,
    cancellation_error,
    cancellation_error_bound,
    rms_normalize,
    with_and_without_prescale,
)
from flashnorm_kernels.fold import FlashNormError  # noqa: E402

_TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=128,
    pad_token_id=0,
)


def _config(model_type: str, **overrides):
    kw = {**_TINY, **overrides}
    if model_type == "qwen3":
        return transformers.Qwen3Config(**kw)
    if model_type == "gemma3_text":
        return transformers.Gemma3TextConfig(**kw)
    if model_type == "gemma3n_text":
        return transformers.Gemma3nTextConfig(
            **kw,
            vocab_size_per_layer_input=128,
            hidden_size_per_layer_input=8,
            num_kv_shared_layers=0,
            laurel_rank=4,
            altup_num_inputs=2,
            activation_sparsity_pattern=[0.0, 0.0],
            layer_types=["full_attention", "full_attention"],
        )
    if model_type == "llama":
        return transformers.LlamaConfig(**kw)
    raise AssertionError(model_type)


# ---------------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
def test_qk_norm_models_cancel_q_and_k_but_not_v(model_type):
    plan = cancellable_projections(_config(model_type))
    assert plan.model_type == model_type
    assert plan.skip_prescale == ("q_proj", "k_proj")
    assert plan.keep_prescale == ("v_proj",)
    assert plan.following_norms == (("q_proj", "q_norm"), ("k_proj", "k_norm"))
    assert not plan.full


def test_multimodal_gemma3_is_partial():
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=dict(_TINY), vision_config=vision, mm_tokens_per_image=4)
    plan = cancellable_projections(config)
    assert (plan.skip_prescale, plan.keep_prescale) == (("q_proj", "k_proj"), ("v_proj",))
    # The vision tower's attention has no q_norm; only the language model's layers are checked.
    assert cancellable_projections(transformers.AutoModelForCausalLM.from_config(config)) == plan


def test_gemma3n_with_q_k_v_norms_cancels_fully():
    plan = cancellable_projections(_config("gemma3n_text"))
    assert plan.full
    assert plan.skip_prescale == ("q_proj", "k_proj", "v_proj")
    assert plan.keep_prescale == ()
    assert plan.other_consumers == ("laurel",)


def test_model_without_following_norms_is_refused():
    with pytest.raises(NotCancellableError) as info:
        cancellable_projections(_config("llama"))
    assert isinstance(info.value, ValueError)
    assert "'llama'" in str(info.value)
    for model_type in FOLLOWING_NORMS:
        assert model_type in str(info.value)


def test_biased_projections_are_refused():
    # N(c·Wx + b) ≠ N(Wx + b): the scale no longer factors out.
    with pytest.raises(NotCancellableError, match="attention_bias=True"):
        cancellable_projections(_config("qwen3", attention_bias=True))


def test_plan_from_model_checks_the_norms_exist(monkeypatch):
    torch.manual_seed(0)
    qwen3 = transformers.AutoModelForCausalLM.from_config(_config("qwen3"))
    assert cancellable_projections(qwen3) == cancellable_projections(qwen3.config)
    # A table entry claiming a q_norm that the modules lack must be loud, not trusted.
    monkeypatch.setitem(FOLLOWING_NORMS, "llama", {"q_proj": "q_norm"})
    llama = transformers.AutoModelForCausalLM.from_config(_config("llama"))
    with pytest.raises(FlashNormError, match=r"model\.layers\.0\.self_attn has q_proj but no q_norm"):
        cancellable_projections(llama)


# ------------------------------------------------------------------------- numeric helpers

_DIM, _HEAD = 16, 4


@st.composite
def _chains(draw, eps_strategy):
    """x [tokens, d] over 6 decades of scale (so c = 1/rms(x) is both < 1 and > 1), W [d, d]."""
    tokens = draw(st.integers(1, 4))
    finite = st.floats(-1.0, 1.0, allow_nan=False, allow_infinity=False)
    x = draw(arrays(np.float64, (tokens, _DIM), elements=finite))
    w = draw(arrays(np.float64, (_DIM, _DIM), elements=finite))
    scale = 10.0 ** draw(st.floats(-3, 3))
    return torch.from_numpy(x) * scale, torch.from_numpy(w), draw(eps_strategy), draw(eps_strategy)


def _per_head(t: torch.Tensor) -> torch.Tensor:
    return t.unflatten(-1, (-1, _HEAD))


@settings(max_examples=200, deadline=None)
@given(_chains(st.floats(1e-8, 1.0)))
def test_cancellation_error_with_eps_is_the_formula_and_within_the_bound(chain):
    x, w, pre_eps, post_eps = chain
    exact, cancelled = with_and_without_prescale(x, w, pre_eps=pre_eps, post_eps=post_eps, head_dim=_HEAD)
    y = x @ w.T  # the cancelled path's projection output
    m = _per_head(y).pow(2).mean(-1)  # [tokens, heads]
    c = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + pre_eps)  # [tokens, 1]: the dropped scale
    exact_h, cancelled_h = _per_head(exact), _per_head(cancelled)
    norm = exact_h.norm(dim=-1)
    assume(bool((m > 1e-12).all()) and bool((norm > 1e-6).all()))

    measured = (cancelled_h - exact_h).norm(dim=-1) / norm
    predicted = cancellation_error(m, c, post_eps)
    bound = cancellation_error_bound(m, c, post_eps)
    torch.testing.assert_close(measured, predicted, rtol=1e-6, atol=1e-12)
    assert bool((measured <= bound * (1 + 1e-9) + 1e-12).all()), (measured, bound)
    # Halved bound where c ≤ 1.
    small_c = (c <= 1).expand_as(m)
    assert bool((measured[small_c] <= bound[small_c] / 2 * (1 + 1e-9) + 1e-12).all())


@settings(max_examples=200, deadline=None)
@given(_chains(st.just(0.0)))
def test_cancellation_is_exact_without_eps(chain):
    x, w, _, _ = chain
    y = _per_head(x @ w.T)
    assume(bool((x.abs().amax(-1) > 0).all()) and bool((y.pow(2).mean(-1) > 1e-200).all()))
    exact, cancelled = with_and_without_prescale(x, w, pre_eps=0.0, post_eps=0.0, head_dim=_HEAD)
    torch.testing.assert_close(cancelled, exact, rtol=1e-12, atol=1e-12)
    assert bool((cancellation_error(y.pow(2).mean(-1), torch.tensor(7.0), 0.0) == 0).all())


def test_eps_makes_cancellation_inexact():
    # A test that could not fail would be worthless: with ε > 0 and c ≠ 1 the paths really differ.
    x = torch.linspace(-3, 3, _DIM, dtype=torch.float64)[None] * 10
    w = torch.eye(_DIM, dtype=torch.float64)
    exact, cancelled = with_and_without_prescale(x, w, pre_eps=1e-6, post_eps=0.1, head_dim=_HEAD)
    assert not torch.allclose(exact, cancelled, rtol=1e-6, atol=0)


def test_rms_normalize_groups_by_head():
    y = torch.tensor([[3.0, 4.0, 0.0, 2.0]], dtype=torch.float64)
    out = rms_normalize(y, 0.0, group_size=2)
    torch.testing.assert_close(out, torch.tensor([[3 / math.sqrt(12.5), 4 / math.sqrt(12.5), 0.0, math.sqrt(2.0)]], dtype=torch.float64))


# ---------------------------------------------------------------- on real attention modules


def _tiny_model(model_type, eps):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(model_type, rms_norm_eps=eps))
    model = model.to(torch.float64).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial gains everywhere
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
                module.weight.copy_(torch.empty(module.weight.shape).uniform_(0.5, 1.5, generator=gen))
    return model


def _paths(model, proj, scale):
    """For one attention projection of layer 0 and its following norm (if any), return
    (exact, cancelled, y, c): outputs with and without the pre-norm's 1/RMS scale, the cancelled
    path's projection output before its norm, and the dropped scale c = 1/rms_ε(x)."""
    layer = model.model.layers[0]
    attn, eps, head_dim = layer.self_attn, model.config.rms_norm_eps, model.config.head_dim
    following = dict(cancellable_projections(model).following_norms)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, model.config.hidden_size, generator=gen, dtype=torch.float64) * scale
    c = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    with torch.no_grad():
        normed = layer.input_layernorm(x)  # g ⊙ x · c
        unscaled = normed / c  # g ⊙ x: what the projection reads once the scale is dropped

        def run(h):
            out = getattr(attn, proj)(h).unflatten(-1, (-1, head_dim))
            return (getattr(attn, following[proj])(out) if proj in following else out), out

        exact, _ = run(normed)
        cancelled, y = run(unscaled)
    return exact, cancelled, y, c


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text", "gemma3n_text"])
@pytest.mark.parametrize("scale", [0.05, 20.0])
def test_plan_holds_on_the_real_modules_without_eps(model_type, scale):
    model = _tiny_model(model_type, eps=0.0)
    plan = cancellable_projections(model)
    for proj in plan.skip_prescale:
        exact, cancelled, _, _ = _paths(model, proj, scale)
        # The norms compute in fp32 internally, so "exact" means to fp32 rounding.
        torch.testing.assert_close(cancelled, exact, rtol=1e-5, atol=1e-6)
    for proj in plan.keep_prescale:  # v in QK-norm models: dropping the scale changes v by 1/c
        exact, cancelled, _, _ = _paths(model, proj, scale)
        assert not torch.allclose(cancelled, exact, rtol=1e-3)


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text", "gemma3n_text"])
def test_real_modules_stay_within_the_bound_with_eps(model_type):
    model = _tiny_model(model_type, eps=1e-4)  # ε well above fp32 rounding effects
    eps = model.config.rms_norm_eps
    for proj in cancellable_projections(model).skip_prescale:
        for scale in (0.05, 20.0):  # c > 1 and c < 1
            exact, cancelled, y, c = _paths(model, proj, scale)
            m = y.pow(2).mean(-1)  # [tokens, heads]
            measured = (cancelled - exact).norm(dim=-1) / exact.norm(dim=-1)
            torch.testing.assert_close(measured, cancellation_error(m, c, eps), rtol=1e-3, atol=1e-6)
            assert bool((measured <= cancellation_error_bound(m, c, eps) + 1e-6).all())
            assert measured.max() > 1e-6  # ε really matters here
