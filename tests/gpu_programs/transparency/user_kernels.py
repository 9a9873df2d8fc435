"""User-defined kernels: ElementwiseKernel (plain and with a raw argument), ReductionKernel,
RawKernel (on the current stream and with stream=), RawModule (C functions and a C++ template
through name_expressions) and cupy.fuse. Correct: the non-blocking stream makes its own input,
and every value is read on the stream that wrote it."""
import cupy

squared_diff = cupy.ElementwiseKernel("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff")
reverse = cupy.ElementwiseKernel("raw T src, int32 n", "T dst", "dst = src[n - 1 - i]", "reverse_copy")
l2norm = cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")

RAW = r"""
extern "C" __global__ void saxpy(const float a, const float* x, const float* y, float* out, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""
saxpy = cupy.RawKernel(RAW, "saxpy")

MODULE = r"""
extern "C" {
__global__ void scale(float* x, const float f, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}
__global__ void shifted(const float* x, float* y, const float d, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + d;
}
}
template <typename T>
__global__ void twice(const T* x, T* y, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + x[i];
}
"""
module = cupy.RawModule(code=MODULE, name_expressions=["twice<float>", "twice<double>"])


@cupy.fuse()
def hypot_plus(x, y):
    return cupy.sqrt(x * x + y * y) + 1


def main():
    n = 4096
    grid, block = ((n + 255) // 256,), (256,)
    x = cupy.arange(n, dtype=cupy.float32)
    y = cupy.full(n, 2.0, dtype=cupy.float32)
    print("elementwise", f"{float(squared_diff(x, y).sum()):.1f}", "reverse", reverse(x, n, size=n)[:3].get().tolist())
    print("reduction l2norm", f"{float(l2norm(y)):.4f}")

    out = cupy.empty_like(x)
    saxpy(grid, block, (cupy.float32(3.0), x, y, out, cupy.int32(n)))
    print("raw kernel", out[:3].get().tolist(), f"{float(out.sum()):.1f}")

    scale, shifted = module.get_function("scale"), module.get_function("shifted")
    scale(grid, block, (out, cupy.float32(0.5), cupy.int32(n)))
    shifted(grid, block, (out, x, cupy.float32(-1.0), cupy.int32(n)))  # x is overwritten
    doubled = cupy.empty(n, dtype=cupy.float64)
    module.get_function("twice<double>")(grid, block, (x.astype(cupy.float64), doubled, cupy.int32(n)))
    print("raw module", x[:3].get().tolist(), "template", doubled[-2:].get().tolist())
    print("fuse", [f"{v:.4f}" for v in hypot_plus(x[:3], y[:3]).get()])

    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        a = cupy.ones(n, dtype=cupy.float32)
        b = cupy.arange(n, dtype=cupy.float32)
        res = cupy.empty_like(a)
    saxpy(grid, block, (cupy.float32(2.0), a, b, res, cupy.int32(n)), stream=side)
    twice_f = module.get_function("twice<float>")
    twice_f(grid, block, (res, a, cupy.int32(n)), stream=side)
    print("stream= launches", a[-2:].get(stream=side).tolist())
    side.synchronize()


if __name__ == "__main__":
    main()
