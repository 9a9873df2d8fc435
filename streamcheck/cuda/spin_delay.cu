// Bounded spin kernel: holds one stream back for a given time so that a missing
// edge between streams strikes (the consumer runs before the delayed producer).
//
// Loaded at run time through cupy.RawModule (NVRTC) by streamcheck.backends.cupy_backend;
// CI only compiles it (nvcc -arch=sm_90 --cubin) to catch syntax errors.
//
// One thread of one block: it occupies a single SM slot, so kernels on other
// streams keep running next to it. Two independent limits make sure it always
// ends, whatever the clocks do:
//   - wall time from %globaltimer (nanoseconds), the intended duration;
//   - SM cycles from clock64(), a cap computed on the host from the SM clock
//     rate, in case %globaltimer does not advance on some platform.
// The host clamps `ns` to STREAMCHECK_SPIN_MAX_NS as well; the kernel clamps
// again so that a bad argument cannot hang the device.

#define STREAMCHECK_SPIN_MAX_NS 50000000ULL  // 50 ms

__device__ __forceinline__ unsigned long long streamcheck_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void streamcheck_spin(unsigned long long ns, unsigned long long max_cycles,
                                            unsigned long long* elapsed_out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (ns > STREAMCHECK_SPIN_MAX_NS) ns = STREAMCHECK_SPIN_MAX_NS;
    const unsigned long long t0 = streamcheck_globaltimer();
    const long long c0 = clock64();
    unsigned long long elapsed = 0;
    for (;;) {
        elapsed = streamcheck_globaltimer() - t0;
        if (elapsed >= ns) break;
        if ((unsigned long long)(clock64() - c0) >= max_cycles) break;
    }
    // Optional: report how long it really spun (calibration / tests).
    if (elapsed_out != nullptr) *elapsed_out = elapsed;
}
