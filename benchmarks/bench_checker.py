"""Checker throughput on a synthetic trace: 100,000 operations, 4 streams, 1,000 buffers.

    python benchmarks/bench_checker.py [--ops N] [--repeats R]
Prints the median operations per second over the repeats (target >= 100,000), by wall
clock and by this process's CPU time (the fairer figure on a machine shared with other
jobs), and checks every repeat found the same races.
"""
import argparse
import random
import statistics
import time

from streamcheck.core.hb import Checker
from streamcheck.core.trace import (Alloc, CallSite, EventCreate, EventRecord, Launch, Range, StreamCreate, StreamKind,
                               StreamSync, StreamWait)


def synthetic_trace(n_ops: int, n_streams: int = 4, n_buffers: int = 1000, seed: int = 0) -> list:
    rng = random.Random(seed)
    site = CallSite("bench.py", 1)
    ops = [StreamCreate(0, site, stream=0, kind=StreamKind.LEGACY)]
    ops += [StreamCreate(0, site, stream=s, kind=StreamKind.NON_BLOCKING, name=f"s{s}") for s in range(1, n_streams + 1)]
    ops += [EventCreate(0, site, event=s) for s in range(1, n_streams + 1)]
    ops += [Alloc(0, site, buffer=b, nbytes=4096) for b in range(n_buffers)]
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
            b1, b2 = rng.randrange(n_buffers), rng.randrange(n_buffers)
            half = rng.choice([(0, 2048), (2048, 4096), (0, 4096)])
            ops.append(Launch(0, CallSite("bench.py", 100 + rng.randrange(50)), stream=s, name="k",
                              reads=(Range(b1, *half),), writes=(Range(b2, *half),)))
    return ops[:n_ops]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ops = synthetic_trace(args.ops)
    wall, cpu, found = [], [], set()
    for _ in range(args.repeats):
        checker = Checker()
        feed = checker.feed
        t0, c0 = time.perf_counter(), time.process_time()
        for op in ops:
            feed(op)
        wall.append(len(ops) / (time.perf_counter() - t0))
        cpu.append(len(ops) / (time.process_time() - c0))
        found.add(tuple((r.key, r.count) for r in checker.races))
    if len(found) != 1:
        raise SystemExit("checker results differ between repeats: it must be deterministic")
    races = len(next(iter(found)))
    print(f"checker: {len(ops)} ops, 4 streams, 1000 buffers: median {statistics.median(wall):,.0f} ops/s wall "
          f"(min {min(wall):,.0f}, max {max(wall):,.0f}), {statistics.median(cpu):,.0f} ops/s CPU; "
          f"{args.repeats} repeats; {races} distinct races")

if __name__ == "__main__":
    main()
