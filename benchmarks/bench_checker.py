"""Checker throughput on a synthetic trace: 100,000 operations, 4 streams, 1,000 buffers; the Python
checker (hb.Checker, the reference) and the native one (core/fast.py) side by side.

    python benchmarks/bench_checker.py [--ops N] [--repeats R]
Prints, for each checker, the median operations per second over the repeats of feeding the trace
(target >= 100,000 for the Python checker, >= 5x that for the native one), by this process's CPU time
(the fairer figure on a machine shared with other jobs) and by wall clock, and their ratio; then the
CPU seconds of feeding the trace and reading its reports (races and hazards), where a racy trace costs
the native checker one replay into the Python checker. Two traces: the racy one (streams share
buffers without waits, thousands of distinct races) and a clean one (each stream keeps to its own
buffers). Checks every repeat found the same races, and both checkers the same reports.
"""
import argparse
import random
import statistics
import time

from streamcheck.core import fast
from streamcheck.core.hb import Checker
from streamcheck.core.trace import (Alloc, CallSite, EventCreate, EventRecord, Launch, Range, StreamCreate, StreamKind,
                                    StreamSync, StreamWait)


def synthetic_trace(n_ops: int, n_streams: int = 4, n_buffers: int = 1000, seed: int = 0, clean: bool = False) -> list:
    """`clean`: each stream reads and writes only its own buffers (buffer % n_streams), so nothing races."""
    rng = random.Random(seed)
    site = CallSite("bench.py", 1)
    ops = [StreamCreate(0, site, stream=0, kind=StreamKind.LEGACY)]
    ops += [StreamCreate(0, site, stream=s, kind=StreamKind.NON_BLOCKING, name=f"s{s}") for s in range(1, n_streams + 1)]
    ops += [EventCreate(0, site, event=s) for s in range(1, n_streams + 1)]
    ops += [Alloc(0, site, buffer=b, nbytes=4096) for b in range(n_buffers)]

    def buffer(stream: int) -> int:
        b = rng.randrange(n_buffers)
        return b - b % n_streams + stream - 1 if clean and b - b % n_streams + stream - 1 < n_buffers else b

    while len(ops) < n_ops:
        s = rng.randint(1, n_streams)
        r = rng.random()
        if r < 0.08:
            ops.append(EventRecord(0, site, event=s, stream=s))
        elif r < 0.16:
            ops.append(StreamWait(0, site, stream=s, event=rng.randint(1, n_streams)))
        elif r < 0.17:
            ops.append(StreamSync(0, site, stream=s))
        else:
            b1, b2 = buffer(s), buffer(s)
            half = rng.choice([(0, 2048), (2048, 4096), (0, 4096)])
            ops.append(Launch(0, CallSite("bench.py", 100 + rng.randrange(50)), stream=s, name="k",
                              reads=(Range(b1, *half),), writes=(Range(b2, *half),)))
    return ops[:n_ops]


def feed_once(make, ops) -> tuple:
    """(ops/s by CPU time, by wall clock, the races as (key, count) tuples) of one checker fed `ops`."""
    checker = make()
    feed = checker.feed
    t0, c0 = time.perf_counter(), time.process_time()
    for op in ops:
        feed(op)
    cpu, wall = len(ops) / (time.process_time() - c0), len(ops) / (time.perf_counter() - t0)
    return cpu, wall, tuple((r.key, r.count) for r in checker.races)


def report_once(make, ops) -> tuple:
    """(CPU seconds of feeding `ops` and reading races and hazards, the reports as dicts)."""
    c0 = time.process_time()
    checker = make()
    feed = checker.feed
    for op in ops:
        feed(op)
    races, hazards = checker.races, checker.hazards
    return time.process_time() - c0, [r.to_dict() for r in races] + [h.to_dict() for h in hazards]


def measure(title: str, ops, repeats: int) -> None:
    """Each repeat runs every checker once, one after the other, so a change of load hits both alike."""
    makers = {"Python": Checker} if fast.NativeChecker is None else {"Python": Checker, "native": fast.NativeChecker}
    cpu, wall, seconds = ({name: [] for name in makers} for _ in range(3))
    races, reports = set(), []
    for _ in range(repeats):
        for name, make in makers.items():
            rate, wall_rate, found = feed_once(make, ops)
            cpu[name].append(rate)
            wall[name].append(wall_rate)
            races.add(found)
            took, written = report_once(make, ops)
            seconds[name].append(took)
            if written not in reports:
                reports.append(written)
    if len(races) != 1 or len(reports) != 1:
        raise SystemExit("checker results differ between repeats or between the checkers: they must not")
    found = next(iter(races))
    print(f"{title}: {len(ops):,} ops, 4 streams, 1000 buffers, {len(found)} distinct races "
          f"({sum(count for _, count in found):,} occurrences); medians of {repeats} repeats")
    median = statistics.median
    if fast.NativeChecker is None:
        print(f"  feed: Python {median(cpu['Python']):,.0f} ops/s CPU ({median(wall['Python']):,.0f} wall); "
              f"feed + reports {median(seconds['Python']):.3f} s CPU")
        print(f"  {fast.notice()}")
        return
    ratio = [n / p for n, p in zip(cpu["native"], cpu["Python"])]
    print(f"  feed, CPU:  Python {median(cpu['Python']):>11,.0f} ops/s   native {median(cpu['native']):>11,.0f} ops/s"
          f"   {median(ratio):5.1f}x (median of the repeats' ratios; min {min(ratio):.1f}x)")
    wall_ratio = [n / p for n, p in zip(wall["native"], wall["Python"])]
    print(f"  feed, wall: Python {median(wall['Python']):>11,.0f} ops/s   native {median(wall['native']):>11,.0f} ops/s"
          f"   {median(wall_ratio):5.1f}x")
    replay = " (the native one replays the trace into the Python checker once)" if found else ""
    speedup = [p / n for n, p in zip(seconds["native"], seconds["Python"])]
    print(f"  feed + reports, CPU: Python {median(seconds['Python']):.3f} s   native {median(seconds['native']):.3f} s"
          f"   {median(speedup):5.1f}x{replay}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    measure("racy trace", synthetic_trace(args.ops), args.repeats)
    measure("clean trace (each stream its own buffers)", synthetic_trace(args.ops, clean=True), args.repeats)


if __name__ == "__main__":
    main()
