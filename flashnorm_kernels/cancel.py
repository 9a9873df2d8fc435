"""FlashNorm Prop 3: drop a pre-norm's 1/RMS scale where a later norm makes it redundant.

A pre-norm feeds a projection ``y = W* x / rms(x)`` (gain already folded into ``W*``, Prop 1). If
``y`` is itself RMS-normalised right after (Qwen3 / Gemma 3 q_norm and k_norm, Gemma 3n also
v_norm), the per-token scalar ``c = 1/rms(x)`` is normalised away: ``N(c·y) = N(y)`` for ε = 0,
so the projection can read the unscaled ``x``. With ε > 0 the two differ by a bounded relative
error (docs/flashnorm.md, "Prop 3"): see :func:`cancellation_error` and
:func:`cancellation_error_bound`. A bias breaks the argument (``N(c·Wx + b) ≠ N(Wx + b)``), so
biased projections never qualify.

Everything here is a pure function of configs, modules or tensors; nothing modifies a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fold import FlashNormError

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")

# model_type -> {projection: the norm (attribute of self_attn) that re-normalises its output}.
# Read from transformers' modeling files: the norm acts on the projection output per head, before
# RoPE, and nothing else reads the projection output.
FOLLOWING_NORMS: dict[str, dict[str, str]] = {
    "qwen3": {"q_proj": "q_norm", "k_proj": "k_norm"},
    "gemma3_text": {"q_proj": "q_norm", "k_proj": "k_norm"},
    "gemma3": {"q_proj": "q_norm", "k_proj": "k_norm"},
    "gemma3n_text": {"q_proj": "q_norm", "k_proj": "k_norm", "v_proj": "v_norm"},
}

# Things besides q/k/v that read the same pre-norm output and so still need its 1/RMS scale.
_OTHER_CONSUMERS: dict[str, tuple[str, ...]] = {
    "gemma3n_text": ("laurel",),  # the LAuReL block adds the normed input back into the residual
}


# Path from the CausalLM to the module holding the decoder `layers`, where not "model".
_DECODERS = {"gemma3": "model.language_model"}


class NotCancellableError(FlashNormError):
    """No attention projection of this model may skip the pre-norm's 1/RMS scale."""


@dataclass(frozen=True)
class CancellationPlan:
    """Which attention projections fed by ``input_layernorm`` may skip its 1/RMS scale.

    ``skip_prescale``: their output is re-normalised (``following_norms``), so they may read the
    unscaled input. ``keep_prescale``: still need the scaled input. ``other_consumers``: non
    q/k/v modules reading the same norm output (they keep the scale, so the RMS is still computed).
    """

    model_type: str
    skip_prescale: tuple[str, ...]
    keep_prescale: tuple[str, ...]
    following_norms: tuple[tuple[str, str], ...]
    other_consumers: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        """True when q, k and v all skip the scale (each has a following norm)."""
        return not self.keep_prescale


def cancellable_projections(config_or_model) -> CancellationPlan:
    """Return the Prop 3 plan of a transformers config or model, or raise NotCancellableError.

    Full cancellation when q, k and v each have a following norm (gemma3n_text); partial for
    QK-norm models (qwen3, gemma3_text, gemma3): q and k skip the scale, v keeps it. Refused for
    models without following norms and for biased attention projections. Given a model, the
    attention modules are checked to really have the norms the table claims.
    """
    config = getattr(config_or_model, "config", config_or_model)
    model_type = getattr(config, "model_type", None)
    following = FOLLOWING_NORMS.get(model_type)
    if following is None:
        raise NotCancellableError(
            f"cancellable_projections: model_type {model_type!r} has no norm after its q/k/v projections, "
            "so the input norm's 1/RMS scale cannot be dropped (Prop 3 needs a later RMSNorm). Models with "
            f"following norms: {', '.join(sorted(FOLLOWING_NORMS))}. Use Prop 2 (deferred scaling) instead."
        )
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text_config, "attention_bias", False):
        raise NotCancellableError(
            f"cancellable_projections: this {model_type} config has attention_bias=True; a bias is added "
            "after the scale (N(c·Wx + b) ≠ N(Wx + b)), so no projection may skip it. Use Prop 2 instead."
        )
    if config_or_model is not config:
        _check_model_has_norms(config_or_model, model_type, following)
    return CancellationPlan(
        model_type=model_type,
        skip_prescale=tuple(p for p in ATTENTION_PROJECTIONS if p in following),
        keep_prescale=tuple(p for p in ATTENTION_PROJECTIONS if p not in following),
        following_norms=tuple((p, following[p]) for p in ATTENTION_PROJECTIONS if p in following),
        other_consumers=_OTHER_CONSUMERS.get(model_type, ()),
    )


