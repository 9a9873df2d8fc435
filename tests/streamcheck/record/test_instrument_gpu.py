"""instrument() on the GPU: a delay aimed at a producer's stream or kernel makes a consumer on
another stream read the stale value, for a RawKernel producer and for library calls
(cupy.matmul through cuBLAS); per-thread default streams are one stream per host thread; the
seed-chosen delay sets follow the sim's rule.

    pytest -m gpu tests/streamcheck/record/test_instrument_gpu.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from streamcheck.device.backends import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU and CuPy (CuPy missing or no "
                                                             "CUDA device)")]

STEPS = 12
N = 512
DELAY_US = 2000.0

_FILL = r"""
extern "C" __global__ void fill_step(float* y, const float v, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
"""


def _produce_and_consume(producer: str, **delay):
    """Each step: stream s1 writes y = step (the producer), stream s2 copies y into z with no
    wait (the consumer), then the device is synchronized. Returns (z values per step, session)."""
    import cupy

    import streamcheck

    with streamcheck.instrument(**delay) as session:
        fill = cupy.RawKernel(_FILL, "fill_step")
        a = cupy.cuda.Stream(non_blocking=True)  # s1
        b = cupy.cuda.Stream(non_blocking=True)  # s2
        eye = cupy.eye(N, dtype=cupy.float32)
        x = cupy.zeros((1, N), dtype=cupy.float32)
        y = cupy.zeros((1, N), dtype=cupy.float32)
        z = cupy.zeros((1, N), dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        seen = []
        for step in range(1, STEPS + 1):
            if producer == "matmul":
                x.set(np.full((1, N), step, dtype=np.float32))  # before the loop's producer, synchronously
                cupy.cuda.Device().synchronize()
                with a:
                    cupy.matmul(x, eye, out=y)
            else:
                with a:
                    fill(((N + 255) // 256,), (256,), (y, np.float32(step), np.int32(N)))
            with b:
                z[...] = y  # no wait for stream a: the race
            cupy.cuda.Device().synchronize()
            seen.append(float(z[0, 0].get()))
    return seen, session


@pytest.mark.parametrize("producer, kernel", [("rawkernel", "fill_step"), ("matmul", "cupy.matmul")])
@pytest.mark.parametrize("target", ["stream", "kernel"])
def test_a_targeted_delay_makes_the_consumer_read_the_stale_value(producer, kernel, target):
    delay = {"delay_us": DELAY_US}
    delay.update(delay_streams=("s1",) if target == "stream" else (), delay_kernels=(kernel,) if target == "kernel"
                 else ())
    seen, session = _produce_and_consume(producer, **delay)
    stale = [step for step, value in enumerate(seen, start=1) if value == step - 1]
    assert len(stale) >= STEPS - 2, f"values read per step: {seen}"  # the previous step's value, not the new one
    assert session.delays >= STEPS
    assert any(r.kind == "RAW" and r.second.name == "ndarray.__setitem__" for r in session.races)
    assert session.errors == []


def test_without_a_delay_the_race_is_reported_whatever_the_values():
    seen, session = _produce_and_consume("rawkernel")
    assert session.delays == 0 and len(seen) == STEPS
    assert any(r.kind == "RAW" for r in session.races)


def test_library_calls_can_be_delayed_by_name():
    import cupy

    import streamcheck

    with streamcheck.instrument(delay_us=50.0, delay_kernels=("cupy.fft.fft", "cupy.linalg.solve", "ndarray.sum")) \
            as session:
        x = cupy.arange(256, dtype=cupy.float32)
        cupy.fft.fft(x)
        cupy.linalg.solve(cupy.eye(4, dtype=cupy.float32) * 2, cupy.ones(4, dtype=cupy.float32))
        x.sum()
        cupy.cuda.Device().synchronize()
    assert session.delays == 3
    assert session.races == [] and session.errors == []


def test_an_external_wrapper_of_a_known_stream_is_the_same_stream():
    import cupy

    import streamcheck
    from streamcheck.record.gpu import external_stream

    with streamcheck.instrument() as session:
        own = cupy.cuda.Stream(non_blocking=True)
        x = cupy.zeros(1024, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()  # the zeros (legacy stream) before the non-blocking stream's work
        with own:
            x += 1  # on the stream CuPy created
        with external_stream(cupy, own.ptr):
            x += 1  # the same cudaStream_t through a wrapper: ordered after the first, no race
        cupy.cuda.Device().synchronize()
    assert session.sid(own) == session.sid(external_stream(cupy, own.ptr))
    assert session.races == [] and session.errors == []


PTDS_PROGRAM = r"""
import os, threading
import cupy
N = 1 << 16
outs = [cupy.zeros(N, dtype=cupy.float32) for _ in range(3)]
cupy.cuda.Device().synchronize()
def work(i):
    s = cupy.cuda.get_current_stream()
    assert s.ptr == cupy.cuda.Stream.ptds.ptr, s
    outs[i] += i + 1
    outs[i].sum()
    s.synchronize()
threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print([float(o[0]) for o in outs])
"""


def test_each_host_thread_gets_its_own_per_thread_default_stream(tmp_path):
    script = tmp_path / "ptds.py"
    script.write_text(PTDS_PROGRAM)
    trace = tmp_path / "trace.json"
    env = dict(os.environ, CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    proc = subprocess.run([sys.executable, "-m", "streamcheck", "run", "--trace-json", str(trace), str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1.0, 2.0, 3.0]"
    ops = json.loads(trace.read_text())
    per_thread = {op["stream"] for op in ops if op["op"] == "StreamCreate" and op["kind"] == "per_thread"}
    launched = {op["stream"] for op in ops if op["op"] == "Launch"}
    # the three workers' streams and the main thread's own (it reads the results): all distinct
    assert len(per_thread & launched) == 4, proc.stderr
    assert "streamcheck: no races found" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr


def test_the_streamcheck_gpu_fixture_fails_a_test_whose_gpu_code_races(pytester):
    pytester.makepyfile(r'''
        import cupy

        def test_racy(streamcheck_gpu):
            a, b = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
            x = cupy.zeros(1 << 16, dtype=cupy.float32)
            cupy.cuda.Device().synchronize()
            with a:
                x.fill(1)
            with b:
                y = x * 2  # no wait for a
            cupy.cuda.Device().synchronize()

        def test_fixed(streamcheck_gpu):
            a, b = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
            x = cupy.zeros(1 << 16, dtype=cupy.float32)
            cupy.cuda.Device().synchronize()
            with a:
                x.fill(1)
            b.wait_event(a.record())
            with b:
                y = x * 2
            cupy.cuda.Device().synchronize()
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--streamcheck-policy=eager")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "streamcheck: the happens-before checker found 1 race in the test's GPU work" in out
    assert "RAW race" in out and "ndarray.fill" in out and "replay: pytest" in out and "test_racy" in out
