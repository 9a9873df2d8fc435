"""What each recording-cost idea could buy, measured on the CPU with a stand-in GPU (no CuPy,
no CUDA): the recorder (streamcheck/record/recorder.py) driven with the operation mix of one step of
benchmarks/bench_instrument_overhead.py's decode loop (12 operations: a RawKernel, an event
record, two waits, cuBLAS `matmul` with out=, the RMS kernel, two records, two waits, the
post-scale, a host read), library time excluded.

    python benchmarks/bench_recorder.py [--steps 3000] [--repeats 5] [--depth 12]

Modes, side by side in one run (median CPU µs per operation over the repeats: on a shared machine
wall time measures the neighbours too), each with the loop
called from the script's top (3 frames of the user's) and `--depth` frames deeper (the stack
walk stops at SiteSettings.depth = 8):
- record + check: what `streamcheck run` does today (call sites as (code, offset) pairs of the
  user's frames, resolved only when a report reads them);
- record + check, line resolver: the resolver before the stack (the user's frame only, its line
  looked up at every operation), kept here to measure against;
- record + check at host syncs: Recorder.defer_checks (the checker fed at each host sync);
- record only (checker off): what stays on the program's thread if the checker ran in another
  process (an upper bound of that idea's gain: the hand-off itself is not counted);
- record + check, no call sites: the frame walk skipped, a constant site recorded (the floor).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from streamcheck.record import recorder as R  # noqa: E402
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


class LineResolver:
    """The call-site resolver before (code, offset) capture, to measure against: the first frame
    outside `internal`, its line read (frame.f_lineno) at every call, sites cached by (file, line)."""

    def __init__(self, internal):
        self.internal = tuple(internal)
        self._inside: dict = {}
        self._sites: dict = {}

    def __call__(self) -> T.CallSite:
        frame = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            skipped = self._inside.get(filename)
            if skipped is None:
                skipped = self._inside[filename] = os.path.abspath(filename).startswith(self.internal)
            if not skipped:
                key = (filename, frame.f_lineno)
                site = self._sites.get(key)
                if site is None:
                    site = self._sites[key] = T.CallSite(filename, frame.f_lineno, frame.f_code.co_name)
                return site
            frame = frame.f_back
        return T.UNKNOWN_SITE


def nested(depth: int, fn, *args):
    """fn(*args) called `depth` frames of the user's deeper."""
    return nested(depth - 1, fn, *args) if depth else fn(*args)


def per_op_us(mode: str, steps: int) -> float:
    rec = R.Recorder(StandInGpu(), check=mode != "record only (checker elsewhere)")
    if mode == "record + check, no call sites":
        rec.site = lambda: T.UNKNOWN_SITE
    elif mode == "record + check, line resolver":
        rec.site = LineResolver(rec.site.internal)
    elif mode == "record + check at host syncs":
        rec.defer_checks()
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
        t0 = time.process_time()
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
        assert not rec.races and not rec.errors, rec.report()  # every mode checks the same race-free loop
        return (time.process_time() - t0) / (steps * 12) * 1e6
    finally:
        R.current = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--depth", type=int, default=12, help="frames of the user's above the loop, in the deep runs")
    args = ap.parse_args(argv)
    modes = ("record + check", "record + check, line resolver", "record + check at host syncs",
             "record only (checker elsewhere)", "record + check, no call sites")
    depths = (0, args.depth)
    results = {(mode, depth): [] for mode in modes for depth in depths}
    cpu0 = time.process_time()
    for _ in range(args.repeats):  # interleaved, so machine load hits every mode alike
        for depth in depths:
            for mode in modes:
                results[mode, depth].append(nested(depth, per_op_us, mode, args.steps))
    print(f"recorder per operation, stand-in GPU, {args.steps} decode steps x 12 operations, median of "
          f"{args.repeats} (load average {os.getloadavg()[0]:.1f}; {time.process_time() - cpu0:.1f} s CPU)")
    print(f"{'mode':<34}" + "".join(f"{f'+{d} frames':>26}" for d in depths))
    for mode in modes:
        cells = []
        for depth in depths:
            median = statistics.median(results[mode, depth])
            cells.append(f"{median:8.2f} µs/op ({median / statistics.median(results[modes[1], depth]):.2f}x)")
        print(f"{mode:<34}" + "".join(f"{c:>26}" for c in cells))
    print("(x: of the line resolver's record + check, the code before the stack)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
