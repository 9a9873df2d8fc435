"""What observing torch's operators costs per operator, on this machine's torch (CPU tensors: the
observation is host work, the same for CUDA tensors), side by side in one process:

    python benchmarks/bench_native_record.py [--steps 2000] [--repeats 7]

- plain: the operators alone;
- python-mode: a TorchDispatchMode that only forwards (what the recorder's Python path pays before
  doing any work of its own);
- rf-noop-local / rf-noop-global: a C++ RecordFunction callback that does nothing, thread-local or
  global, on operators only (RecordScope::FUNCTION);
- rf-record: a thread-local callback that records what the recorder needs (benchmarks/
  native_record_probe.cpp): the operator, each tensor argument's byte span and storage and whether
  the schema writes it, the outputs, the current stream, the calling Python frame (code, offset);
- observer: streamcheck's observer (streamcheck/record/native/observer.cpp) recording into its
  buffer, with stack ids to the user's frame; observer+drain adds the Python drain that turns its
  records into trace records of a recorder (on a stand-in GPU), amortized over each step.

The step is a small decode-like mix of operators on small tensors (in place, out=, fresh outputs, a
view written through, a TensorList, a reduction); each mode runs it `--steps` times per repeat, the
modes interleaved in each repeat. Per-operator cost: (mode - plain) / operators the dispatch mode
sees per step. The C++ is built with streamcheck/native_build.py (g++, cached).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PROBE = HERE / "native_record_probe.cpp"


def make_step(torch):
    x = torch.zeros(64)
    y = torch.ones(64)
    out = torch.empty(64)
    a = torch.randn(8, 8)
    b = torch.randn(8, 8)
    c = torch.empty(8, 8)
    buf = torch.empty(128)
    kept = []

    def step():
        x.add_(1.0)
        torch.mul(x, y, out=out)
        z = x + y
        torch.mm(a, b, out=c)
        x[2:6].fill_(0.5)
        torch.cat([x, y], out=buf)
        r = torch.rsqrt(z.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
        kept[:] = [z, r]
    return step


def operators_per_step(torch, step) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return len(seen)


def python_mode(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Forward(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    return Forward()


class Probe:
    """The probe library's callbacks as context managers."""

    def __init__(self, path):
        self.lib = ctypes.PyDLL(str(path))  # PyDLL: the GIL stays held across the calls

    def mode(self, full: bool, global_: bool):
        lib = self.lib

        class On:
            def __enter__(self):
                lib.probe_clear()
                lib.probe_enable(int(full), int(global_))

            def __exit__(self, *exc):
                lib.probe_disable()
        return On()


def observer_mode(torch, drain: bool):
    """streamcheck's observer on CPU tensors, into a recorder on a stand-in GPU (drained per step when asked)."""
    from streamcheck.record.native import recording as native_recording

    return native_recording.benchmark_context(torch, drain=drain)


def run(step, context, steps: int) -> tuple:
    """(wall, this thread's CPU time) in µs per step of `steps` steps inside `context` (None: plain).
    The CPU time is what the neighbours of a shared machine cannot inflate."""
    if context is None:
        context = contextlib.nullcontext()
    with context:
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            step()
        t1, c1 = time.perf_counter(), time.thread_time()
    return (t1 - t0) / steps * 1e6, (c1 - c0) / steps * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)

    import torch
    from streamcheck import native_build

    probe = Probe(native_build.build(native_build.NativeLibrary("libstreamcheck_probe.so", PROBE, python=True)))
    step = make_step(torch)
    ops = operators_per_step(torch, step)
    modes = {
        "plain": lambda: None,
        "python-mode": lambda: python_mode(torch),
        "rf-noop-local": lambda: probe.mode(full=False, global_=False),
        "rf-noop-global": lambda: probe.mode(full=False, global_=True),
        "rf-record": lambda: probe.mode(full=True, global_=False),
    }
    try:
        from streamcheck.record.native import recording as native_recording  # noqa: F401

        modes["observer"] = lambda: observer_mode(torch, drain=False)
        modes["observer+drain"] = lambda: observer_mode(torch, drain=True)
    except ImportError:
        pass
    for make in modes.values():  # warm-up: builds, caches, first calls
        run(step, make(), 50)
    probe.lib.probe_clear()
    probe.lib.probe_enable(1, 0)
    step()
    probe.lib.probe_disable()
    callbacks, with_gil = probe.lib.probe_records(), probe.lib.probe_with_gil()
    probe.lib.probe_clear()
    times = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, make in modes.items():
            times[name].append(run(step, make(), args.steps))
    wall = {name: statistics.median(w for w, _ in values) for name, values in times.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in times.items()}
    print(f"per-operator cost of observing torch operators: torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; {ops} operators per step as a dispatch mode sees them "
          f"({callbacks} RecordFunction callbacks, {with_gil} of them with the GIL held); {args.steps} steps, median "
          f"of {args.repeats} repeats")
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<16}{'wall µs/step':>13}{'CPU µs/step':>13}{'wall µs/op':>12}{'CPU µs/op':>11}   (over plain)")
    for name in modes:
        print(f"{name:<16}{wall[name]:>13.2f}{cpu[name]:>13.2f}{(wall[name] - wall['plain']) / ops:>12.3f}"
              f"{(cpu[name] - cpu['plain']) / ops:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
