"""FlashNorm kernels: weight folding, dual-stream deferred normalization, pre-norm cancellation.

Public names are loaded on first use, so `import flashnorm_kernels.plan` (no torch)
stays cheap for tools that only need sync plans.
"""
import importlib

_EXPORTS = {
    "flashify": "fold", "FlashNormError": "fold", "AlreadyFoldedError": "fold",
    "UnsupportedArchitectureError": "fold",
    "flashify_checkpoint": "checkpoint", "CheckpointPathError": "checkpoint",
    "CheckpointLoadError": "checkpoint", "CheckpointWriteError": "checkpoint",
    "cancellable_projections": "cancel", "NotCancellableError": "cancel",
    "DeferredNormProjection": "pipeline", "Storage": "pipeline", "normalize_dtype": "pipeline",
    "reference_norm_proj": "pipeline", "storage_for": "pipeline",
    "SyncPlan": "plan",
    "attach": "hf",
}
__all__ = sorted(_EXPORTS)


TRANSFORMERS = "transformers>=5.0,<6"  # as pyproject.toml's `hf` extra names it


def transformers_missing() -> str:
    """Why the parts that load Hugging Face models cannot run here ("" when they can): one line
    saying what to install, for the commands to print instead of an ImportError's traceback."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return (f"transformers is not installed here: pip install '{TRANSFORMERS}' (streamcheck's `hf` extra: "
                "pip install 'streamcheck[hf]', or pip install -e '.[hf]' in a checkout)")
    return ""


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flashnorm_kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
