"""FlashNorm Prop 1: fold every RMSNorm gain into the projections the norm feeds.

For a norm ``y = g ⊙ x / rms(x)`` feeding a linear layer ``z = W y + b`` (HF ``Linear.weight`` is
``[out, in]``), ``z = (W · diag(g)) x / rms(x) + b``: the gain moves into the weight as
``W* = W · g[None, :]`` and the norm keeps only its normalisation (identity gain). The folded model
is a plain transformers model of the same class; it loads and runs without this package.

Only norms whose output goes straight into linear layers are folded. Norms that act on a block's
*output* (Gemma 2/3 ``post_attention_layernorm`` / ``post_feedforward_layernorm``) or on q/k after
the projection (Qwen3 / Gemma 3 ``q_norm`` / ``k_norm``, followed by RoPE) are left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FOLD_VERSION = 1

# How a norm applies its gain (read from transformers' modeling_*.py):
# Llama/Mistral/Qwen/Phi3/SmolLM3: `weight * h.to(input_dtype)`        -> g = w,     identity w = 1
# Gemma 1/2/3: `h.float() * (1.0 + weight.float())`, then cast back     -> g = 1 + w, identity w = 0
GAIN_WEIGHT = "weight"
GAIN_ONE_PLUS_WEIGHT = "one_plus_weight"
_IDENTITY = {GAIN_WEIGHT: 1.0, GAIN_ONE_PLUS_WEIGHT: 0.0}


class FlashNormError(ValueError):
    """Base class of flashnorm_kernels' user-facing errors."""


class UnsupportedArchitectureError(FlashNormError):
    """The model type is not in ``LAYOUTS``; we do not guess where its norms feed."""


class AlreadyFoldedError(FlashNormError):
    """The model or checkpoint is marked as folded; folding it again is refused."""


@dataclass(frozen=True)
class Layout:
    """Where one architecture's norms feed.

    ``folds`` maps a decoder-layer norm attribute to the projection paths (relative to the layer)
    that consume its output. ``decoder`` is the path from the CausalLM to the module holding
    ``layers``, ``norm`` (the final norm, folded into ``lm_head``) and ``embed_tokens``.
    """

    folds: dict[str, tuple[str, ...]]
    gain: str
    decoder: str = "model"


_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
_GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
_LLAMA = {"input_layernorm": _QKV, "post_attention_layernorm": _GATE_UP}
# Gemma 2/3 normalise the attention output with `post_attention_layernorm` (before the residual add);
# the MLP's input norm is `pre_feedforward_layernorm`. Folding post_attention_layernorm into
# gate/up would be wrong.
_GEMMA2 = {"input_layernorm": _QKV, "pre_feedforward_layernorm": _GATE_UP}

LAYOUTS: dict[str, Layout] = {
    "llama": Layout(_LLAMA, GAIN_WEIGHT),  # also SmolLM / SmolLM2 checkpoints
    "mistral": Layout(_LLAMA, GAIN_WEIGHT),
    "qwen2": Layout(_LLAMA, GAIN_WEIGHT),  # q/k/v biases are unaffected: W·(g⊙x) + b = W*·x + b
    "qwen3": Layout(_LLAMA, GAIN_WEIGHT),
    "smollm3": Layout(_LLAMA, GAIN_WEIGHT),
    "phi3": Layout(
        {"input_layernorm": ("self_attn.qkv_proj",), "post_attention_layernorm": ("mlp.gate_up_proj",)},
        GAIN_WEIGHT,
    ),
    "gemma": Layout(_LLAMA, GAIN_ONE_PLUS_WEIGHT),
    "gemma2": Layout(_GEMMA2, GAIN_ONE_PLUS_WEIGHT),
    "gemma3_text": Layout(_GEMMA2, GAIN_ONE_PLUS_WEIGHT),
    # Multimodal Gemma 3: only the language model is folded; the vision tower (LayerNorm) and the
    # multimodal projector are left alone.
    "gemma3": Layout(_GEMMA2, GAIN_ONE_PLUS_WEIGHT, decoder="model.language_model"),
}
SUPPORTED_MODEL_TYPES = tuple(sorted(LAYOUTS))


