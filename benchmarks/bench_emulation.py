"""CUDA emulated on the sim (streamcheck/emulation): how fast unmodified torch code runs there.

    python benchmarks/bench_emulation.py [--ops N] [--repeats R] [--checker-share] [--programs] [--profile]

1. Emulated operators per second on small tensors: loops of elementwise torch operators on
   16-element float32 CUDA tensors, on the default stream, and over two streams with an event and
   a wait_stream per four operators (each operator is one sim launch: dispatch, the meta layout,
   the caching allocator, the checker, the scheduler, the CPU kernel), with the happens-before
   checker on, under the eager policy. Median
   of the repeats, wall clock and per second of this process's CPU time (what to compare on a
   shared machine). Plain CPU torch on the same loop beside it, for the ratio. Targets on a 2-core
   machine: >= 10,000 operators per CPU second (issue 30), >= 20,000 on the two-stream loop (issue 38).
   With --checker-share: each loop again with the checker off, taking turns with it on, and the
   share of the time the happens-before checker takes (what a faster checker can give at most).
2. With --programs: the torch bug programs of tests/gpu_programs/torch/ that the sim emulates,
   each run as its test runs them (the sequential reference, then the header's delay and four
   seeded schedules): seconds per program and in all.
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from streamcheck.device import Device  # noqa: E402
from streamcheck.emulation.torch_cuda import Emulation  # noqa: E402


def one_stream(n_ops: int) -> int:
    """`n_ops` elementwise operators on the default stream; returns how many were issued."""
    a = torch.ones(16, device="cuda")
    b = torch.full((16,), 2.0, device="cuda")
    issued = 2
    while issued < n_ops:
        c = a * b + 1.0
        a = torch.relu(c - 3.0)
        issued += 4
    torch.cuda.synchronize()
    return issued


def loop(n_ops: int) -> int:
    """`n_ops` operators (about) on the current device; returns how many were issued."""
    side = torch.cuda.Stream()
    done = torch.cuda.Event()
    a = torch.ones(16, device="cuda")
    b = torch.full((16,), 2.0, device="cuda")
    issued = 2
    while issued < n_ops:
        c = a * b + 1.0  # two operators on the default stream
        done.record()
        side.wait_event(done)
        with torch.cuda.stream(side):
            a = torch.relu(c - 3.0)  # two on the side stream
        torch.cuda.current_stream().wait_stream(side)
        issued += 4
    torch.cuda.synchronize()
    return issued


def emulated_rate(n_ops: int, program=None, check: bool = True) -> tuple:
    device = Device("sim", policy="eager", check=check)
    with Emulation(device):
        wall, cpu = time.perf_counter(), time.process_time()
        issued = (program or loop)(n_ops)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert not device.races, device.report()
    return issued / wall, issued / cpu


def plain_rate(n_ops: int) -> float:
    a, b = torch.ones(16), torch.full((16,), 2.0)
    wall = time.perf_counter()
    issued = 2
    while issued < n_ops:
        c = a * b + 1.0
        a = torch.relu(c - 3.0)
        issued += 4
    return issued / (time.perf_counter() - wall)


def checker_share(n_ops: int, repeats: int) -> None:
    """Each loop with the checker on and off in turn: the checker's share of the CPU time."""
    for label, program in (("one stream", one_stream), ("two streams", loop)):
        on, off = [], []
        for _ in range(repeats):
            on.append(emulated_rate(n_ops, program)[1])
            off.append(emulated_rate(n_ops, program, check=False)[1])
        with_checker, without = statistics.median(on), statistics.median(off)
        share = 1 - with_checker / without
        print(f"{label}: checker on {with_checker:,.0f}, off {without:,.0f} operators per CPU second: the checker "
              f"takes {share:.0%} of the time ({1e6 / with_checker - 1e6 / without:.0f} of "
              f"{1e6 / with_checker:.0f} µs an operator)")


def programs() -> None:
    from tests.streamcheck.emulation.test_torch_programs_sim import EMULATED, schedules
    from tests.streamcheck.record.adapters.test_torch_programs_gpu import parse_header
    from streamcheck.emulation.script import run_script

    total = 0.0
    for program in EMULATED:
        start = time.perf_counter()
        header = parse_header(program)
        run_script(str(program))
        if header.capture_error is None:
            for policy, seed, params in schedules(header):
                run_script(str(program), policy=policy, seed=seed, check=False, **params)
        took = time.perf_counter() - start
        total += took
        print(f"  {program.name:48s} {took:6.2f} s")
    print(f"{len(EMULATED)} programs, each reference + its schedules: {total:.1f} s in all (one process)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--checker-share", action="store_true")
    parser.add_argument("--programs", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    emulated_rate(400)  # warm-up: torch._dynamo's import, the meta kernels' first calls
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        emulated_rate(args.ops)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        return
    rates = {"one stream": ([], []), "two streams": ([], [])}
    plains = []
    for _ in range(args.repeats):  # the two loops and plain torch in turn, so load hits them alike
        for label, program in (("one stream", one_stream), ("two streams", loop)):
            wall, cpu = emulated_rate(args.ops, program)
            rates[label][0].append(wall)
            rates[label][1].append(cpu)
        plains.append(plain_rate(args.ops))
    for label, (walls, cpus) in rates.items():
        print(f"emulated operators/s, {label} (16 floats, checker on, eager): median {statistics.median(walls):,.0f} "
              f"wall, {statistics.median(cpus):,.0f} per CPU second ({args.repeats} repeats of {args.ops} operators)")
    print(f"plain CPU torch, the one-stream loop: median {statistics.median(plains):,.0f} operators/s "
          f"(the emulation costs {statistics.median(plains) / statistics.median(rates['one stream'][0]):.0f}x)")
    if args.checker_share:
        checker_share(args.ops, args.repeats)
    if args.programs:
        programs()


if __name__ == "__main__":
    main()
