"""Overhead of streamcheck.instrument (recording + happens-before checking) on an eager CuPy
decode loop, against the same loop uninstrumented.

    python benchmarks/bench_instrument_overhead.py [--steps 200] [--repeats 7] [--dim 4096] [--dtype float32]

The loop is FlashNorm-like, dual-stream, correctly synchronized: per decode step
  caller: embed (RawKernel writes x)            -> fork event
  A:      y = x @ W*ᵀ   (cupy.matmul, cuBLAS, out=y)
  B:      r = 1/RMS(x)  (RawKernel, one block)
  caller: waits for A and B, out = y * r (RawKernel post-scale); the next fork covers
          the WAR edge on y.
1×dim @ dim×dim (default 1×4096 @ 4096×4096 fp32). Two variants: `pipelined` (the host
issues steps back to back, one synchronize at the end) and `token sync` (the host reads
one value per step, as a decode loop does to pick the next token). Reports the median
µs/step over the repeats and the ratio to the uninstrumented loop (target <= 2.0x). Besides
`record + check` (as `streamcheck run` does it: call sites with a stack of up to 8 frames):
`check at syncs`, the checker fed at host synchronizations (Recorder.defer_checks), and
`stack depth 1`, call sites without the user's callers (SiteSettings(depth=1)): what the stack costs.
Needs a GPU with CuPy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

# Runnable from a checkout without installing (as `python3 benchmarks/...`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SOURCE = r"""
extern "C" __global__ void embed(float* x, const float step, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.001f * (float)((i * 7 + (int)step) % 97);
}
extern "C" __global__ void rms(const float* __restrict__ x, float* __restrict__ r, const int n, const float eps) {
    __shared__ float partial[256];
    float acc = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i] * x[i];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) r[0] = rsqrtf(partial[0] / n + eps);
}
extern "C" __global__ void postscale(const float* __restrict__ y, const float* __restrict__ r,
                                     float* __restrict__ out, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = y[i] * r[0];
}
"""


class DecodeLoop:
    """Kernels, streams, events and persistent buffers; build it inside a session to record it."""

    def __init__(self, dim: int):
        import cupy

        self.cupy = cupy
        self.dim = dim
        self.embed = cupy.RawKernel(_SOURCE, "embed")
        self.rms = cupy.RawKernel(_SOURCE, "rms")
        self.postscale = cupy.RawKernel(_SOURCE, "postscale")
        self.caller = cupy.cuda.Stream(non_blocking=True)
        self.a = cupy.cuda.Stream(non_blocking=True)
        self.b = cupy.cuda.Stream(non_blocking=True)
        self.fork, self.mm_done, self.rms_done = (cupy.cuda.Event(disable_timing=True) for _ in range(3))
        rng = np.random.default_rng(0)
        self.w = cupy.asarray(rng.standard_normal((dim, dim), dtype=np.float32) / np.sqrt(dim))
        self.wt = self.w.T
        self.x = cupy.zeros((1, dim), dtype=cupy.float32)
        self.y = cupy.zeros((1, dim), dtype=cupy.float32)
        self.r = cupy.zeros((1,), dtype=cupy.float32)
        self.out = cupy.zeros((1, dim), dtype=cupy.float32)
        self.n = np.int32(dim)
        self.grid = ((dim + 255) // 256,)
        cupy.cuda.Device().synchronize()

    def step(self, t: int) -> None:
        cupy = self.cupy
        with self.caller:
            self.embed(self.grid, (256,), (self.x, np.float32(t), self.n))
        self.fork.record(self.caller)
        self.a.wait_event(self.fork)
        self.b.wait_event(self.fork)
        with self.a:
            cupy.matmul(self.x, self.wt, out=self.y)
        with self.b:
            self.rms((1,), (256,), (self.x, self.r, self.n, np.float32(1e-6)))
        self.mm_done.record(self.a)
        self.rms_done.record(self.b)
        self.caller.wait_event(self.mm_done)
        self.caller.wait_event(self.rms_done)
        with self.caller:
            self.postscale(self.grid, (256,), (self.y, self.r, self.out, self.n))

    def run(self, steps: int, token_sync: bool) -> float:
        """µs per step for `steps` steps (after the caller stream drained)."""
        t0 = time.perf_counter()
        for t in range(steps):
            self.step(t)
            if token_sync:
                self.out[0, :1].get(stream=self.caller)  # the host picks the next token
        self.caller.synchronize()
        return (time.perf_counter() - t0) / steps * 1e6


def measure(mode: str, args, token_sync: bool) -> tuple:
    """Median µs/step over the repeats, plus (ops recorded per step, races) when instrumented."""
    import streamcheck.record.instrument as instrument
    from streamcheck.core.trace import SiteSettings, set_site_settings

    times, ops_per_step, races = [], 0.0, 0
    for _ in range(args.repeats):
        session = None
        if mode != "uninstrumented":
            sites = set_site_settings(SiteSettings(depth=1 if mode == "stack depth 1" else 8))
            session = instrument.start(check=(mode != "record only"))
            if mode == "check at syncs":
                session.defer_checks()
        try:
            loop = DecodeLoop(args.dim)
            loop.run(args.warmup, token_sync)
            before = len(session.trace) if session else 0
            times.append(loop.run(args.steps, token_sync))
            if session:
                ops_per_step = (len(session.trace) - before) / args.steps
                races = len(session.races)
        finally:
            if session:
                instrument.stop()
                set_site_settings(sites)
    return statistics.median(times), min(times), max(times), ops_per_step, races


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dim", type=int, default=4096)
    args = ap.parse_args(argv)
    from streamcheck.device.backends import gpu_available

    if not gpu_available():
        print("bench_instrument_overhead: needs an NVIDIA GPU and CuPy", file=sys.stderr)
        return 2
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"instrument overhead: {name}, CuPy {cupy.__version__}, 1x{args.dim} @ {args.dim}x{args.dim} fp32, "
          f"{args.steps} steps after {args.warmup} warm-up steps, median of {args.repeats} repeats")
    header = f"{'variant':<12} {'mode':<16} {'median µs/step':>15} {'min':>9} {'max':>9} {'ratio':>7} " \
             f"{'ops/step':>9} {'races':>6}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for token_sync in (False, True):
        variant = "token sync" if token_sync else "pipelined"
        base = None
        for mode in ("uninstrumented", "record only", "record + check", "check at syncs", "stack depth 1"):
            median, lo, hi, ops, races = measure(mode, args, token_sync)
            base = base or median
            ratio = median / base
            if mode == "record + check":
                worst = max(worst, ratio)
            print(f"{variant:<12} {mode:<16} {median:>15.1f} {lo:>9.1f} {hi:>9.1f} {ratio:>6.2f}x "
                  f"{ops if mode != 'uninstrumented' else 0:>9.1f} {races if mode != 'uninstrumented' else 0:>6}")
    print(f"worst ratio with checking: {worst:.2f}x (target <= 2.0x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
