"""Triton kernels under streamcheck.instrument() on the GPU: FlashNorm's bug written in Triton
(a `@triton.jit` producer on torch stream A writes a tensor, a Triton consumer on stream B reads
it with no wait) is reported as a RAW race naming both kernels; its fixed twin (B waits on an
event recorded after the producer) reports nothing; a delay aimed at the producer makes the
consumer read the previous step's value; a kernel whose pointer arguments the analysis cannot
follow is recorded as writing them, with the notice; autotuned kernels are recorded too.
Written against torch's public stream API, as a user writes it.

    pytest -m gpu tests/streamcheck/record/adapters/test_triton_gpu.py
"""
from __future__ import annotations

import importlib.util

import pytest


def _missing() -> str:
    """Why these tests cannot run here ("" if they can). Checked without importing torch when
    triton is absent (CI)."""
    if importlib.util.find_spec("triton") is None:
        return "needs triton (pip install triton)"
    if importlib.util.find_spec("torch") is None:
        return "needs torch with CUDA (Triton launches on torch's current stream)"
    import torch

    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU and a CUDA build of torch (torch.cuda.is_available() is False)"
    return ""


_WHY = _missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_WHY), reason=_WHY)]

if not _WHY:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def produce(y_ptr, value, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.zeros((BLOCK,), tl.float32) + value, mask=offs < n)

    @triton.jit
    def consume(x_ptr, z_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    @triton.jit
    def _copy_block(src, dst, mask):
        tl.store(dst, tl.load(src, mask=mask), mask=mask)

    @triton.jit
    def map_blocks(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
        # FN comes in as an argument: the analysis cannot read what it does with the pointers
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        FN(x_ptr + offs, out_ptr + offs, offs < n)

    @triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"])
    @triton.jit
    def tuned_copy(x_ptr, z_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

STEPS = 10
N = 1 << 16
BLOCK_SIZE = 1024
DELAY_US = 2000.0


def _produce_and_consume(fixed: bool, **delay):
    """Each step: stream A fills y with the step number (Triton `produce`), stream B copies y into
    z (Triton `consume`), waiting for A only when `fixed`; then the device is synchronized and z
    read on the host. Returns (z[0] per step, session)."""
    import streamcheck

    grid = (triton.cdiv(N, BLOCK_SIZE),)
    with streamcheck.instrument(**delay) as session:
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        y = torch.zeros(N, device="cuda")
        z = torch.zeros(N, device="cuda")
        produce[grid](y, 0.0, N, BLOCK=BLOCK_SIZE)  # compile and load both first: loading synchronizes
        consume[grid](y, z, N, BLOCK=BLOCK_SIZE)
        torch.cuda.synchronize()
        seen = []
        for step in range(1, STEPS + 1):
            with torch.cuda.stream(a):
                produce[grid](y, float(step), N, BLOCK=BLOCK_SIZE)
            done = torch.cuda.Event()
            done.record(a)
            with torch.cuda.stream(b):
                if fixed:
                    b.wait_event(done)
                consume[grid](y, z, N, BLOCK=BLOCK_SIZE)
            torch.cuda.synchronize()
            seen.append(z[0].item())
    return seen, session


def test_a_triton_consumer_that_does_not_wait_for_the_triton_producer_is_a_raw_race():
    seen, session = _produce_and_consume(fixed=False)
    assert len(seen) == STEPS
    races = [r for r in session.races if r.kind == "RAW" and r.first.name == "produce" and
             r.second.name == "consume"]
    assert races, session.report()
    assert "`produce` writes" in races[0].format() and "`consume` reads" in races[0].format()
    assert session.errors == [], session.errors


def test_the_fixed_twin_waits_on_an_event_after_the_producer_and_is_clean():
    seen, session = _produce_and_consume(fixed=True)
    assert seen == [float(step) for step in range(1, STEPS + 1)]
    assert session.races == [], session.report()
    assert session.errors == [], session.errors


def test_a_delay_on_the_producer_makes_the_consumer_read_the_previous_steps_value():
    seen, session = _produce_and_consume(fixed=False, delay_us=DELAY_US, delay_kernels=("produce",))
    stale = [step for step, value in enumerate(seen, start=1) if value == step - 1]
    assert len(stale) >= STEPS - 2, f"values read per step: {seen}"
    assert session.delays >= STEPS
    assert any(r.kind == "RAW" and r.first.name == "produce" for r in session.races), session.report()


def test_the_same_delay_on_the_fixed_twin_changes_no_value():
    seen, session = _produce_and_consume(fixed=True, delay_us=DELAY_US, delay_kernels=("produce",))
    assert seen == [float(step) for step in range(1, STEPS + 1)]
    assert session.delays >= STEPS and session.races == [], session.report()


def test_a_kernel_analysed_as_undecided_is_recorded_as_writing_with_the_notice():
    import streamcheck
    from streamcheck.core import trace as T

    with streamcheck.instrument() as session:
        x = torch.arange(N, device="cuda", dtype=torch.float32)
        out = torch.zeros(N, device="cuda")
        map_blocks[(triton.cdiv(N, BLOCK_SIZE),)](x, out, N, FN=_copy_block, BLOCK=BLOCK_SIZE)
        torch.cuda.synchronize()
        assert torch.equal(out, x)  # the program's own result, unchanged
        (launch,) = [op for op in session.trace.ops if type(op) is T.Launch and op.name == "map_blocks"]
        assert set(session.ranges([x, out])) <= set(launch.writes)  # both assumed written
    notices = [n for n in session.notices if n.startswith("Triton kernel `map_blocks`: assumed written")]
    assert len(notices) == 1 and "`x_ptr`" in notices[0] and "`FN`, a function given as an argument" in notices[0]
    assert "`map_blocks`: assumed written" in session.report()


def test_autotuned_launches_are_recorded_under_the_kernels_name_and_stay_correct():
    import streamcheck
    from streamcheck.core import trace as T

    with streamcheck.instrument() as session:
        x = torch.randn(N, device="cuda")
        z = torch.zeros(N, device="cuda")
        tuned_copy[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, z, N)  # benchmarks both configs first
        torch.cuda.synchronize()
        assert torch.equal(z, x)
    launches = [op for op in session.trace.ops if type(op) is T.Launch and op.name == "tuned_copy"]
    assert len(launches) >= 3  # at least one benchmark run of each config, then the chosen one
    assert session.races == [] and session.errors == [], session.report()
