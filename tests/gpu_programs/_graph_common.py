"""Kernels of the CUDA-graph scripts (race_graph_*.py, ok_graph_*.py): a FlashNorm-like step.

    matmul_like(x, y):        y = 2 x          (stream A in the dual-stream step)
    rms_like(x, r):           r = x + 1        (stream B)
    post_scale(y, r, out):    out = y * r      (the origin stream, after both)

so a launch with x = t gives out = 2 t (t + 1); a post-scale that reads the previous
launch's y gives 2 (t - 1) (t + 1): the talk's one-step lag. `spin(ns)` is a bounded
one-thread busy wait that a script captures into its own graph to make a race inside
the graph strike (streamcheck injects no delay into a capture). Kernels are RawKernels
with `const` on read-only pointers, which is how streamcheck tells reads from writes.
"""
import cupy

_SOURCE = r"""
extern "C" __global__ void spin_ns(const unsigned long long ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const unsigned long long limit = ns < 50000000ULL ? ns : 50000000ULL;  // 50 ms at most
    unsigned long long t0, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const long long c0 = clock64();
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - t0 < limit && clock64() - c0 < (1LL << 33));  // cycle cap: a backstop only
}
extern "C" __global__ void matmul_like(const float* x, float* y, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" __global__ void rms_like(const float* x, float* r, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) r[i] = x[i] + 1.0f;
}
extern "C" __global__ void post_scale(const float* y, const float* r, float* out, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = y[i] * r[i];
}
"""

_spin = cupy.RawKernel(_SOURCE, "spin_ns")
_matmul = cupy.RawKernel(_SOURCE, "matmul_like")
_rms = cupy.RawKernel(_SOURCE, "rms_like")
_post = cupy.RawKernel(_SOURCE, "post_scale")

LAUNCHES = 5  # graph launches per script
SPIN_NS = 2_000_000  # 2 ms: far longer than the other branch of the graph takes


def _grid(n):
    return ((n + 255) // 256,)


def spin(ns):
    _spin((1,), (1,), (cupy.uint64(ns),))


def matmul_like(x, y):
    _matmul(_grid(y.size), (256,), (x, y, cupy.int32(y.size)))


def rms_like(x, r):
    _rms(_grid(r.size), (256,), (x, r, cupy.int32(r.size)))


def post_scale(y, r, out):
    _post(_grid(out.size), (256,), (y, r, out, cupy.int32(out.size)))


def event():
    """An event for ordering only (no timing), as captures use them."""
    return cupy.cuda.Event(disable_timing=True)


def warm_up(x, y, r, out):
    """Run every kernel once outside any capture (on the current stream, then a device
    synchronize): a module loaded lazily during a capture would be a synchronous call there."""
    spin(0)
    matmul_like(x, y)
    rms_like(x, r)
    post_scale(y, r, out)
    cupy.cuda.Device().synchronize()
