"""FlashNorm kernels: weight folding, dual-stream deferred normalization, pre-norm cancellation."""