def _check_model_has_norms(model, model_type, following) -> None:
    # Only the language model's decoder layers: a multimodal model's vision tower also has
    # `self_attn` modules with q/k/v projections (and no norms after them).
    path = _DECODERS.get(model_type, "model")
    decoder = model
    for part in path.split("."):
        decoder = getattr(decoder, part, None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise FlashNormError(f"cancellable_projections: found no '{path}.layers' in this {model_type} model.")
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        for proj, norm in following.items():
            # Gemma 3n kv-shared layers have no k/v projection at all: nothing to check there.
            if hasattr(attn, proj) and not hasattr(attn, norm):
                raise FlashNormError(
                    f"cancellable_projections: {path}.layers.{i}.self_attn has {proj} but no {norm}; the "
                    f"table FOLLOWING_NORMS[{model_type!r}] does not match this transformers version."
                )


def rms_normalize(y: torch.Tensor, eps: float, group_size: int | None = None) -> torch.Tensor:
    """``y / sqrt(mean(y²) + eps)`` over the last dim, or over consecutive groups of ``group_size``
    (one group per attention head, as q_norm/k_norm do). No gain: gains are folded or applied after,
    and an elementwise gain after the norm does not change relative errors per element."""
    if group_size is not None:
        y = y.unflatten(-1, (-1, group_size))
    out = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return out.flatten(-2) if group_size is not None else out


def with_and_without_prescale(
    x: torch.Tensor, weight: torch.Tensor, *, pre_eps: float, post_eps: float, head_dim: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(exact, cancelled)`` for a pre-norm → projection → following-norm chain.

    ``exact = N_post(W · N_pre(x))`` (what the model computes), ``cancelled = N_post(W · x)``
    (the pre-norm's 1/RMS dropped). ``weight`` is the folded ``[out, in]`` projection weight.
    Equal to rounding when ``post_eps == 0``; otherwise within :func:`cancellation_error_bound`.
    """
    exact = rms_normalize(rms_normalize(x, pre_eps) @ weight.T, post_eps, head_dim)
    cancelled = rms_normalize(x @ weight.T, post_eps, head_dim)
    return exact, cancelled


def cancellation_error(m: torch.Tensor, c: torch.Tensor, eps: float) -> torch.Tensor:
    """Exact relative error ``‖N(y) − N(c·y)‖ / ‖N(c·y)‖`` of cancellation, for ``y`` with mean
    square ``m`` (the unscaled projection output, per head) and pre-norm scale ``c = 1/rms_ε(x)``:
    ``|sqrt((m + ε/c²) / (m + ε)) − 1|``. Both sides are multiples of ``y``, so this holds
    elementwise too."""
    return ((m + eps / c**2) / (m + eps)).sqrt().sub(1).abs()


def cancellation_error_bound(m: torch.Tensor, c: torch.Tensor, eps: float) -> torch.Tensor:
    """Upper bound ``ε·|1/c² − 1| / (m + ε)`` on :func:`cancellation_error`; zero for ε = 0 or c = 1.
    When c ≤ 1 (rms(x) ≥ 1, usual for a residual stream) the error is at most half of it
    (derivation in docs/flashnorm.md)."""
    return eps * (1 / c**2 - 1).abs() / (m + eps)