def layout_for(model_type: str) -> Layout:
    """Return the fold layout of ``model_type`` or raise UnsupportedArchitectureError."""
    try:
        return LAYOUTS[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"flashify: model_type {model_type!r} is not supported. Supported model types: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}. Add a Layout to flashnorm_kernels.fold.LAYOUTS after "
            "checking in transformers' modeling file which norm feeds which projection."
        ) from None


def is_folded(config) -> bool:
    """True if ``config`` (a PretrainedConfig or a config.json dict) carries our folded marker."""
    marker = config.get("flashnorm") if isinstance(config, dict) else getattr(config, "flashnorm", None)
    return isinstance(marker, dict) and bool(marker.get("folded"))


def flashify(model):
    """Fold every RMSNorm gain of a transformers CausalLM into the projections it feeds, in place.

    input norm -> q/k/v (or fused qkv_proj), pre-MLP norm -> gate/up (or fused gate_up_proj),
    final norm -> lm_head. Each folded norm is left with an identity gain (1, or 0 for Gemma's
    ``1 + w``). The fold is computed in fp32 (fp64 for fp64 weights) and cast back to each
    weight's dtype, so the result matches the original to rounding, not bit for bit.

    Tied embeddings: if ``lm_head`` shares its weight with the input embeddings, the head is
    untied first — it gets its own folded copy and ``config.tie_word_embeddings`` becomes False —
    so the embeddings stay unchanged and the folded model stays exact. This costs one extra
    ``vocab × hidden`` matrix.

    The config is marked (``config.flashnorm = {"folded": True, ...}``); a marked model is refused
    with AlreadyFoldedError. Unsupported architectures raise UnsupportedArchitectureError.
    Everything is validated before the first weight changes. Returns ``model``.
    """
    config = model.config
    model_type = getattr(config, "model_type", None)
    layout = layout_for(model_type)
    if is_folded(config):
        raise AlreadyFoldedError(
            f"flashify: this {model_type} model is already folded (config.flashnorm={config.flashnorm!r}); "
            "folding twice is refused. Use the model as it is."
        )

    folds = []  # (name, norm, [(name, linear)]) — collected and checked before any weight changes
    for norm_path, proj_paths in norm_groups(model):
        norm = _submodule(model, norm_path, model_type)
        folds.append((norm_path, norm, [(p, _submodule(model, p, model_type)) for p in proj_paths]))
    for norm_name, norm, projs in folds:
        _check_fold(norm_name, norm, projs, layout.gain, model_type)

    untied = _untie_lm_head(model)
    with torch.no_grad():
        for _, norm, projs in folds:
            gain = norm_gain(norm, layout.gain)
            for _, linear in projs:
                _scale_columns(linear.weight, gain)
            norm.weight.fill_(_IDENTITY[layout.gain])

    config.flashnorm = {
        "folded": True,
        "version": FOLD_VERSION,
        "gain": layout.gain,
        "identity_weight": _IDENTITY[layout.gain],
        "untied_lm_head": untied,
    }
    return model


