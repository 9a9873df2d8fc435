"""Kernels of the deferred-normalization pipeline for the `cupy` backend.

Every function takes CuPy arrays (views of the first M rows of persistent buffers)
and enqueues its work on CuPy's *current* stream, which the cupy backend sets to
the launch's stream before calling a kernel callable; call them under
`with stream:` when launching by hand (benchmarks).

- rms / postscale: CUDA C kernels in cuda/deferred_norm.cu, compiled once per
  process by cupy.RawModule (NVRTC) and launched with RawKernel, which uses the
  current stream.
- matmul: cuBLAS. fp32 and fp16 through `cupy.matmul(..., out=)`. bf16 through
  torch (cuBLAS bf16 GEMM, fp32 accumulation): bf16 buffers are stored as 16-bit
  bit patterns (CuPy's own bfloat16 support is new and optional in v14, through
  ml_dtypes), so the bits are handed to torch with DLPack as int16 and viewed as
  torch.bfloat16 - no copy - and the GEMM is issued under
  torch.cuda.ExternalStream(current CuPy stream), i.e. on the same stream.

Storage dtypes: "float32" float32, "float16" float16, "bfloat16" any 2-byte dtype
holding bf16 bit patterns (uint16, int16, or ml_dtypes.bfloat16).

On torch tensors (hf_cuda.py): `cupy_view(tensor)` is a CuPy array over the tensor's
memory (no copy, no CUDA call, so it is safe inside a graph capture) and
`cupy_stream(ptr)` a CuPy stream object for a stream torch or CuPy created.
"""
from __future__ import annotations

import functools
import os

import numpy as np

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda", "deferred_norm.cu")
_TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_VEC = {"float32": 4, "float16": 8, "bfloat16": 8}  # elements per 16-byte access
_MAX_GRID_Y = 65535
_POSTSCALE_THREADS = 256
_RMS_MAX_THREADS = 512


def _module():
    import cupy

    return _module_of(cupy.RawModule)


@functools.lru_cache(maxsize=None)
def _module_of(raw_module_class):
    # Keyed by the class `cupy.RawModule` names now: streamcheck.instrument() rebinds it to a
    # subclass whose kernels it records, and a module loaded before the session would launch
    # unseen. One module object per class; CuPy memoizes the compiled module itself.
    with open(_SOURCE, encoding="utf-8") as f:
        code = f.read()
    _declare_accesses()
    return raw_module_class(code=code)


def _declare_accesses() -> None:
    """Tell streamcheck.instrument() what each kernel reads and writes: their names are made by
    a macro, so it cannot find their signatures and would count every array as written (x
    "written" by the RMS on stream B would race with the matmul reading it on stream A)."""
    from streamcheck.record.instrument import declare_kernel

    for dtype, tag in _TAG.items():
        for suffix in ("", f"_v{_VEC[dtype]}"):
            declare_kernel(f"rms_{tag}{suffix}", reads=(0,), writes=(1,), ignore=(2, 3))  # x, r, d, eps
            declare_kernel(f"postscale_{tag}{suffix}", reads=(0, 1), writes=(2,),  # y, r, out, n, stride, col0
                           ignore=(3, 4, 5))


def compile_kernels() -> None:
    """Compile and load every kernel now (NVRTC + module load), so neither happens
    inside a timed region or a graph capture."""
    module = _module()
    for dtype, tag in _TAG.items():
        for suffix in ("", f"_v{_VEC[dtype]}"):
            module.get_function(f"rms_{tag}{suffix}")
            module.get_function(f"postscale_{tag}{suffix}")


def _bits(a, dtype: str):
    """The array the kernel sees: 16-bit types as their bit patterns."""
    import cupy

    return a if dtype == "float32" else a.view(cupy.uint16)


def _vec(dtype: str, *arrays, counts=()) -> int:
    """16-byte accesses when every base pointer is 16-byte aligned and every row
    length/offset is a multiple of the vector width; else one element per access."""
    vec = _VEC[dtype]
    if all(a.data.ptr % 16 == 0 for a in arrays) and all(c % vec == 0 for c in counts):
        return vec
    return 1


