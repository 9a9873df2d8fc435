"""FlashNorm Prop 1 (weight folding) on tiny randomly initialised transformers models, fp32."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
import transformers  # noqa: E402

from flashnorm_kernels.fold import (  # noqa: E402
    GAIN_ONE_PLUS_WEIGHT,
    LAYOUTS,
    SUPPORTED_MODEL_TYPES,
    AlreadyFoldedError,
    FlashNormError,
    Layout,
    UnsupportedArchitectureError,
    flashify,
    is_folded,
)

_TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=192,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    # Large weights spread the logits, so greedy decoding has no near-ties that fp rounding could flip.
    initializer_range=0.2,
)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=28, patch_size=14)


def _config(arch: str, **overrides):
    kw = {**_TINY, **overrides}
    if arch == "llama":
        return transformers.LlamaConfig(**kw)
    if arch == "smollm2":  # SmolLM/SmolLM2 checkpoints are model_type llama, tied embeddings
        return transformers.LlamaConfig(**{**kw, "tie_word_embeddings": True})
    if arch == "mistral":
        return transformers.MistralConfig(**kw)
    if arch == "qwen2":  # q/k/v have biases
        return transformers.Qwen2Config(**kw)
    if arch == "qwen3":  # QK-norm
        return transformers.Qwen3Config(**kw, head_dim=8)
    if arch == "smollm3":
        return transformers.SmolLM3Config(**kw)
    if arch == "phi3":  # fused qkv_proj and gate_up_proj
        return transformers.Phi3Config(**kw)
    if arch == "gemma":
        return transformers.GemmaConfig(**kw, head_dim=8)
    if arch == "gemma2":
        return transformers.Gemma2Config(**kw, head_dim=8)
    if arch == "gemma3_text":
        return transformers.Gemma3TextConfig(**kw, head_dim=8)
    if arch == "gemma3":
        text = {k: v for k, v in kw.items() if k not in ("bos_token_id", "eos_token_id")}
        return transformers.Gemma3Config(
            text_config={**text, "head_dim": 8},
            vision_config=_VISION,
            mm_tokens_per_image=4,
            boi_token_index=189,
            eoi_token_index=190,
            image_token_index=191,
        )
    raise AssertionError(arch)


ARCHS = ["llama", "smollm2", "mistral", "qwen2", "qwen3", "smollm3", "phi3", "gemma", "gemma2", "gemma3_text", "gemma3"]
GEMMA_STYLE = {"gemma", "gemma2", "gemma3_text", "gemma3"}


def tiny_model(arch: str, seed: int = 0, dtype=torch.float32, **overrides):
    """A tiny randomly initialised CausalLM with random, non-trivial gains on every RMSNorm."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        _config(arch, **overrides), attn_implementation="eager", dtype=dtype
    )
    gen = torch.Generator().manual_seed(seed + 1)
    lo, hi = (-0.5, 0.5) if arch in GEMMA_STYLE else (0.5, 1.5)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
                module.weight.copy_(torch.empty(module.weight.shape).uniform_(lo, hi, generator=gen))
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * 0.1)
    return model.eval()


def _ids(seed: int = 0, length: int = 12) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 180, (2, length), generator=gen)


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.double()


def _assert_logits_close(actual, expected, rel=1e-5):
    err = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert err <= rel * scale, f"max |Δlogit| = {err:.3g}, max |logit| = {scale:.3g}"


def _greedy(model, ids):
    # min_new_tokens masks EOS, so both runs produce exactly 64 tokens.
    with torch.no_grad():
        return model.generate(ids, do_sample=False, max_new_tokens=64, min_new_tokens=64, pad_token_id=0)


