"""What each recording-cost idea could buy, measured on the CPU with a stand-in GPU (no CuPy,
no CUDA): the recorder (streamcheck/recorder.py) driven with the operation mix of one step of
benchmarks/bench_instrument_overhead.py's decode loop (12 operations: a RawKernel, an event
record, two waits, cuBLAS `matmul` with out=, the RMS kernel, two records, two waits, the
post-scale, a host read), library time excluded.

    python benchmarks/bench_recorder.py [--steps 3000] [--repeats 5]

Modes, side by side in one run (median µs per operation over the repeats):
- record + check: what `streamcheck run` does today;
- record only (checker off): what stays on the program's thread if the checker ran in another
  process (an upper bound of that idea's gain: the hand-off itself is not counted);
- record + check, call sites not resolved: an upper bound of resolving call sites lazily, only
  when a race is reported (the frame walk is skipped, a constant site recorded).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from streamcheck import recorder as R  # noqa: E402
from streamcheck.core import trace as T  # noqa: E402
from streamcheck.core.trace import CaptureMode, StreamKind  # noqa: E402


class Stream:
    def __init__(self, ptr):
        self.ptr = ptr


class Array:
    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes


class Event:
    pass


class StandInGpu:
    """recorder.Gpu without a GPU."""

    library_dirs = ()

    def __init__(self):
        self.legacy = Stream(0)

    def current_stream(self):
        return self.legacy

    def stream_ptr(self, stream):
        return stream.ptr

    def stream_kind(self, ptr):
        return StreamKind.NON_BLOCKING

    def is_capturing(self, stream):
        return False

    def spin(self, stream, us):
        pass

    def is_array(self, obj):
        return isinstance(obj, Array)

    def array_span(self, obj):
        return obj.ptr, obj.ptr + obj.nbytes

    def driver_range(self, ptr):
        return None

    def capture_mode(self, value):
        return CaptureMode.RELAXED


def per_op_us(check: bool, sites: bool, steps: int) -> float:
    rec = R.Recorder(StandInGpu(), check=check)
    if not sites:
        rec.site = lambda: T.UNKNOWN_SITE
    R.current = rec
    try:
        caller, a, b = Stream(0x10), Stream(0x20), Stream(0x30)
        for s in (caller, a, b):
            rec.register_stream(s.ptr, T.UNKNOWN_SITE, fresh=True)
        for base, size in ((0x1000, 4096), (0x2000, 4096), (0x3000, 4), (0x4000, 4096), (0x100000, 1 << 20)):
            rec.alloc(base, size)
        x, y, r, out, w = (Array(0x1000, 4096), Array(0x2000, 4096), Array(0x3000, 4), Array(0x4000, 4096),
                           Array(0x100000, 1 << 20))
        fork, mm, rd = Event(), Event(), Event()

        def nop(*args, **kwargs):
            return None
        t0 = time.perf_counter()
        for _ in range(steps):
            rec.launch("embed", nop, stream=caller, writes=(x,))
            rec.event_record(fork, caller, nop)
            rec.stream_wait(a, fork, nop)
            rec.stream_wait(b, fork, nop)
            rec.compute("cupy.matmul", nop, (x, w), {"out": y}, stream=a)
            rec.launch("rms", nop, stream=b, reads=(x,), writes=(r,))
            rec.event_record(mm, a, nop)
            rec.event_record(rd, b, nop)
            rec.stream_wait(caller, mm, nop)
            rec.stream_wait(caller, rd, nop)
            rec.launch("postscale", nop, stream=caller, reads=(y, r), writes=(out,))
            rec.host_read("get", out, caller, True, nop)
        return (time.perf_counter() - t0) / (steps * 12) * 1e6
    finally:
        R.current = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    modes = (("record + check", True, True), ("record only (checker elsewhere)", False, True),
             ("record + check, no call sites", True, False))
    results = {name: [] for name, _, _ in modes}
    for _ in range(args.repeats):  # interleaved, so machine load hits every mode alike
        for name, check, sites in modes:
            results[name].append(per_op_us(check, sites, args.steps))
    base = statistics.median(results[modes[0][0]])
    print(f"recorder per operation, stand-in GPU, {args.steps} decode steps x 12 operations, median of "
          f"{args.repeats} (load average {os.getloadavg()[0]:.1f})")
    for name, _, _ in modes:
        median = statistics.median(results[name])
        print(f"{name:<34}{median:>8.2f} µs/op  ({median / base:.2f} of record + check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