def norm_groups(model) -> list:
    """[(norm path, [paths of the projections it feeds])] for every foldable norm of a CausalLM, in layer
    order, the final norm (→ lm_head) last. The one place that walks LAYOUTS over a model."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    layout = layout_for(model_type)
    decoder = _submodule(model, layout.decoder, model_type)
    groups = []
    for i, _ in enumerate(_attr(decoder, "layers", layout.decoder, model_type)):
        prefix = f"{layout.decoder}.layers.{i}"
        for norm_name, proj_names in layout.folds.items():
            groups.append((f"{prefix}.{norm_name}", [f"{prefix}.{p}" for p in proj_names]))
    groups.append((f"{layout.decoder}.norm", ["lm_head"]))
    return groups


def norm_gain(norm, gain_style: str) -> torch.Tensor:
    w = norm.weight.detach()
    cdt = torch.promote_types(w.dtype, torch.float32)
    return w.to(cdt) + 1.0 if gain_style == GAIN_ONE_PLUS_WEIGHT else w.to(cdt)


def _scale_columns(weight: torch.Tensor, gain: torch.Tensor) -> None:
    # W* = W · g[None, :]. Row blocks bound the fp32 temporary (an lm_head can be vocab × hidden).
    cdt = torch.promote_types(weight.dtype, gain.dtype)
    for rows in weight.detach().split(8192):
        rows.copy_((rows.to(cdt) * gain.to(cdt)[None, :]).to(weight.dtype))


def _untie_lm_head(model) -> bool:
    """Give lm_head its own weight if it shares storage with the input embeddings."""
    head = model.lm_head.weight
    embed = model.get_input_embeddings().weight
    shared = head is embed or head.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()
    if shared:
        model.lm_head.weight = torch.nn.Parameter(head.detach().clone(), requires_grad=head.requires_grad)
    # Even if the weights were separate, a config that says "tie" would re-tie them on reload
    # (lm_head := embeddings), silently dropping the folded final-norm gain.
    configs = {id(model.config): model.config}
    text_config = model.config.get_text_config()
    configs[id(text_config)] = text_config
    for config in configs.values():
        if getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False
    if hasattr(model, "get_expanded_tied_weights_keys"):
        # transformers caches the tie mapping at init; save_pretrained and tie_weights read it.
        model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)
    return shared


def _check_fold(norm_name, norm, projs, gain_style, model_type) -> None:
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise FlashNormError(
            f"flashify: {norm_name} ({type(norm).__name__}) of this {model_type} model has no 1-D gain "
            "'weight'; the transformers layout differs from flashnorm_kernels.fold.LAYOUTS. Refusing to fold."
        )
    for proj_name, linear in projs:
        if not isinstance(linear, torch.nn.Linear) or linear.in_features != weight.numel():
            raise FlashNormError(
                f"flashify: {proj_name} is not a Linear with in_features={weight.numel()} (got "
                f"{type(linear).__name__}); it cannot take the gain of {norm_name}. Refusing to fold."
            )
    _check_gain_style(norm_name, norm, gain_style, model_type)


def _check_gain_style(norm_name, norm, gain_style, model_type) -> None:
    # Run the norm once and compare with g ⊙ x / rms(x) for the gain style we believe in. Getting
    # w vs 1 + w wrong is the classic silent folding bug; make it loud instead. Inputs have
    # rms ≈ 1, so the norm's ε (≤ 1e-5 in practice) is far below the tolerance.
    weight = norm.weight.detach()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, weight.numel(), generator=gen, dtype=torch.float64)
    with torch.no_grad():
        actual = norm(x.to(device=weight.device, dtype=weight.dtype)).to(torch.float64).cpu()
    xd = x.to(weight.dtype).to(torch.float64)
    expected = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True)) * norm_gain(norm, gain_style).to(torch.float64).cpu()
    tol = 1e-3 if weight.dtype in (torch.float32, torch.float64) else 3e-2
    scale = max(expected.abs().max().item(), 1e-6)
    if not torch.allclose(actual, expected, rtol=tol, atol=tol * scale):
        formula = "(1 + w)" if gain_style == GAIN_ONE_PLUS_WEIGHT else "w"
        raise FlashNormError(
            f"flashify: {norm_name} ({type(norm).__name__}) does not compute {formula} ⊙ x / rms(x) as "
            f"LAYOUTS[{model_type!r}] says; transformers' implementation may have changed. Refusing to fold."
        )


def _attr(obj, name, where, model_type):
    try:
        return getattr(obj, name)
    except AttributeError:
        path = f"{where}.{name}" if where else name
        raise FlashNormError(
            f"flashify: expected module {path!r} in this {model_type} model ({type(obj).__name__} has no "
            f"attribute {name!r}); the transformers layout differs from flashnorm_kernels.fold.LAYOUTS."
        ) from None


def _submodule(root, path, model_type, where=""):
    obj = root
    for part in path.split("."):
        obj = _attr(obj, part, where, model_type)
        where = f"{where}.{part}" if where else part
    return obj
