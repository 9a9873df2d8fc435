"""Sim backend throughput: simulated device operations per second with trivial kernels.

    python benchmarks/bench_sim.py [--ops N] [--repeats R] [--policy P] [--profile]

A race-free stream program on 4 non-blocking streams and 16 small buffers: launches
that read one buffer and write another, event records and waits between the streams,
and an occasional stream synchronize. Every host call is one operation. Prints
the median operations per second over the repeats (wall clock, and per second of
this process's CPU time, which is what to compare on a shared machine), with the
happens-before checker on and off (target >= 50,000 ops/s).
"""
import argparse
import cProfile
import pstats
import random
import statistics
import time

from streamcheck.device import Device


def noop(*arrays) -> None:
    pass


def program(dev: Device, n_ops: int, seed: int = 0):
    """Set up streams, events and buffers; return the list of `n_ops` device calls to
    issue (the random choices are made here, outside the timed loop). Race free: each
    stream writes only its own buffers and reads its own or the read-only inputs."""
    rng = random.Random(seed)
    streams = [dev.stream(f"s{i}") for i in range(4)]
    events = [dev.event(f"e{i}") for i in range(4)]
    inputs = [dev.alloc((4,), "float32", name=f"in{i}", fill=1.0) for i in range(4)]
    owned = [[dev.alloc((4,), "float32", name=f"b{i}.{k}", fill=0.0) for k in range(3)] for i in range(4)]
    calls = []
    while len(calls) < n_ops - 1:
        i = rng.randrange(4)
        s = streams[i]
        r = rng.random()
        if r < 0.1:
            calls.append((events[i].record, (s,), {}))
        elif r < 0.2:
            calls.append((s.wait_event, (events[rng.randrange(4)],), {}))
        elif r < 0.21:
            calls.append((s.synchronize, (), {}))
        else:
            mine = owned[i]
            src = inputs[rng.randrange(4)] if r < 0.6 else mine[rng.randrange(3)]
            dst = mine[rng.randrange(3)]
            calls.append((dev.launch, (noop, (src, dst)), {"stream": s, "reads": [src], "writes": [dst]}))
    calls.append((dev.synchronize, (), {}))
    return calls


def measure(n_ops: int, check: bool, policy: str, seed: int) -> tuple:
    """(wall-clock ops/s, CPU-time ops/s) for one run. On a shared machine the CPU-time
    rate is the one to compare: wall time counts the other processes' turns too."""
    dev = Device("sim", check=check, policy=policy, seed=seed)
    calls = program(dev, n_ops, seed)
    t0, c0 = time.perf_counter(), time.process_time()
    for call, args, kwargs in calls:
        call(*args, **kwargs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert dev.backend.pending() == 0
    assert not dev.races, dev.report()  # the program is race free; a report is a checker bug
    return len(calls) / wall, len(calls) / max(cpu, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policy", default="random", help="schedule policy (default: random)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one run and exit")
    ap.add_argument("--no-check", action="store_true", help="with --profile: profile with checking off")
    args = ap.parse_args()
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(measure, args.ops, not args.no_check, args.policy, 0)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    for check in (True, False):
        runs = [measure(args.ops, check, args.policy, seed) for seed in range(args.repeats)]
        wall = [w for w, _ in runs]
        cpu = [c for _, c in runs]
        label = "on " if check else "off"
        print(f"sim, policy={args.policy}, checking {label}: {args.ops} ops, 4 streams, 16 buffers, "
              f"{args.repeats} repeats: median {statistics.median(wall):,.0f} ops/s wall-clock "
              f"(min {min(wall):,.0f}, max {max(wall):,.0f}); median {statistics.median(cpu):,.0f} ops/s CPU time")

if __name__ == "__main__":
    main()