def _norm_weights(model) -> dict[str, torch.Tensor]:
    return {
        name: module.weight.detach().clone()
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_folded_logits_and_greedy_generation_match(arch):
    model = tiny_model(arch)
    ids = _ids()
    before_logits, before_tokens = _logits(model, ids), _greedy(model, ids[:1])
    assert flashify(model) is model
    _assert_logits_close(_logits(model, ids), before_logits)
    tokens = _greedy(model, ids[:1])
    assert tokens.shape[1] == ids.shape[1] + 64
    assert torch.equal(tokens, before_tokens)


@pytest.mark.parametrize("arch", ARCHS)
def test_fold_sets_identity_gains_and_leaves_other_norms_alone(arch):
    model = tiny_model(arch)
    before = _norm_weights(model)
    flashify(model)
    after = _norm_weights(model)
    layout = LAYOUTS[model.config.model_type]
    identity = 0.0 if layout.gain == GAIN_ONE_PLUS_WEIGHT else 1.0
    prefix = layout.decoder
    folded = {f"{prefix}.norm"} | {
        f"{prefix}.layers.{i}.{norm}" for i in range(2) for norm in layout.folds
    }
    assert folded <= after.keys()
    for name in after:
        if name in folded:
            assert torch.all(after[name] == identity), name
        else:  # q_norm/k_norm, Gemma 2/3 post-block norms, the vision tower's norms
            assert torch.equal(after[name], before[name]), name
    assert is_folded(model.config)


def test_fold_scales_projection_columns_by_gain():
    model = tiny_model("qwen2")
    layer = model.model.layers[0]
    g = layer.input_layernorm.weight.detach().clone()
    w, b = layer.self_attn.k_proj.weight.detach().clone(), layer.self_attn.k_proj.bias.detach().clone()
    flashify(model)
    torch.testing.assert_close(layer.self_attn.k_proj.weight, w * g[None, :], rtol=1e-6, atol=0)
    assert torch.equal(layer.self_attn.k_proj.bias, b)  # biases come after the norm's gain


def test_gemma2_post_attention_norm_is_not_folded_into_the_mlp():
    model = tiny_model("gemma2")
    layer = model.model.layers[1]
    post_attn = layer.post_attention_layernorm.weight.detach().clone()
    pre_ff = layer.pre_feedforward_layernorm.weight.detach().clone()
    gate = layer.mlp.gate_proj.weight.detach().clone()
    assert post_attn.abs().min() > 0 and pre_ff.abs().min() > 0  # non-trivial gains to begin with
    flashify(model)
    assert torch.equal(layer.post_attention_layernorm.weight, post_attn)
    assert torch.all(layer.pre_feedforward_layernorm.weight == 0)  # Gemma identity: 1 + 0
    torch.testing.assert_close(layer.mlp.gate_proj.weight, gate * (1 + pre_ff)[None, :], rtol=1e-6, atol=0)


@pytest.mark.parametrize("arch", ["smollm2", "gemma", "gemma3"])
def test_tied_embeddings_are_untied_and_left_unchanged(arch):
    model = tiny_model(arch)
    embed = model.get_input_embeddings().weight
    assert model.lm_head.weight is embed
    assert model.config.tie_word_embeddings
    embed_before = embed.detach().clone()
    ids = _ids()
    before = _logits(model, ids)

    flashify(model)

    assert torch.equal(model.get_input_embeddings().weight, embed_before)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert not model.config.tie_word_embeddings
    assert not model.config.get_text_config().tie_word_embeddings
    assert model.config.flashnorm["untied_lm_head"] is True
    _assert_logits_close(_logits(model, ids), before)
    # tie_weights() must not re-tie the folded head to the embeddings.
    model.tie_weights()
    assert not torch.equal(model.lm_head.weight, embed_before)


def test_untied_model_records_no_untie():
    model = tiny_model("llama")
    flashify(model)
    assert model.config.flashnorm == {
        "folded": True,
        "version": 1,
        "gain": "weight",
        "identity_weight": 1.0,
        "untied_lm_head": False,
    }


def test_bf16_model_keeps_its_dtype_and_stays_close():
    model = tiny_model("llama", dtype=torch.bfloat16)
    ids = _ids()
    before = _logits(model, ids)
    flashify(model)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    after = _logits(model, ids)
    # bf16 has 8 mantissa bits: folding changes where the rounding happens, not the result.
    assert (after - before).abs().max() <= 0.05 * before.abs().max()


def test_folding_twice_is_refused_and_changes_nothing():
    model = tiny_model("llama")
    flashify(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(AlreadyFoldedError, match="already folded"):
        flashify(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_unsupported_architecture_lists_supported_types():
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedArchitectureError) as info:
        flashify(model)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "'gpt2'" in message
    for model_type in SUPPORTED_MODEL_TYPES:
        assert model_type in message
    assert not is_folded(model.config)


def test_wrong_gain_style_is_detected_before_any_weight_changes(monkeypatch):
    # If a layout claimed Gemma's (1 + w) for a Llama norm, folding would silently corrupt the model.
    monkeypatch.setitem(LAYOUTS, "llama", Layout(LAYOUTS["llama"].folds, GAIN_ONE_PLUS_WEIGHT))
    model = tiny_model("llama")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(FlashNormError, match=r"does not compute \(1 \+ w\)"):
        flashify(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not is_folded(model.config)


def test_layout_pointing_at_a_missing_module_names_it(monkeypatch):
    folds = {"input_layernorm": ("self_attn.qkv_proj",)}
    monkeypatch.setitem(LAYOUTS, "llama", Layout(folds, "weight"))
    model = tiny_model("llama")
    with pytest.raises(FlashNormError, match=r"model\.layers\.0\.self_attn\.qkv_proj"):
        flashify(model)


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_round_trip_matches_logits(arch, tmp_path):
    from flashnorm_kernels.checkpoint import flashify_checkpoint

    model = tiny_model(arch)
    ids = _ids()
    before = _logits(model, ids)
    model.save_pretrained(tmp_path / "src")
    flashify_checkpoint(tmp_path / "src", tmp_path / "dst")
    folded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dst", attn_implementation="eager").eval()
    assert type(folded) is type(model)
    assert is_folded(folded.config)
    _assert_logits_close(_logits(folded, ids), before)
    with pytest.raises(AlreadyFoldedError):
        flashify(folded)  # the marker survives save/load


def test_a_head_that_shares_the_embeddings_storage_is_untied_too():
    # Tied by storage, not by object: a checkpoint loader (or a user) can give lm_head its own
    # Parameter over the embeddings' memory. Folding into it would change the embeddings.
    model = tiny_model("llama")
    embed = model.get_input_embeddings().weight
    model.lm_head.weight = torch.nn.Parameter(embed.detach())  # another tensor, the same storage
    assert model.lm_head.weight is not embed
    embed_before = embed.detach().clone()
    ids = _ids()
    before = _logits(model, ids)
    flashify(model)
    assert torch.equal(model.get_input_embeddings().weight, embed_before)
    assert model.config.flashnorm["untied_lm_head"] is True
    _assert_logits_close(_logits(model, ids), before)


def test_a_bf16_gain_is_folded_in_fp32_then_rounded_once():
    # Gemma's gain is 1 + w: in bf16, 1 + w is rounded before the product, a second rounding.
    model = tiny_model("gemma", dtype=torch.bfloat16)
    layer = model.model.layers[0]
    w = layer.mlp.gate_proj.weight.detach().clone()
    g = layer.post_attention_layernorm.weight.detach().clone()
    flashify(model)
    assert torch.equal(layer.mlp.gate_proj.weight, (w.float() * (1 + g.float())[None, :]).to(torch.bfloat16))


def test_a_marker_that_says_not_folded_is_not_folded():
    assert is_folded({"flashnorm": {"folded": True, "version": 1}})
    assert not is_folded({"flashnorm": {"folded": False, "version": 1}})
    assert not is_folded({"flashnorm": {}})
    assert not is_folded({"model_type": "llama"})
