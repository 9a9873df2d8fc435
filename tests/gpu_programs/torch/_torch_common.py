"""Shared by the PyTorch bug programs in this folder: their sizes, the reads that check the
result, and the result line tests/streamcheck/record/adapters/test_torch_programs_gpu.py parses.

Each program repeats its pattern for STEPS steps (first launches, allocator growth and lazy
module loading synchronize implicitly, so a single shot may never strike) on buffers of N
float32 (4 MiB: copies and kernels long enough, and steps close enough, that a 2 ms spin on
one stream makes the race strike), and ends with `report(observed, expected)`, which prints
one line

    RESULT {"observed": [...], "expected": [...], "wrong": <values that differ or are missing>}

where `expected` is what a correctly synchronized run gives. The program exits 0: the exit
status belongs to `streamcheck run --error-exitcode`.

The reads here synchronize the whole device first: the check itself must not race. Every
access that belongs to a bug is written out in the program itself, never here, so that a race
report's call sites point into the program. torch and CuPy are imported only by the helper
that needs them, so a CuPy-only program stays CuPy-only.
"""
import json
import os

N = 1 << 20  # float32 elements per buffer: 4 MiB
STEPS = 8


COMPILE = "STREAMCHECK_PROGRAMS_COMPILE"  # =1: `compiled` functions go through torch.compile


def compiled(fn):
    """A program's kernels, written as a function: `fn` itself, or with COMPILE=1 in the
    environment `torch.compile(fn)` (whole graph, dynamic scalars: one compile for every step's
    value), so tests/streamcheck/record/adapters/test_compiled_programs_gpu.py checks the same bug in
    Inductor's kernels."""
    if os.environ.get(COMPILE) != "1":
        return fn
    import torch
    import torch._dynamo

    # A step's value is a graph input, not a constant: one compile serves every step (with
    # fullgraph=True a recompile per value would fail at the recompile limit).
    torch._dynamo.config.specialize_float = False
    torch._dynamo.config.recompile_limit = 64  # views at other offsets (a bucket's halves) recompile once each
    return torch.compile(fn, fullgraph=True, dynamic=True)


def column(t, index=0) -> list:
    """t[:, index] of a 2-D torch tensor (CUDA, or pinned host memory that async copies wrote)
    as floats, read after a device-wide synchronize."""
    import torch

    torch.cuda.synchronize()
    return [float(v) for v in t[:, index].tolist()]


def cupy_column(a, index=0) -> list:
    """a[:, index] of a 2-D CuPy array as floats, read after a device-wide synchronize."""
    import cupy

    cupy.cuda.Device().synchronize()
    return [float(v) for v in cupy.asnumpy(a[:, index]).tolist()]


def report(observed, expected) -> None:
    """Print the RESULT line; a value missing from `observed` counts as wrong."""
    wrong = sum(1 for o, e in zip(observed, expected) if o != e) + abs(len(observed) - len(expected))
    print("RESULT " + json.dumps({"observed": observed, "expected": expected, "wrong": wrong}), flush=True)
