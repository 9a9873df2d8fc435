// Kernels of FlashNorm's deferred normalization (Prop 2), loaded by kernels_cuda.py
// through cupy.RawModule (NVRTC). The matmul itself goes through cuBLAS.
//
//   rms_<t>[_v<k>]       r[m] = 1 / sqrt(mean(x[m, :]^2) + eps)      one block per row
//   postscale_<t>[_v<k>] out[m, j] = y[m, col0 + j] * r[m]            2-D grid: (column tiles, rows)
//
// <t> is the storage type: f32 (float), f16 and bf16 (16-bit patterns in unsigned
// short). _v<k> variants move 16 bytes per load/store; the host picks them only when
// every row start is 16-byte aligned. All arithmetic is fp32; one rounding per write.
//
// No #include: NVRTC finds cuda_fp16.h / cuda_bf16.h only when a CUDA toolkit's
// include directory is on its path, which CuPy no longer guarantees (it stopped
// bundling those headers). The 16-bit conversions are single PTX instructions
// (cvt.*, bf16 needs sm_80+), so we write them directly; the results are those of
// __half2float / __float2half_rn / __bfloat162float / __float2bfloat16_rn.

struct F32 {
    typedef float storage;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};

struct F16 {
    typedef unsigned short storage;
    static __device__ __forceinline__ float load(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

struct BF16 {
    typedef unsigned short storage;
    static __device__ __forceinline__ float load(unsigned short h) {
        return __uint_as_float(((unsigned int)h) << 16);  // bf16 is the high half of an fp32
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

// VEC elements moved as one aligned load/store (16 bytes for the _v variants).
template <typename S, int VEC>
struct alignas(sizeof(S) * VEC) Pack {
    S v[VEC];
};

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// One block per row; blockDim.x is a multiple of 32 (at most 1024), d % VEC == 0.
template <typename T, int VEC>
__device__ __forceinline__ void rms_row(const typename T::storage* __restrict__ x, float* __restrict__ r,
                                        int d, float eps) {
    typedef typename T::storage S;
    const S* row = x + (size_t)blockIdx.x * (size_t)d;
    float acc = 0.0f;
    for (int i = threadIdx.x * VEC; i < d; i += blockDim.x * VEC) {
        Pack<S, VEC> p = *reinterpret_cast<const Pack<S, VEC>*>(row + i);
        #pragma unroll
        for (int k = 0; k < VEC; ++k) {
            float v = T::load(p.v[k]);
            acc = fmaf(v, v, acc);
        }
    }
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    acc = warp_sum(acc);
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        acc = lane < warps ? warp_sums[lane] : 0.0f;
        acc = warp_sum(acc);
        if (lane == 0) {
            // eps inside the sqrt, as HF's RMSNorm; IEEE sqrt and division (no rsqrtf approximation).
            r[blockIdx.x] = 1.0f / sqrtf(acc / (float)d + eps);
        }
    }
}

// grid = (ceil(n / (blockDim.x * VEC)), rows); n % VEC == 0; y row stride y_stride.
template <typename T, int VEC>
__device__ __forceinline__ void postscale_tile(const typename T::storage* __restrict__ y,
                                               const float* __restrict__ r,
                                               typename T::storage* __restrict__ out,
                                               int n, int y_stride, int col0) {
    typedef typename T::storage S;
    const int row = blockIdx.y;
    const int j = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (j >= n) return;
    const float scale = r[row];
    const S* src = y + (size_t)row * (size_t)y_stride + col0 + j;
    S* dst = out + (size_t)row * (size_t)n + j;
    Pack<S, VEC> p = *reinterpret_cast<const Pack<S, VEC>*>(src);
    #pragma unroll
    for (int k = 0; k < VEC; ++k) {
        p.v[k] = T::store(T::load(p.v[k]) * scale);
    }
    *reinterpret_cast<Pack<S, VEC>*>(dst) = p;
}

#define DEFINE_KERNELS(tag, T, VEC, suffix)                                                          \
    extern "C" __global__ void rms_##tag##suffix(const T::storage* __restrict__ x,                  \
                                                 float* __restrict__ r, int d, float eps) {          \
        rms_row<T, VEC>(x, r, d, eps);                                                               \
    }                                                                                                \
    extern "C" __global__ void postscale_##tag##suffix(const T::storage* __restrict__ y,            \
                                                       const float* __restrict__ r,                  \
                                                       T::storage* __restrict__ out, int n,          \
                                                       int y_stride, int col0) {                     \
        postscale_tile<T, VEC>(y, r, out, n, y_stride, col0);                                        \
    }

DEFINE_KERNELS(f32, F32, 1, )
DEFINE_KERNELS(f16, F16, 1, )
DEFINE_KERNELS(bf16, BF16, 1, )
DEFINE_KERNELS(f32, F32, 4, _v4)
DEFINE_KERNELS(f16, F16, 8, _v8)
DEFINE_KERNELS(bf16, BF16, 8, _v8)
