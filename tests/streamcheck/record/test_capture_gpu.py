"""CUDA stream capture on the real GPU paths: `streamcheck run` / instrument() and Device("cupy").

GPU tests (marked gpu) run the graph scripts of tests/gpu_programs/ under `streamcheck run`
as users do, and compare a fork/join graph on Device("cupy") with the sim:

    pytest -m gpu tests/streamcheck/record/test_capture_gpu.py

The CPU tests (unmarked) drive the same recording and backend code with stand-ins for
CuPy's streams, runtime and Graph: which graph id a launch gets, what is recorded when
CUDA refuses end_capture, that no spin goes into a capture, the capture-mode mapping.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from streamcheck.record import instrument, recorder
from streamcheck.record.adapters import cupy_graphs
from streamcheck.core import trace as T
from streamcheck.device.backends import cupy_backend, gpu_available
from streamcheck.device.backends.cupy_backend import (
    GRAPH_LAUNCH_NAME,
    CupyBackend,
    capture_mode_of,
    capture_mode_value,
    graph_delay_name,
)
from streamcheck.core.capture import CapturedGraph, CapturedNode, CaptureError
from streamcheck.device import DeviceError
from streamcheck.core.trace import UNKNOWN_SITE, CaptureMode, StreamKind
from tests.paths import GPU_PROGRAMS

NEEDS_GPU = pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU and CuPy (CuPy missing or no CUDA "
                                                           "device)")


def gpu(test):
    return pytest.mark.gpu(NEEDS_GPU(test))


LAUNCHES = 5  # tests/gpu_programs/_graph_common.py: graph launches per script


# --- stand-ins for CuPy (CPU tests) ---------------------------------------------------------

class FakeRuntime:
    """cupy.cuda.runtime as the recording and the backend use it; `capturing` holds the
    pointers of the streams CUDA would say are capturing."""

    streamCaptureModeGlobal, streamCaptureModeThreadLocal, streamCaptureModeRelaxed = 0, 1, 2
    streamNonBlocking = 1

    def __init__(self):
        self.capturing = set()
        self.modes = []
        self.device_syncs = 0

    def streamGetFlags(self, ptr):
        return self.streamNonBlocking

    def streamIsCapturing(self, ptr):
        return ptr in self.capturing

    def deviceSynchronize(self):
        self.device_syncs += 1


class FakeGraph:
    def __init__(self):
        self.launched = []

    def launch(self, stream=None):
        self.launched.append(stream)

    def upload(self, stream=None):
        return "uploaded"


class FakeStream:
    """A CuPy stream: a pointer, the capture methods, and `with stream:`."""

    def __init__(self, runtime, ptr):
        self.runtime = runtime
        self.ptr = ptr

    def begin_capture(self, mode=None):
        self.runtime.modes.append(mode)
        self.runtime.capturing.add(self.ptr)

    def is_capturing(self):
        return self.ptr in self.runtime.capturing

    def end_capture(self):
        self.runtime.capturing.clear()
        return FakeGraph()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeArray:
    """What Session._range reads from a cupy.ndarray: a contiguous float32 vector."""

    def __init__(self, ptr, n):
        self.data = SimpleNamespace(ptr=ptr)
        self.shape, self.strides, self.itemsize, self.size = (n,), (4,), 4, n


@pytest.fixture
def fake_cupy(monkeypatch):
    runtime = FakeRuntime()
    legacy = FakeStream(runtime, 0)
    cupy = types.ModuleType("cupy")
    cupy.ndarray = FakeArray
    cupy.cuda = SimpleNamespace(runtime=runtime, get_current_stream=lambda: legacy)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return runtime


@pytest.fixture
def spins(monkeypatch):
    """Every spin the recording or the backend enqueues: (stream pointer, µs)."""
    seen = []
    spin = SimpleNamespace(enqueue=lambda stream, us: seen.append((stream.ptr, us)))
    monkeypatch.setattr(cupy_backend.SpinDelay, "get", staticmethod(lambda: spin))
    return seen


def session_with(monkeypatch, **options):
    session = instrument.Session(**options)
    monkeypatch.setattr(recorder, "current", session)  # what start() does (activate), minus the patching
    return session


def end_capture(stream, cuda_end_capture):
    """Stream.end_capture as the graphs adapter wraps it: the program gets a recorded graph."""
    return cupy_graphs.wrap_end_capture(lambda _stream: cuda_end_capture())(stream)


def arrays(session, count, n=256):
    out = []
    for i in range(count):
        ptr = 0x10000 * (i + 1)
        session.alloc(ptr, 4 * n)
        out.append(FakeArray(ptr, n))
    return out


def kernel(session, name, stream, reads=(), writes=()):
    session.launch(name, lambda: None, stream=stream, reads=reads, writes=writes)


def fork(session, runtime, src, *dsts):
    event = SimpleNamespace()
    session.event_record(event, src, lambda: None)
    for dst in dsts:
        session.stream_wait(dst, event, lambda d=dst: runtime.capturing.add(d.ptr) if src.ptr in runtime.capturing
                            else None)


def ops_of(session, kind):
    return [op for op in session.trace if isinstance(op, kind)]


# --- CPU: mappings ------------------------------------------------------------------------------

def test_capture_modes_map_to_cupys_runtime_values_and_back():
    rt = FakeRuntime()
    assert [capture_mode_value(m, rt) for m in CaptureMode] == [0, 1, 2]
    assert capture_mode_value("thread-local", rt) == rt.streamCaptureModeThreadLocal
    assert [capture_mode_of(v, rt) for v in (0, 1, 2)] == list(CaptureMode)
    assert capture_mode_of(None, rt) is CaptureMode.RELAXED  # CuPy's default, not CUDA's
    with pytest.raises(ValueError, match="streamCaptureModeGlobal"):
        capture_mode_of(7, rt)
    with pytest.raises(ValueError, match="unknown capture mode"):
        capture_mode_value("strict", rt)


def test_graph_launch_delay_name_matches_a_captured_kernel_or_the_graph_launch():
    names = ("spin_ns", "matmul_like", "post_scale")
    assert graph_delay_name(names, frozenset({"post_scale", "other"})) == "post_scale"
    assert graph_delay_name(names, frozenset({"other"})) == GRAPH_LAUNCH_NAME
    assert graph_delay_name(names, frozenset()) == GRAPH_LAUNCH_NAME


def test_captured_kernel_names_follow_forks_and_stop_at_the_end():
    site = UNKNOWN_SITE
    ops = [
        T.CaptureBegin(0, site, stream=1, graph=1),
        T.EventRecord(0, site, event=7, stream=1),
        T.StreamWait(0, site, stream=2, event=7),  # fork: stream 2 joins
        T.Launch(0, site, stream=2, name="matmul_like"),
        T.EventRecord(0, site, event=7, stream=3),  # re-recorded outside: waiting on it forks nothing
        T.StreamWait(0, site, stream=4, event=7),
        T.Launch(0, site, stream=4, name="outside"),
        T.Launch(0, site, stream=1, name="post_scale"),
        T.Launch(0, site, stream=2, name="matmul_like"),
        T.CaptureEnd(0, site, stream=1, graph=1),
        T.Launch(0, site, stream=1, name="after_the_end"),
    ]
    assert instrument.captured_work(ops, 1)[0] == ("matmul_like", "post_scale")


def test_capture_errors_are_formatted_with_cudas_error_name():
    text = instrument.format_capture_errors([CaptureError("cudaErrorStreamCaptureUnjoined", "end_capture on s1: x")])
    assert text.splitlines()[0].startswith("streamcheck: 1 stream-capture error ")
    assert "capture error cudaErrorStreamCaptureUnjoined\n  end_capture on s1: x" in text
    assert instrument.format_capture_errors([]) == ""


# --- CPU: the recording (instrument.Session) with CuPy stand-ins ---------------------------------

def test_graph_launch_gets_the_graph_id_of_its_capture_and_races_with_an_unwaited_consumer(fake_cupy, monkeypatch):
    rt = fake_cupy
    session = session_with(monkeypatch)
    launcher, consumer = FakeStream(rt, 0x10), FakeStream(rt, 0x20)
    x, y, z = arrays(session, 3)
    first = FakeStream(rt, 0x30)  # an earlier capture: the ids must differ
    session.capture_begin(first, None, lambda: rt.capturing.add(first.ptr))
    session.capture_end(first, lambda: (rt.capturing.clear(), FakeGraph())[1])

    session.capture_begin(launcher, rt.streamCaptureModeGlobal, lambda: rt.capturing.add(launcher.ptr))
    kernel(session, "matmul_like", launcher, reads=(x,), writes=(y,))
    graph = end_capture(launcher, lambda: (rt.capturing.clear(), FakeGraph())[1])
    graph.launch(launcher)
    kernel(session, "copy_values", consumer, reads=(y,), writes=(z,))

    (first_begin, begin), (_, end) = ops_of(session, T.CaptureBegin), ops_of(session, T.CaptureEnd)
    (launch,) = ops_of(session, T.GraphLaunch)
    assert first_begin.mode is CaptureMode.RELAXED and begin.mode is CaptureMode.GLOBAL  # None: CuPy's default
    assert begin.graph == end.graph == launch.graph == graph.graph_id == 2
    assert launch.stream == begin.stream  # launched on the stream that captured it
    assert graph.graph.launched == [launcher]  # CuPy's own Graph.launch ran, with the stream
    assert graph.upload() == "uploaded"  # the rest of Graph is CuPy's
    (race,) = session.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "matmul_like", "copy_values")
    assert race.first.actor.startswith("stream s2") and race.second.actor.startswith("stream s3")
    assert session.capture_errors == [] and session.findings == 1

    session.deactivate()  # the session stopped: a launch is just a launch
    before = len(session.trace)
    graph.launch(consumer)
    assert graph.graph.launched == [launcher, consumer] and len(session.trace) == before


def test_unjoined_fork_is_recorded_explained_and_counted_while_cudas_error_reaches_the_program(fake_cupy,
                                                                                               monkeypatch):
    rt = fake_cupy
    session = session_with(monkeypatch)
    origin, a = FakeStream(rt, 0x10), FakeStream(rt, 0x20)
    x, y, r = arrays(session, 3)
    session.capture_begin(origin, None, lambda: rt.capturing.add(origin.ptr))
    fork(session, rt, origin, a)
    kernel(session, "matmul_like", a, reads=(x,), writes=(y,))
    kernel(session, "rms_like", origin, reads=(x,), writes=(r,))

    def cuda_refuses():
        rt.capturing.clear()  # CUDA ends the capture as it refuses it
        raise RuntimeError("cudaErrorStreamCaptureUnjoined: capture unjoined")

    with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureUnjoined"):
        session.capture_end(origin, cuda_refuses)
    (error,) = session.capture_errors
    assert error.code == "cudaErrorStreamCaptureUnjoined"
    assert "never joined back: stream s2" in str(error) and "`matmul_like`" in str(error)
    assert session.races == [] and session.findings == 1
    assert "capture error cudaErrorStreamCaptureUnjoined" in session.report()
    assert len(ops_of(session, T.CaptureEnd)) == 1
    # The capture is over for CUDA and for the recording: a later launch on A executes.
    kernel(session, "matmul_like", a, reads=(x,), writes=(y,))
    assert session.capture_errors == [error] and session.captures == 0


def test_a_sync_refused_during_capture_is_recorded_so_the_checker_explains_it(fake_cupy, monkeypatch):
    rt = fake_cupy
    session = session_with(monkeypatch)
    origin = FakeStream(rt, 0x10)
    session.capture_begin(origin, None, lambda: rt.capturing.add(origin.ptr))

    def cuda_refuses():
        raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureUnsupported"):
        session.stream_sync(origin, cuda_refuses)
    assert [e.code for e in session.capture_errors] == ["cudaErrorStreamCaptureUnsupported"]
    def cupy_refuses():
        raise RuntimeError("cannot capture on the default (legacy) stream")

    with pytest.raises(RuntimeError, match="legacy"):  # CuPy refuses it itself; the checker says why too
        session.capture_begin(FakeStream(rt, 0), None, cupy_refuses)
    assert [e.code for e in session.capture_errors][-1] == "cudaErrorStreamCaptureUnsupported"


def test_missing_join_inside_a_graph_is_reported_and_no_spin_goes_into_the_capture(fake_cupy, monkeypatch, spins):
    rt = fake_cupy
    session = session_with(monkeypatch, delay_us=100.0, delay_streams=("all",))
    origin, a, b = FakeStream(rt, 0x10), FakeStream(rt, 0x20), FakeStream(rt, 0x30)
    x, y, r, out = arrays(session, 4)
    session.capture_begin(origin, None, lambda: rt.capturing.add(origin.ptr))
    fork(session, rt, origin, a, b)
    kernel(session, "spin_ns", a)
    kernel(session, "matmul_like", a, reads=(x,), writes=(y,))
    kernel(session, "rms_like", b, reads=(x,), writes=(r,))
    fork(session, rt, b, origin)  # join_rms
    kernel(session, "post_scale", origin, reads=(y, r), writes=(out,))  # no join_mm
    fork(session, rt, a, origin)  # A joined back after the post-scale
    graph = end_capture(origin, lambda: (rt.capturing.clear(), FakeGraph())[1])
    assert spins == []  # five launches on capturing streams, none delayed
    kernel(session, "fill_value", origin, writes=(x,))
    graph.launch(origin)
    assert spins == [(origin.ptr, 100.0), (origin.ptr, 100.0)]  # before the fill and before the graph
    assert graph.kernel_names == ("spin_ns", "matmul_like", "rms_like", "post_scale")
    (race,) = session.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "matmul_like", "post_scale")
    assert "inside CUDA graph" in race.missing_edge
    assert "never waited for an event recorded on stream s2" in race.missing_edge
    assert session.capture_errors == []


# --- CPU: the cupy backend of the device API with CuPy stand-ins ------------------------------------

def backend_with(fake_runtime, monkeypatch, policy="delay", **params):
    cupy = sys.modules["cupy"]
    cupy.cuda.runtime = fake_runtime
    device = SimpleNamespace(trace=T.Trace())
    backend = CupyBackend(device, policy=policy, **params)
    streams = {}
    for i, name in enumerate(("O", "A")):
        streams[name] = SimpleNamespace(id=i + 1, name=name, kind=StreamKind.NON_BLOCKING,
                                        handle=FakeStream(fake_runtime, 0x10 * (i + 1)))
    return backend, device, streams


def captured(graph_id, origin, names):
    nodes = tuple(CapturedNode(i, origin, i + 1, {origin: i + 1}, T.Launch(0, UNKNOWN_SITE, stream=origin, name=n))
                  for i, n in enumerate(names))
    return CapturedGraph(graph_id, origin, nodes, UNKNOWN_SITE, UNKNOWN_SITE)


def issue(backend, device, stream, name):
    device.trace.append(T.Launch(0, UNKNOWN_SITE, stream=stream.id, name=name))
    ran = []
    backend.launch(stream, lambda: ran.append(name), (), name, UNKNOWN_SITE)
    assert ran == [name]  # issued to CUDA either way: captured work is captured by CUDA itself


def test_cupy_backend_spins_outside_captures_and_before_graph_launches_only(fake_cupy, monkeypatch, spins):
    backend, device, s = backend_with(fake_cupy, monkeypatch, streams=["O", "A"], delay_us=100)
    issue(backend, device, s["O"], "fill")
    backend.begin_capture(s["O"], 1, CaptureMode.THREAD_LOCAL)
    assert fake_cupy.modes == [fake_cupy.streamCaptureModeThreadLocal]
    fake_cupy.capturing.add(s["A"].handle.ptr)  # A forked into the capture
    issue(backend, device, s["A"], "matmul_like")
    issue(backend, device, s["O"], "post_scale")
    with pytest.raises(DeviceError, match="before begin_capture"):
        backend.alloc(SimpleNamespace(name="late", site=UNKNOWN_SITE), None)
    with pytest.raises(DeviceError, match="cannot capture a host-to-device copy"):
        backend.upload(s["A"], "y[0:4]", np.zeros(4, np.float32), UNKNOWN_SITE)
    handle = backend.end_capture(s["O"], captured(1, 1, ("matmul_like", "post_scale")))
    assert isinstance(handle, FakeGraph) and not fake_cupy.capturing
    device.trace.append(T.GraphLaunch(0, UNKNOWN_SITE, stream=s["A"].id, graph=1))
    backend.launch_graph(handle, s["A"], UNKNOWN_SITE)
    assert handle.launched == [s["A"].handle]
    assert [(stream, us) for _, stream, us in backend.delays] == [("O", 100), ("A", 100)]
    assert [index for index, _, _ in backend.delays] == [0, 3]  # the fill and the GraphLaunch


def test_cupy_backend_delays_a_graph_holding_a_named_kernel(fake_cupy, monkeypatch, spins):
    backend, device, s = backend_with(fake_cupy, monkeypatch, kernels=["matmul_like"], delay_us=50)
    backend.begin_capture(s["O"], 4, "global")
    handle = backend.end_capture(s["O"], captured(4, 1, ("matmul_like",)))
    backend.begin_capture(s["O"], 5, "global")
    other = backend.end_capture(s["O"], captured(5, 1, ("rms_like",)))
    for graph_id, graph in ((4, handle), (5, other)):
        device.trace.append(T.GraphLaunch(0, UNKNOWN_SITE, stream=1, graph=graph_id))
        backend.launch_graph(graph, s["O"], UNKNOWN_SITE)
    assert [index for index, _, _ in backend.delays] == [0]  # only the graph that holds matmul_like


def test_cupy_backend_sequential_never_synchronizes_inside_a_capture(fake_cupy, monkeypatch):
    backend, device, s = backend_with(fake_cupy, monkeypatch, policy="sequential")
    backend.tick()
    backend.begin_capture(s["O"], 1, CaptureMode.GLOBAL)
    backend.tick()  # a device synchronize here would invalidate the capture
    backend.end_capture(s["O"], captured(1, 1, ()))
    backend.tick()
    assert fake_cupy.device_syncs == 2


def test_cupy_backend_refused_end_capture_says_what_to_do_and_abort_ends_cudas_capture(fake_cupy, monkeypatch):
    backend, device, s = backend_with(fake_cupy, monkeypatch, policy="eager")
    backend.begin_capture(s["O"], 1, CaptureMode.GLOBAL)

    def invalidated():
        fake_cupy.capturing.clear()
        raise RuntimeError("cudaErrorStreamCaptureInvalidated: operation failed due to a previous error")

    s["O"].handle.end_capture = invalidated
    with pytest.raises(DeviceError, match="cudaErrorStreamCaptureInvalidated.*mode='relaxed'"):
        backend.end_capture(s["O"], captured(1, 1, ()))
    assert backend._captures == 0
    backend.begin_capture(s["O"], 2, CaptureMode.GLOBAL)  # refused by streamcheck: the device aborts it
    ended = []
    s["O"].handle.end_capture = lambda: (ended.append(True), fake_cupy.capturing.clear())
    backend.abort_capture(s["O"])
    assert ended == [True] and not fake_cupy.capturing and backend._captures == 0
    backend.abort_capture(s["O"])  # nothing open: CUDA is not asked again
    assert ended == [True]


# --- GPU: streamcheck run on the graph scripts ----------------------------------------------------

def streamcheck_run(script, *options):
    cmd = [sys.executable, "-m", "streamcheck.cli", "run", *options, os.path.join(GPU_PROGRAMS, script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def result_of(proc):
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line; stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


@gpu
def test_missing_join_inside_a_graph_is_reported_and_lags_one_launch(tmp_path):
    report = tmp_path / "races.json"
    proc = streamcheck_run("race_graph_missing_join.py", "--error-exitcode", "1", "--report-json", str(report))
    assert proc.returncode == 1, proc.stderr
    (race,) = json.loads(report.read_text())
    assert (race["kind"], race["first"]["name"], race["second"]["name"]) == ("RAW", "matmul_like", "post_scale")
    assert race["buffer"].startswith("cupy array")
    assert race["first"]["actor"].startswith("stream s2") and race["second"]["actor"].startswith("stream s1")
    assert "inside CUDA graph" in race["missing_edge"], race["missing_edge"]
    assert "never waited for an event recorded on stream s2" in race["missing_edge"]
    assert "stream-capture error" not in proc.stderr
    # The graph's own spin makes the race strike: the post-scale reads the previous launch's y.
    result = result_of(proc)
    lagged = [float(2 * (t - 1) * (t + 1)) for t in range(1, LAUNCHES + 1)]
    assert all(o in (e, lag) for o, e, lag in zip(result["observed"], result["expected"], lagged)), result
    assert result["wrong"] >= 1, result


@gpu
def test_fork_join_graph_is_clean_and_right():
    proc = streamcheck_run("ok_graph_fork_join.py", "--error-exitcode", "1")
    assert proc.returncode == 0, proc.stderr
    assert "no races found" in proc.stderr and "stream-capture error" not in proc.stderr
    result = result_of(proc)
    assert result["wrong"] == 0 and result["observed"] == [float(2 * t * (t + 1)) for t in range(1, LAUNCHES + 1)]


@gpu
def test_unjoined_fork_gets_cudas_error_and_streamchecks_explanation():
    proc = streamcheck_run("race_graph_unjoined.py", "--error-exitcode", "7")
    # The program saw CUDA's own error from CuPy, as it would without streamcheck ...
    assert "CUDA refused end_capture: cudaErrorStreamCaptureUnjoined" in proc.stdout, proc.stdout + proc.stderr
    # ... and streamcheck names the stream left unjoined and its last kernel.
    assert "capture error cudaErrorStreamCaptureUnjoined" in proc.stderr, proc.stderr
    explanation = proc.stderr.split("capture error cudaErrorStreamCaptureUnjoined", 1)[1]
    assert "never joined back: stream s2" in explanation and "`matmul_like`" in explanation
    assert "race_graph_unjoined.py" in explanation  # the call sites
    assert proc.returncode == 7, proc.stderr  # a capture error is a finding for --error-exitcode


@gpu
def test_graph_launch_without_wait_is_reported_and_strikes_when_the_launch_stream_is_delayed(tmp_path):
    report = tmp_path / "races.json"
    proc = streamcheck_run("race_graph_launch_no_wait.py", "--error-exitcode", "1", "--report-json", str(report),
                           "--delay-us", "20000", "--delay-stream", "s1")
    assert proc.returncode == 1, proc.stderr
    (race,) = json.loads(report.read_text())
    assert (race["kind"], race["first"]["name"], race["second"]["name"]) == ("RAW", "matmul_like", "copy_values")
    assert race["first"]["actor"].startswith("stream s1") and race["second"]["actor"].startswith("stream s2")
    assert "never waited for an event recorded on stream s1" in race["missing_edge"], race["missing_edge"]
    # A spin before each fill and each graph launch on s1, none captured into the graph.
    assert f"({2 * LAUNCHES} spins)" in proc.stderr, proc.stderr
    result = result_of(proc)
    stale = [float(2 * (t - 1)) for t in range(1, LAUNCHES + 1)]
    assert all(o in (e, s) for o, e, s in zip(result["observed"], result["expected"], stale)), result
    assert result["wrong"] >= 1, result


# --- GPU: Device("cupy") against the sim ----------------------------------------------------------

def _xp(array):
    cupy = sys.modules.get("cupy")
    return cupy.get_array_module(array) if cupy is not None else np


# No temporaries (out= everywhere): a temporary allocated inside a capture would be freed to
# CuPy's pool while the graph still holds its address.
def matmul_like(x, y):
    _xp(x).multiply(x, 2, out=y)


def rms_like(x, r):
    _xp(x).add(x, 1, out=r)


def post_scale(y, r, out):
    _xp(y).multiply(y, r, out=out)


def fill(x, value):
    x.fill(value)


def _fork_join_graph(backend, join_mm=True, **options):
    """The FlashNorm step captured as a graph on the Device API; returns (device, out per launch)."""
    from streamcheck.device import Device

    dev = Device(backend, **options)
    origin, a, b = dev.stream("O"), dev.stream("A"), dev.stream("B")
    x, y, r, out = (dev.alloc((64,), "float32", name=name, fill=0.0) for name in ("x", "y", "r", "out"))

    def step(join_mm):
        fork = origin.record()
        a.wait_event(fork)
        b.wait_event(fork)
        dev.launch(matmul_like, (x, y), stream=a, reads=[x], writes=[y])
        dev.launch(rms_like, (x, r), stream=b, reads=[x], writes=[r])
        if join_mm:
            origin.wait_event(a.record())
        origin.wait_event(b.record())
        dev.launch(post_scale, (y, r, out), stream=origin, reads=[y, r], writes=[out])
        if not join_mm:
            origin.wait_event(a.record())  # joined back only after the post-scale

    if backend == "cupy":
        dev.backend.warm_up()
        step(True)  # eager and correct, once: CuPy loads its kernels outside the (global-mode) capture
        dev.synchronize()
    origin.begin_capture()
    step(join_mm)
    graph = origin.end_capture()
    values = []
    for t in (1, 2, 3):
        dev.launch(fill, (x, float(t)), stream=origin, writes=[x])
        graph.launch(origin)
        values.append(float(dev.get(out, stream=origin)[0]))
    return dev, graph, values


@gpu
def test_device_cupy_fork_join_graph_matches_the_sim_and_injects_no_delay_into_the_capture():
    sim, sim_graph, sim_values = _fork_join_graph("sim")
    dev, graph, values = _fork_join_graph("cupy", policy="delay", streams=["O", "A", "B"], delay_us=200)
    assert values == sim_values == [4.0, 12.0, 24.0]  # 2 t (t + 1)
    assert dev.races == [] and sim.races == []
    assert [n.op.name for n in graph.nodes] == [n.op.name for n in sim_graph.nodes]
    ops = dev.trace.ops
    begin = next(i for i, op in enumerate(ops) if isinstance(op, T.CaptureBegin))
    end = next(i for i, op in enumerate(ops) if isinstance(op, T.CaptureEnd))
    delayed = [index for index, _, _ in dev.backend.delays]
    assert delayed and not [i for i in delayed if begin < i < end], delayed
    assert sum(isinstance(ops[i], T.GraphLaunch) for i in delayed) == 3  # each launch on O was delayed


@gpu
def test_device_cupy_missing_join_in_a_graph_is_reported_like_the_sim():
    for backend in ("sim", "cupy"):
        dev, _, _ = _fork_join_graph(backend, join_mm=False)
        (race,) = dev.races
        assert (race.kind, race.first.name, race.second.name) == ("RAW", "matmul_like", "post_scale"), backend
        assert "inside CUDA graph" in race.missing_edge, (backend, race.missing_edge)


@gpu
def test_device_cupy_unjoined_capture_is_refused_and_the_streams_work_again():
    from streamcheck.device import Device

    dev = Device("cupy")
    origin, a = dev.stream("O"), dev.stream("A")
    x = dev.alloc((64,), "float32", name="x", fill=3.0)
    y = dev.alloc((64,), "float32", name="y", fill=0.0)
    dev.launch(matmul_like, (x, y), stream=a, reads=[x], writes=[y])  # loads the kernel outside the capture
    dev.synchronize()
    origin.begin_capture()
    a.wait_event(origin.record())
    dev.launch(fill, (y, 5.0), stream=a, writes=[y])
    with pytest.raises(CaptureError) as refused:
        origin.end_capture()
    assert refused.value.code == "cudaErrorStreamCaptureUnjoined"
    assert not a.is_capturing and not origin.is_capturing
    # CUDA's capture was ended too: this launch executes instead of going into a dead capture.
    dev.launch(matmul_like, (x, y), stream=a, reads=[x], writes=[y])
    assert float(dev.get(y, stream=a)[0]) == 6.0
