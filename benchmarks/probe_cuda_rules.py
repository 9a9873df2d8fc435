"""Three CUDA behaviours peers' test suites assume and the model must match, each settled on the GPU
with a small probe: a bounded spin kernel (streamcheck's SpinDelay, 20 ms) on one stream, then the
call under test, then a query of the spinning stream. `done` right after the call means the call
waited for the spin; `pending` means it did not.

(a) cudaStreamSynchronize of the legacy stream while a blocking stream has pending work and the
    legacy stream has none;
(b) cudaFree of memory while another stream's work is pending;
(c) cudaMemset on managed memory (host-synchronous or not), with a non-blocking stream spinning,
    and with a blocking stream spinning.

    python benchmarks/probe_cuda_rules.py     # one line per probe, repeated 5 times each
"""
from __future__ import annotations

import time

import cupy

from streamcheck.record.gpu import SpinDelay

SPIN_US = 20_000
REPEATS = 5
rt = cupy.cuda.runtime


def probe(name: str, stream_kind: str, call) -> None:
    spin = SpinDelay.get()
    outcomes, waits = [], []
    for _ in range(REPEATS):
        stream = cupy.cuda.Stream(non_blocking=(stream_kind == "non_blocking"))
        cupy.cuda.Device().synchronize()
        spin.enqueue(stream, SPIN_US)
        t0 = time.perf_counter()
        call()
        waits.append((time.perf_counter() - t0) * 1e6)
        outcomes.append("done" if stream.done else "pending")
        stream.synchronize()
    waited = sorted(waits)[len(waits) // 2]
    print(f"{name}: spinning {stream_kind} stream after the call: {', '.join(outcomes)}; "
          f"the call took {waited:.0f} µs (median; the spin is {SPIN_US} µs)", flush=True)


def main() -> None:
    print(f"GPU: {rt.getDeviceProperties(0)['name'].decode()}, CUDA runtime {rt.runtimeGetVersion()}, "
          f"driver {rt.driverGetVersion()}")
    probe("(a) cudaStreamSynchronize(legacy)", "blocking", lambda: rt.streamSynchronize(0))
    probe("(a') cudaStreamSynchronize(legacy)", "non_blocking", lambda: rt.streamSynchronize(0))

    def free_one():
        ptr = rt.malloc(1 << 20)
        rt.free(ptr)

    probe("(b) cudaMalloc + cudaFree", "non_blocking", free_one)
    managed = rt.mallocManaged(1 << 20, rt.cudaMemAttachGlobal)
    probe("(c) cudaMemset(managed)", "non_blocking", lambda: rt.memset(managed, 0, 1 << 20))
    probe("(c') cudaMemset(managed)", "blocking", lambda: rt.memset(managed, 0, 1 << 20))
    device = rt.malloc(1 << 20)
    probe("(c'') cudaMemset(device memory)", "non_blocking", lambda: rt.memset(device, 0, 1 << 20))
    rt.free(device)
    rt.free(managed)


if __name__ == "__main__":
    main()
