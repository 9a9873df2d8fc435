"""The cupy backend and `streamcheck run` on a real GPU.

Every classic stream bug in tests/gpu_programs/race_*.py must be reported by
`streamcheck run` (as a subprocess, the way users run it) and, under an injected
delay on the stream named, must really produce wrong values; none of the correct
twins (ok_*.py) may be reported or go wrong under the same delay. The Device("cupy")
backend is tested directly with the consumer-reads-stale pattern.

    pytest -m gpu tests/streamcheck/device/backends/test_cupy_backend_gpu.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from streamcheck.device.backends import gpu_available
from tests.paths import GPU_PROGRAMS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU and CuPy (CuPy missing or no CUDA device)"),
]

DELAY_US = 20_000  # long enough that the delayed stream loses every race, far below the 50 ms cap


def streamcheck_run(script: str, *options: str, args=()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "streamcheck.cli", "run", *options, os.path.join(GPU_PROGRAMS, script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line; stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


# script, stream to delay, race kind, words the report must contain
RACY = [
    ("race_missing_wait.py", "s1", "RAW", "never waited for an event recorded on stream s1"),
    ("race_wait_before_record.py", "s1", "RAW", "a wait on a never-recorded event is a no-op"),
    ("race_record_before_producer.py", "s1", "RAW", "a wait only covers work recorded at that time"),
    ("race_nonblocking_legacy_join.py", "s1", "RAW", "non-blocking stream never synchronizes with the legacy"),
    ("race_war_reused_buffer.py", "s2", "WAR", "never waited for an event recorded on stream s2"),
    ("race_host_read_no_sync.py", "s1", "RAW", "`copy D2H` reads"),
    ("race_overlapping_slices.py", "s1", "WAW", "bytes [1600, 2400)"),
    ("race_h2d_copy_reader.py", "s1", "RAW", "`copy H2D` writes"),
    ("race_two_threads.py", "s1", "WAW", "`add_value` writes"),
]

# correct twin, stream delayed (the one whose delay breaks the racy version)
CORRECT = [
    ("ok_explicit_wait.py", "s1"),
    ("ok_blocking_legacy_join.py", "s1"),
    ("ok_transitive_chain.py", "s1"),
    ("ok_war_waited.py", "s2"),
    ("ok_host_sync.py", "s1"),
    ("ok_concurrent_reads.py", "s1"),
    ("ok_disjoint_slices.py", "s1"),
    ("ok_h2d_copy_waited.py", "s1"),
    ("ok_two_threads_joined.py", "s1"),
]


@pytest.mark.parametrize("script, stream, kind, words", RACY, ids=[r[0] for r in RACY])
def test_classic_bug_is_reported_and_strikes_under_delay(script, stream, kind, words):
    proc = streamcheck_run(script, "--error-exitcode", "1", "--delay-us", str(DELAY_US), "--delay-stream", stream)
    assert proc.returncode == 1, proc.stderr
    assert f"{kind} race on" in proc.stderr, proc.stderr
    assert words in proc.stderr, proc.stderr
    result = result_of(proc)
    assert result["wrong"] >= 1, f"{script}: the delayed race did not strike: {result}\n{proc.stderr}"


@pytest.mark.parametrize("script, stream", CORRECT, ids=[c[0] for c in CORRECT])
def test_correct_twin_is_clean_and_right_under_delay(script, stream):
    proc = streamcheck_run(script, "--error-exitcode", "1", "--delay-us", str(DELAY_US), "--delay-stream", stream)
    assert "no races found" in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    result = result_of(proc)
    assert result["wrong"] == 0, result
    assert result["observed"] == result["expected"]


def test_race_is_reported_without_delay_whether_or_not_it_strikes():
    proc = streamcheck_run("race_missing_wait.py", "--error-exitcode", "3")
    assert proc.returncode == 3, proc.stderr
    assert "RAW race on" in proc.stderr
    assert "rerun with delays: streamcheck run --delay-us" in proc.stderr


def test_script_that_raises_gets_its_traceback_status_and_the_race_report():
    proc = streamcheck_run("raises_after_race.py")
    assert proc.returncode == 1  # Python's status for an uncaught exception
    assert "Traceback (most recent call last)" in proc.stderr
    assert "RuntimeError: boom after the race" in proc.stderr
    assert "RAW race on" in proc.stderr  # found before the error
    assert "FREE race" not in proc.stderr  # the script's arrays outlive the recording
    assert streamcheck_run("raises_after_race.py", "--error-exitcode", "9").returncode == 9


def test_script_status_argv_and_environment_are_kept():
    proc = streamcheck_run("exits_with_status.py", "--error-exitcode", "1", args=("3",))
    assert proc.returncode == 3, proc.stderr
    assert "argv ['3'] STREAMCHECK_RUN 1 name __main__" in proc.stdout
    assert "no races found" in proc.stderr


def test_missing_script_on_a_gpu_machine():
    proc = streamcheck_run("no_such_script.py")
    assert proc.returncode == 2
    assert "can't open file" in proc.stderr


def test_report_and_trace_json(tmp_path):
    report, trace = tmp_path / "races.json", tmp_path / "trace.json"
    proc = streamcheck_run("race_missing_wait.py", "--report-json", str(report), "--trace-json", str(trace))
    assert proc.returncode == 0  # no --error-exitcode: the script's own status
    races = json.loads(report.read_text())
    assert [r["kind"] for r in races] == ["RAW"]
    assert races[0]["first"]["name"] == "fill_value" and races[0]["second"]["name"] == "copy_values"
    ops = [op["op"] for op in json.loads(trace.read_text())]
    assert "Launch" in ops and "StreamCreate" in ops and "ImplicitSync" in ops  # warm-up recorded, no edge


# --- torch interop ------------------------------------------------------------------------

def test_cupy_kernel_on_torch_memory_is_checked():
    pytest.importorskip("torch")
    proc = streamcheck_run("race_torch_interop.py", "--error-exitcode", "1", "--delay-us", str(DELAY_US),
                           "--delay-stream", "torch")
    assert proc.returncode == 1, proc.stderr
    # The tensor's block, as torch's allocator reported it: the CuPy view is the same buffer.
    assert "RAW race on `torch tensor #" in proc.stderr, proc.stderr
    assert "(0 spins)" not in proc.stderr  # `--delay-stream torch` found torch's stream
    assert result_of(proc)["wrong"] >= 1


def test_cupy_kernel_on_torch_memory_with_the_wait_is_clean():
    pytest.importorskip("torch")
    proc = streamcheck_run("ok_torch_interop.py", "--error-exitcode", "1", "--delay-us", str(DELAY_US),
                           "--delay-stream", "torch")
    assert proc.returncode == 0, proc.stderr
    assert "no races found" in proc.stderr
    assert result_of(proc)["wrong"] == 0


# --- instrument() in process --------------------------------------------------------------

def test_instrument_context_sees_operators_matmul_and_declared_accesses():
    import cupy

    import streamcheck

    add_before = vars(cupy.ndarray).get("__add__")
    with streamcheck.instrument() as session:
        a = cupy.cuda.Stream(non_blocking=True)
        b = cupy.cuda.Stream(non_blocking=True)
        x = cupy.ones((64, 64), dtype=cupy.float32)
        w = cupy.ones((64, 64), dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        with a:
            y = cupy.matmul(x, w)  # allocates y on a
        with b:
            z = y + 1.0  # operator on b reads y: no wait
        streamcheck.declare_access(reads=[z], stream=a, name="torch op on z")  # unseen work, declared
        cupy.cuda.Device().synchronize()
    races = session.races
    pairs = {(r.kind, r.first.name, r.second.name) for r in races}
    assert ("RAW", "cupy.matmul", "ndarray.__add__") in pairs, session.report()
    assert ("RAW", "ndarray.__add__", "torch op on z") in pairs, session.report()
    assert not streamcheck.instrument.active()
    assert vars(cupy.ndarray).get("__add__") is add_before  # patches undone


def test_instrument_const_pointers_are_reads_and_declare_kernel_overrides():
    import cupy

    import streamcheck

    code = r'''
    extern "C" __global__ void reads_only(const float* x, float* out) { out[threadIdx.x] = x[threadIdx.x]; }
    extern "C" __global__ void looks_written(float* x, float* out) { out[threadIdx.x] = x[threadIdx.x]; }
    '''
    def run(kernel_name):
        with streamcheck.instrument() as session:
            kernel = cupy.RawKernel(code, kernel_name)
            a = cupy.cuda.Stream(non_blocking=True)
            b = cupy.cuda.Stream(non_blocking=True)
            x = cupy.ones(32, dtype=cupy.float32)
            o1, o2 = cupy.empty_like(x), cupy.empty_like(x)
            cupy.cuda.Device().synchronize()
            with a:
                kernel((1,), (32,), (x, o1))
            with b:
                kernel((1,), (32,), (x, o2))
            cupy.cuda.Device().synchronize()
        return session.races

    assert run("reads_only") == []  # concurrent reads through const pointers
    assert [r.kind for r in run("looks_written")] == ["WAW"]  # non-const: may be written
    streamcheck.declare_kernel("looks_written", reads=(0,), writes=(1,))
    try:
        assert run("looks_written") == []
    finally:
        from streamcheck.record.kernel_access import forget_declaration

        forget_declaration("looks_written")


@pytest.mark.parametrize("reused", [True, False], ids=["reused", "not-reused"])
def test_elementwise_kernel_and_free_while_in_use(reused):
    import cupy

    import streamcheck

    with streamcheck.instrument() as session:
        double = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2", "sc_double")
        a = cupy.cuda.Stream(non_blocking=True)
        b = cupy.cuda.Stream(non_blocking=True)
        with a:
            x = cupy.arange(1024, dtype=cupy.float32)  # on a
        a.synchronize()
        with b:
            y = double(x)  # reads x on b
        del x  # freed on a (its allocation stream) while b may still read it
        if reused:
            with a:
                z = cupy.zeros(1024, dtype=cupy.float32)  # CuPy's pool hands it x's block, on a
        b.synchronize()
        del y
    races = [(r.kind, r.first.name, r.second.name) for r in session.races]
    hazards = [(h.race.first.name, h.race.second.name) for h in session.hazards]
    if reused:  # a race: the new owner's fill may land before `sc_double` read x
        assert ("FREE", "sc_double", "free") in races, session.report()
        assert z.get().tolist() == [0.0] * 1024
    else:  # no allocation got the bytes: a hazard line, not a race (--strict-free makes it one)
        assert races == [] and hazards == [("sc_double", "free")], session.report()


# --- the Device("cupy") backend -----------------------------------------------------------

def _stale_read_program(policy: str, wait: bool, **params):
    from streamcheck.device import Device

    dev = Device("cupy", policy=policy, **params)
    dev.backend.warm_up()
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((256,), "float32", name="x", fill=0.0)
    y = dev.alloc((256,), "float32", name="y", fill=0.0)

    def produce(x, value):
        x.fill(value)

    def consume(x, y):
        y[...] = x

    seen = []
    for step in range(1, 4):
        dev.launch(produce, (x, float(step)), stream=a, writes=[x])
        if wait:
            b.wait_event(a.record())
        dev.launch(consume, (x, y), stream=b, reads=[x], writes=[y])
        dev.synchronize()
        seen.append(float(dev.host_read(y)[0]))
    return dev, seen


def test_device_cupy_consumer_reads_stale_value_under_spin_delay():
    dev, seen = _stale_read_program("delay", wait=False, streams=["A"], delay_us=DELAY_US)
    assert seen != [1.0, 2.0, 3.0]  # the delayed producer lost: B copied the previous value
    assert [r.kind for r in dev.races] == ["RAW"]
    assert "stream B never waited for an event recorded on stream A" in dev.report()
    assert [name for _, name, _ in dev.backend.delays] == ["A", "A", "A"]


def test_device_cupy_with_the_wait_is_right_and_clean_under_delay():
    dev, seen = _stale_read_program("delay", wait=True, streams=["A"], delay_us=DELAY_US)
    assert seen == [1.0, 2.0, 3.0]
    assert dev.races == []


def test_device_cupy_sequential_policy_is_right_and_still_reports():
    dev, seen = _stale_read_program("sequential", wait=False)
    assert seen == [1.0, 2.0, 3.0]  # synchronized after every op: the reference
    assert [r.kind for r in dev.races] == ["RAW"]  # the checker needs no timing


def test_device_cupy_launch_contract():
    import cupy

    from streamcheck.device import Device

    dev = Device("cupy")
    s = dev.stream("S")
    buf = dev.alloc((8, 4), "float32", name="buf", fill=1.0)
    calls = []

    def kernel(rows, scale):
        calls.append((cupy.cuda.get_current_stream().ptr, type(rows), rows.shape, rows.data.ptr, scale))
        rows *= scale  # a CuPy op: goes to the current stream

    dev.launch(kernel, (buf[2:5], 3.0), stream=s, writes=[buf[2:5]])
    assert len(calls) == 1  # called on the host, immediately
    ptr, kind, shape, data_ptr, scale = calls[0]
    assert ptr == s.handle.ptr and kind is cupy.ndarray and shape == (3, 4) and scale == 3.0
    assert data_ptr == buf.storage.data.ptr + 2 * 4 * 4  # a view of the buffer, not a copy
    s.synchronize()
    host = dev.host_read(buf)
    assert host[:, 0].tolist() == [1, 1, 3, 3, 3, 1, 1, 1]


def test_device_cupy_timing_shows_the_spin():
    from streamcheck.device import Device

    dev = Device("cupy", policy="delay", streams=["A"], delay_us=5_000, timing=True)
    dev.backend.warm_up()
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((16,), "float32", fill=0.0)
    y = dev.alloc((16,), "float32", fill=0.0)
    dev.launch(lambda y: y.fill(1.0), (y,), stream=b, writes=[y], name="on_b")
    dev.launch(lambda x: x.fill(1.0), (x,), stream=a, writes=[x], name="on_a")
    times = dev.backend.op_times
    index = {op.name: i for i, op in enumerate(dev.trace.ops) if type(op).__name__ == "Launch"}
    (b0, b1), (a0, a1) = times[index["on_b"]], times[index["on_a"]]
    assert b0 <= b1 and a0 <= a1
    assert a0 - b0 >= 4_000  # A's launch started only after its 5 ms spin


def test_spin_is_calibrated_and_capped():
    from streamcheck.device.backends.cupy_backend import MAX_DELAY_US, SpinDelay

    spin = SpinDelay.get()
    spin.measure(100)  # first launch out of the way
    assert 1_800 <= spin.measure(2_000) <= 3_000
    # Clamped, so nothing can hang: asked for 10x the cap, it spins about the cap (the H200 gave 50,000 µs,
    # an H100 52,995 µs on 2026-12-06: its clock under a long spin is not the rated one).
    assert spin.measure(10 * MAX_DELAY_US) <= MAX_DELAY_US * 1.10


def test_random_policy_priorities_are_seeded():
    from streamcheck.device import Device

    def priorities(seed):
        dev = Device("cupy", policy="random", seed=seed)
        return [dev.stream(f"s{i}").handle.priority for i in range(6)]

    assert priorities(5) == priorities(5)
    assert len(set(priorities(5) + priorities(6))) > 1


def test_warm_up_is_recorded_as_implicit_sync_not_as_an_edge():
    from streamcheck.device import Device

    dev = Device("cupy")
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((4,), "float32", fill=0.0)
    dev.launch(lambda x: x.fill(1.0), (x,), stream=a, writes=[x])
    reasons = dev.backend.warm_up()  # synchronizes the device in fact, promises nothing
    dev.launch(lambda x: x.sum(), (x,), stream=b, reads=[x])
    kinds = [type(op).__name__ for op in dev.trace.ops]
    assert kinds.count("ImplicitSync") >= len(reasons) >= 2
    assert [r.kind for r in dev.races] == ["RAW"]


def test_bad_policy_parameters_fail_early():
    from streamcheck.device import Device
    from streamcheck.core.schedule import ScheduleError

    with pytest.raises(ScheduleError, match="delay_us must be"):
        Device("cupy", policy="delay", delay_us=10 ** 6)
    with pytest.raises(ScheduleError, match="replay strings"):
        Device("cupy", policy="replay:1.h")
    with pytest.raises(ScheduleError, match="unknown parameters"):
        Device("cupy", policy="delay", delay_steps=3)


def test_host_write_and_download_round_trip():
    from streamcheck.device import Device

    dev = Device("cupy")
    s = dev.stream("S")
    buf = dev.alloc((4, 2), "float32", fill=0.0)
    dev.host_write(buf[1:3], 5.0)
    out = dev.download(buf, stream=s)
    s.synchronize()
    assert np.asarray(out)[:, 0].tolist() == [0.0, 5.0, 5.0, 0.0]
    assert dev.races == []