def rms(x, r, *, eps: float, dtype: str) -> None:
    """r[m] = 1 / sqrt(mean(x[m]²) + eps): one block per row, fp32 accumulation,
    warp-shuffle reduction."""
    rows, d = x.shape
    if rows == 0:
        return
    vec = _vec(dtype, x, counts=(d,))
    per_row = -(-d // vec)
    threads = min(_RMS_MAX_THREADS, max(32, -(-per_row // 32) * 32))
    suffix = f"_v{vec}" if vec > 1 else ""
    kernel = _module().get_function(f"rms_{_TAG[dtype]}{suffix}")
    kernel((rows,), (threads,), (_bits(x, dtype), r, np.int32(d), np.float32(eps)))


def postscale(y, r, *outs, columns, dtype: str) -> None:
    """outs[i][m, :] = y[m, columns[i][0]:columns[i][1]] · r[m], rounded once."""
    rows, y_stride = y.shape
    y_bits = _bits(y, dtype)
    for out, (start, stop) in zip(outs, columns):
        n = stop - start
        vec = _vec(dtype, y, out, counts=(y_stride, start, n))
        suffix = f"_v{vec}" if vec > 1 else ""
        kernel = _module().get_function(f"postscale_{_TAG[dtype]}{suffix}")
        tiles = -(-n // (_POSTSCALE_THREADS * vec))
        out_bits = _bits(out, dtype)
        for first in range(0, rows, _MAX_GRID_Y):  # gridDim.y is at most 65535
            last = min(rows, first + _MAX_GRID_Y)
            kernel((tiles, last - first), (_POSTSCALE_THREADS,),
                   (y_bits[first:last], r[first:last], out_bits[first:last],
                    np.int32(n), np.int32(y_stride), np.int32(start)))


def matmul(x, w, y, *, dtype: str) -> None:
    """y = x · wᵀ (w is [out, in]) with cuBLAS, fp32 accumulation."""
    if x.shape[0] == 0:
        return
    if dtype == "bfloat16":
        _torch_matmul_bf16(x, w, y)
    else:
        import cupy

        cupy.matmul(x, w.T, out=y)


@functools.lru_cache(maxsize=None)
def _torch_stream(ptr: int, device: int):
    import torch

    if ptr == 0:  # CuPy's null stream is the legacy default stream, torch's default stream
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(ptr, device=torch.device("cuda", device))


def as_torch_bf16(a):
    """A torch.bfloat16 tensor aliasing a CuPy array of bf16 bit patterns (no copy).
    Call it with CuPy's and torch's current streams equal: torch.from_dlpack passes
    its current stream to CuPy's __dlpack__, which orders it after CuPy's current
    stream with an event if they differ, an edge the checker would not see."""
    import cupy
    import torch

    return torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16)


def _torch_matmul_bf16(x, w, y) -> None:
    import cupy
    import torch

    stream = cupy.cuda.get_current_stream()
    with torch.cuda.stream(_torch_stream(stream.ptr, cupy.cuda.Device().id)):
        torch.matmul(as_torch_bf16(x), as_torch_bf16(w).t(), out=as_torch_bf16(y))


def postscale_mixed(y, r, ones, *outs, columns, unscaled, dtype: str) -> None:
    """As `postscale`, except that outputs whose index is in `unscaled` (FlashNorm Prop 3) get
    `ones` (a persistent float32 buffer of 1.0 per row) as their scale: the same kernel, and
    y·1 rounded once is y, so they are Y's columns as stored, bit for bit. `r` is not read
    when every output is unscaled (pass None)."""
    for i, (out, column) in enumerate(zip(outs, columns)):
        postscale(y, ones if i in unscaled else r, out, columns=(column,), dtype=dtype)


_VIEW_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "uint16"}


def cupy_view(tensor):
    """A CuPy array over the bytes of CUDA tensor `tensor`: the same shape and strides, bf16 as
    uint16 bit patterns (the kernels' storage). No copy. The memory is wrapped with its device
    given, so no CUDA call is made (cudaPointerGetAttributes is not one to make inside a graph
    capture); the array keeps the tensor alive."""
    import cupy

    dtype = _VIEW_DTYPES.get(str(tensor.dtype))
    if dtype is None:
        raise ValueError(f"cupy_view: dtype {tensor.dtype} has no deferred-norm kernels; use bfloat16, float16 or "
                         "float32")
    if not tensor.is_cuda:
        raise ValueError(f"cupy_view: the tensor is on {tensor.device}; the kernels run on CUDA tensors")
    size = tensor.element_size()
    span = 1 + sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride())) if tensor.numel() else 0
    memory = cupy.cuda.UnownedMemory(tensor.data_ptr(), span * size, tensor, device_id=tensor.device.index)
    return cupy.ndarray(tuple(tensor.shape), dtype, cupy.cuda.MemoryPointer(memory, 0),
                        strides=tuple(st * size for st in tensor.stride()))


@functools.lru_cache(maxsize=None)
def cupy_stream(ptr: int):
    """A CuPy stream object for the stream with handle `ptr` (torch's current stream, a capture
    stream); 0 is the legacy default stream (CuPy's Stream.null). Cached: one object per handle."""
    import cupy
    from streamcheck.record.gpu import external_stream

    return external_stream(cupy, ptr)
