"""What a small sim program costs from `Device("sim")` on: the built-in backend answered from its
table (now) against the entry-point scan of every installed distribution it did before, side by
side in one run (median of repeats, wall µs per program on this machine).

    python benchmarks/bench_device_start.py [--programs 200] [--repeats 5]

A program: Device("sim"), one buffer, a producer and a consumer on two streams with an event
between them (3 recorded operations, no race). The suite builds thousands of such devices.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def program() -> None:
    from streamcheck.device import Device

    dev = Device("sim")
    a, b = dev.stream("a"), dev.stream("b")
    x = dev.alloc(4, fill=0.0, name="x")
    dev.launch(lambda v: None, (x,), stream=a, writes=[x], name="produce")
    b.wait_event(a.record())
    dev.launch(lambda v: None, (x,), stream=b, reads=[x], name="consume")
    assert dev.races == []


def timed(programs: int) -> float:
    start = time.perf_counter()
    for _ in range(programs):
        program()
    return (time.perf_counter() - start) / programs * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from streamcheck.device import backends

    table = backends._target
    scanning = lambda name: backends._registered().get(name)  # noqa: E731 (the lookup before)
    rows = {"built-in table (now)": [], "entry-point scan (before)": []}
    program()  # imports and first-use costs out of the way
    for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
        for label, lookup in (("built-in table (now)", table), ("entry-point scan (before)", scanning)):
            backends._target = lookup
            try:
                rows[label].append(timed(args.programs))
            finally:
                backends._target = table
    base = statistics.median(rows["built-in table (now)"])
    print(f"small sim program from Device('sim') on: {args.programs} programs, median of {args.repeats} repeats")
    print(f"{'lookup':<28}{'µs per program':>16}{'ratio':>8}")
    for label, times in rows.items():
        median = statistics.median(times)
        print(f"{label:<28}{median:>16.1f}{median / base:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
