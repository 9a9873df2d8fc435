"""Checker throughput on synthetic traces of 100,000 operations; the Python checker (hb.Checker, the
reference) and the native one (core/fast.py) side by side.

    python benchmarks/bench_checker.py [--ops N] [--repeats R]
Prints, for each checker, the median operations per second over the repeats of feeding the trace
(target >= 100,000 for the Python checker, >= 5x that for the native one), by this process's CPU time
(the fairer figure on a machine shared with other jobs) and by wall clock, and their ratio; then the
CPU seconds of feeding the trace and reading its reports (races and hazards), where a racy trace costs
the native checker a replay into the Python checker up to the first occurrence of its last new race.
Three traces: a random racy one (4 streams share 1,000 buffers without waits: thousands of distinct
races, new ones to the end), its clean twin (each stream keeps to its own buffers), and a decode-like
loop with one missing wait (one race, found again every step). Checks every repeat found the same
races, and both checkers the same reports.
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


def loop_trace(n_ops: int) -> list:
    """A decode-like loop on two streams: each step, stream 1 runs a chain of kernels into an
    activation, stream 2 reads it without waiting for the event stream 1 recorded (the one race,
    at the same two sites every step), then stream 1 waits for stream 2's event before the next
    step; the host synchronizes every 16 steps."""
    site = CallSite("loop.py", 1)
    ops = [StreamCreate(0, site, stream=0, kind=StreamKind.LEGACY)]
    ops += [StreamCreate(0, site, stream=s, kind=StreamKind.NON_BLOCKING, name=f"s{s}") for s in (1, 2)]
    ops += [EventCreate(0, site, event=e) for e in (1, 2)]
    ops += [Alloc(0, site, buffer=b, nbytes=4096) for b in range(17)]  # 16: the sampled tokens
    at = {line: CallSite("loop.py", line) for line in (*range(100, 108), 120, 130, 131, 132, 140)}  # one per line,
    step = 0  # as a recording keeps one CallSite per call path
    while len(ops) < n_ops:
        for k in range(8):  # weights 8..15 read, activations 0..7 written in a chain
            ops.append(Launch(0, at[100 + k], stream=1, name=f"layer{k}",
                              reads=(Range(8 + k, 0, 4096), Range(k - 1 if k else 7, 0, 4096)),
                              writes=(Range(k, 0, 4096),)))
        ops.append(EventRecord(0, at[120], event=1, stream=1))
        ops.append(Launch(0, at[130], stream=2, name="sample",  # the missing wait on event 1
                          reads=(Range(7, 0, 4096),), writes=(Range(16, 0, 64),)))
        ops.append(EventRecord(0, at[131], event=2, stream=2))
        ops.append(StreamWait(0, at[132], stream=1, event=2))
        step += 1
        if step % 16 == 0:
            ops.append(StreamSync(0, at[140], stream=1))
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
    took = time.process_time() - c0
    return took, [r.to_dict() for r in races] + [h.to_dict() for h in hazards], getattr(checker, "replayed", 0)


def measure(title: str, ops, repeats: int) -> None:
    """Each repeat runs every checker once, one after the other, so a change of load hits both alike."""
    makers = {"Python": Checker} if fast.NativeChecker is None else {"Python": Checker, "native": fast.NativeChecker}
    cpu, wall, seconds = ({name: [] for name in makers} for _ in range(3))
    races, reports, replayed = set(), [], 0
    for _ in range(repeats):
        for name, make in makers.items():
            rate, wall_rate, found = feed_once(make, ops)
            cpu[name].append(rate)
            wall[name].append(wall_rate)
            races.add(found)
            took, written, replays = report_once(make, ops)
            replayed = max(replayed, replays)
            seconds[name].append(took)
            if written not in reports:
                reports.append(written)
    if len(races) != 1 or len(reports) != 1:
        raise SystemExit("checker results differ between repeats or between the checkers: they must not")
    found = next(iter(races))
    print(f"{title}: {len(ops):,} ops, {len(found)} distinct races "
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
    replay = f" (the native one replayed {replayed:,} operations into the Python checker)" if found else ""
    speedup = [p / n for n, p in zip(seconds["native"], seconds["Python"])]
    print(f"  feed + reports, CPU: Python {median(seconds['Python']):.3f} s   native {median(seconds['native']):.3f} s"
          f"   {median(speedup):5.1f}x{replay}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    measure("racy trace (4 streams, 1,000 buffers)", synthetic_trace(args.ops), args.repeats)
    measure("clean trace (each stream its own buffers)", synthetic_trace(args.ops, clean=True), args.repeats)
    measure("racy loop (one missing wait, found every step)", loop_trace(args.ops), args.repeats)


if __name__ == "__main__":
    main()
