"""FlashNorm kernels: weight folding, dual-stream deferred normalization, pre-norm cancellation."""
from .fold import AlreadyFoldedError, FlashNormError, UnsupportedArchitectureError, flashify
from .checkpoint import CheckpointPathError, flashify_checkpoint
from .cancel import NotCancellableError, cancellable_projections
from .pipeline import DeferredNormProjection, Storage, normalize_dtype, reference_norm_proj, storage_for
