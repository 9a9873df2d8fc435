"""Where the recording's time goes on the torch decode loop of bench_torch_overhead.py: the loop
under `streamcheck.instrument()` (the native observer where it builds; STREAMCHECK_NATIVE_RECORD=0:
the Python path), profiled with cProfile, and the records it made per step, by kind.

    python benchmarks/profile_torch_decode.py [--steps 300] [--top 30] [--compiled] [--out profile.txt]

Prints the records per step by type, then cProfile's top functions by own time and by cumulative
time (the profiler's own cost inflates every figure: read the shares, not the microseconds).
Needs a GPU with a CUDA build of torch.
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import io
import pstats
import sys

from bench_torch_overhead import decode_loop


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--compiled", action="store_true", help="the loop's three functions under torch.compile")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("profile_torch_decode: needs a GPU that torch can use (a CUDA build of torch and a device)",
              file=sys.stderr)
        return 2
    import os

    import streamcheck.record.instrument as instrument

    os.environ.setdefault("STREAMCHECK_NATIVE_RECORD", "1")  # the native observer unless =0 (opt-in until the flip)
    session = instrument.start()
    profile = cProfile.Profile()
    try:
        decode_loop(args.dim, 20, 10, 1, args.compiled)  # warm-up, unprofiled: first calls, the observer's build
        before = len(session.trace)
        profile.enable()
        times = decode_loop(args.dim, args.steps, 0, 1, args.compiled)
        profile.disable()
        path = "native" if "torch_native" in session.state else "python"
    finally:
        instrument.stop()
    from streamcheck.core.fast import handover_notice

    ops = session.trace.ops[before:]
    kinds = collections.Counter(type(op).__name__ for op in ops)
    text = io.StringIO()
    text.write(f"torch decode loop{' (compiled)' if args.compiled else ''} under streamcheck ({path} path), "
               f"{args.steps} profiled steps, "
               f"{times[0]:.1f} µs/step under the profiler; records per step:\n")
    handed = handover_notice(session.checker)
    if handed:
        text.write(handed + "\n")
    for kind, n in kinds.most_common():
        text.write(f"  {kind:<16} {n / args.steps:6.2f}\n")
    text.write(f"  {'all':<16} {len(ops) / args.steps:6.2f}\n")
    for order in ("tottime", "cumulative"):
        stats = pstats.Stats(profile, stream=text)
        stats.sort_stats(order).print_stats(args.top)
    report = text.getvalue()
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
