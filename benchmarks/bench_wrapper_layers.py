"""What torch's Python layers cost an operator by themselves, on this machine's CPU torch: the floor under
the emulation (streamcheck/emulation), whose operators pass through the same layers before any of its own
work. Each mode runs the emulation benchmark's one-stream loop (`a * b + 1.0`, `relu(c - 3.0)` on 16
floats) on bare wrapper subclasses that only unwrap, run the operator on the CPU tensors inside and wrap the
result (no recording, no allocator, no checker):

    python benchmarks/bench_wrapper_layers.py [--steps 5000] [--repeats 5]

- plain: CPU tensors;
- subclass, default __torch_function__: a wrapper subclass with torch's own __torch_function__ (Python,
  wrapping each result again);
- subclass, __torch_function__ off: its __torch_dispatch__ alone (torch._C._disabled_torch_function_impl);
- function mode + subclass: a TorchFunctionMode that runs each call with subclass dispatch off, over the
  subclass without __torch_function__: the emulation's structure (factory_mode.py, tensors.py).

CPU µs an operator, median of the repeats, the modes taking turns. A tight loop: in the emulation the
same layers run between its own Python, which evicts their code and data from the caches, so they cost
more there than here.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.overrides import TorchFunctionMode


class Wrapped(torch.Tensor):
    """A tensor that only holds a CPU tensor and runs each operator on it."""

    @staticmethod
    def __new__(cls, inner):
        t = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                device=inner.device)
        t.inner = inner
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*[a.inner if isinstance(a, Wrapped) else a for a in args], **(kwargs or {}))
        return cls(out) if isinstance(out, torch.Tensor) else out


class WrappedNoFunction(Wrapped):
    __torch_function__ = torch._C._disabled_torch_function_impl


class SubclassDispatchOff(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def per_op_us(a, b, steps: int) -> float:
    start = time.process_time()
    for _ in range(steps):
        c = a * b + 1.0
        a = torch.relu(c - 3.0)
    return (time.process_time() - start) / (4 * steps) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    x, y = torch.ones(16), torch.full((16,), 2.0)

    def function_mode(steps):
        with SubclassDispatchOff():
            return per_op_us(WrappedNoFunction(x), WrappedNoFunction(y), steps)
    modes = {
        "plain": lambda steps: per_op_us(x, y, steps),
        "subclass, default __torch_function__": lambda steps: per_op_us(Wrapped(x), Wrapped(y), steps),
        "subclass, __torch_function__ off": lambda steps: per_op_us(WrappedNoFunction(x), WrappedNoFunction(y),
                                                                    steps),
        "function mode + subclass": function_mode,
    }
    for run in modes.values():  # warm-up
        run(200)
    times: dict = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, run in modes.items():
            times[name].append(run(args.steps))
    print(f"torch {torch.__version__}: CPU µs an operator, median of {args.repeats} x {4 * args.steps} operators")
    for name, values in times.items():
        print(f"  {name:<40}{statistics.median(values):8.2f}")


if __name__ == "__main__":
    main()
