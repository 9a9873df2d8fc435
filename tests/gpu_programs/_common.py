"""Shared by the classic-bug scripts: tiny CUDA kernels and the result line the tests parse.

Each script repeats its pattern for a few steps (a single-shot race may not strike:
first launches and pool growth synchronize implicitly) and ends with
`report(observed, expected)`, which prints one line

    RESULT {"observed": [...], "expected": [...], "wrong": <steps whose value differs>}

and exits 0: the exit status belongs to `streamcheck run --error-exitcode`.
Kernels are RawKernels with `const` on read-only pointers, which is how
streamcheck tells reads from writes.
"""
import json

import cupy

_SOURCE = r"""
extern "C" __global__ void fill_value(float* y, const float v, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
extern "C" __global__ void copy_values(const float* __restrict__ x, float* __restrict__ y, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void add_value(float* y, const float v, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += v;
}
extern "C" __global__ void add_arrays(const float* a, const float* b, float* out, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""

# Defined at import, so (under streamcheck run) each module is loaded before any racy step.
_fill = cupy.RawKernel(_SOURCE, "fill_value")
_copy = cupy.RawKernel(_SOURCE, "copy_values")
_add = cupy.RawKernel(_SOURCE, "add_value")
_sum = cupy.RawKernel(_SOURCE, "add_arrays")

N = 1024  # elements per buffer
STEPS = 3


def _grid(n):
    return ((n + 255) // 256,)


def fill(y, value):
    """y[:] = value on the current stream."""
    _fill(_grid(y.size), (256,), (y, cupy.float32(value), cupy.int32(y.size)))


def copy(x, y):
    """y[:] = x[:] on the current stream (reads x, writes y)."""
    _copy(_grid(y.size), (256,), (x, y, cupy.int32(y.size)))


def add(y, value):
    """y[:] += value on the current stream."""
    _add(_grid(y.size), (256,), (y, cupy.float32(value), cupy.int32(y.size)))


def add_arrays(a, b, out):
    """out[:] = a[:] + b[:] on the current stream (reads a and b)."""
    _sum(_grid(out.size), (256,), (a, b, out, cupy.int32(out.size)))


def buffers(*names, n=N):
    """Zeroed float32 buffers, with the host waiting for the zeroing: the memset runs on
    the legacy stream, which non-blocking streams would not wait for."""
    arrays = [cupy.zeros(n, dtype=cupy.float32) for _ in names]
    cupy.cuda.Device().synchronize()
    return arrays


def value_of(array, index=0):
    """One element, read after a device-wide synchronize (the check itself must not race)."""
    cupy.cuda.Device().synchronize()
    return float(array[index:index + 1].get()[0])


def report(observed, expected):
    wrong = sum(1 for o, e in zip(observed, expected) if o != e)
    print("RESULT " + json.dumps({"observed": observed, "expected": expected, "wrong": wrong}), flush=True)
