"""Kernels of the deferred-normalization pipeline for the `sim` backend (numpy).

Each kernel is a plain function over the arrays the sim backend hands a launch
(views of the first M rows of persistent buffers) and writes its result in place,
as a CUDA kernel writes device memory. Arithmetic follows the CUDA kernels in
cuda/deferred_norm.cu: inputs widened to fp32, fp32 accumulation, one rounding to
the storage dtype per write.

bfloat16: numpy has no bfloat16 dtype, so the sim *emulates* it: bf16 buffers are
float32 arrays whose values lie on the bf16 grid. Every kernel rounds what it
reads (a no-op on grid values) and what it writes to the grid with
round-to-nearest-even done on the bit pattern, which is what `cvt.rn.bf16.f32`
does on the GPU. Values, not bytes, match a real bf16 buffer (a float32 buffer is
twice as large, which changes no race).
"""
from __future__ import annotations

import numpy as np

_BF16_ROUND = np.uint32(0x7FFF)
_HIGH_HALF = np.uint32(0xFFFF0000)


def round_to_bf16(a) -> np.ndarray:
    """`a` rounded to the nearest bfloat16 (ties to even), as float32. NaN stays NaN,
    values past the bf16 range become ±inf (as `cvt.rn.bf16.f32` does)."""
    a = np.array(a, dtype=np.float32, copy=True)
    bits = a.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit, then truncating, rounds half to even.
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + _BF16_ROUND + lowest_kept) & _HIGH_HALF
    out = rounded.view(np.float32)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = np.nan  # the carry above would turn some NaN payloads into inf
    return out


def bf16_bits(a) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of `a` rounded to nearest even: what a
    bf16 device buffer stored as uint16 holds."""
    return (round_to_bf16(a).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_from_bits(bits) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16 or any 2-byte view)."""
    bits = np.ascontiguousarray(bits).view(np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _widen(a: np.ndarray, bf16: bool) -> np.ndarray:
    a32 = a.astype(np.float32, copy=False)
    return round_to_bf16(a32) if bf16 else a32


def _store(dst: np.ndarray, value32: np.ndarray, bf16: bool) -> None:
    dst[...] = round_to_bf16(value32) if bf16 else value32  # numpy casts to dst.dtype (round to nearest)


def matmul(x: np.ndarray, w: np.ndarray, y: np.ndarray, *, bf16: bool = False) -> None:
    """y = x · wᵀ (w is [out, in] as nn.Linear stores it); fp32 accumulation."""
    _store(y, _widen(x, bf16) @ _widen(w, bf16).T, bf16)


def rms(x: np.ndarray, r: np.ndarray, *, eps: float, bf16: bool = False) -> None:
    """r = 1 / sqrt(mean(x², row) + eps) in fp32 (eps inside the sqrt, as HF's RMSNorm)."""
    x32 = _widen(x, bf16)
    mean_sq = np.sum(x32 * x32, axis=1, dtype=np.float32) / np.float32(x32.shape[1])
    r[...] = np.float32(1.0) / np.sqrt(mean_sq + np.float32(eps))


def postscale(y: np.ndarray, r: np.ndarray, *outs: np.ndarray, columns, bf16: bool = False) -> None:
    """outs[i] = y[:, columns[i]] · r (per row), in fp32, rounded once to the storage dtype."""
    y32 = _widen(y, bf16)
    scale = r.astype(np.float32, copy=False)[:, None]
    for out, (start, stop) in zip(outs, columns):
        _store(out, y32[:, start:stop] * scale, bf16)


def postscale_mixed(y: np.ndarray, r, ones: np.ndarray, *outs: np.ndarray, columns, unscaled,
                    bf16: bool = False) -> None:
    """As `postscale`, except that outputs whose index is in `unscaled` (FlashNorm Prop 3: a
    later norm re-normalises them) are scaled by `ones`, a buffer of 1.0 per row, as the CUDA
    path does with the same kernel. y·1 is exact and the store rounds a value already on the
    storage grid, so those outputs are Y's columns as stored, bit for bit. `r` is not read
    when every output is unscaled (the pipeline then passes None: no RMS was computed)."""
    for i, (out, column) in enumerate(zip(outs, columns)):
        postscale(y, ones if i in unscaled else r, out, columns=(column,), bf16=bf16)
