"""Threads running before the recording (streamcheck/record/adapters/threads.py, `add_context`): on
Python >= 3.12 they get torch's dispatch mode at their next Python event, so their operators
are recorded; where they cannot (older Pythons, a thread inside a mode of its own) the
recording names each one, and names it again when it does torch work unseen. On the CPU: CPU
tensors stand in for CUDA tensors (stand_in.CpuStandsInForCuda)."""
from __future__ import annotations

import contextlib
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from streamcheck.record import recorder as R  # noqa: E402
from streamcheck.record.adapters import threads, torch_ops, torch_runtime  # noqa: E402
from streamcheck.record.adapters.patching import Patcher  # noqa: E402
from streamcheck.core import trace as T  # noqa: E402
from tests.streamcheck.record.adapters.stand_in import CpuStandsInForCuda, stand_in_gpu  # noqa: E402

A = 0x10  # torch's current stream (cudaStream_t)
needs_312 = pytest.mark.skipif(not threads.REACHES_RUNNING_THREADS,
                               reason="reaching running threads needs threading.setprofile_all_threads (Python >= "
                                      f"3.12; this is {sys.version_info[0]}.{sys.version_info[1]})")


class Worker:
    """A thread started before the recording: it waits (blocked in C, as a polling thread
    between polls; inside `inside`, a context, if given), then runs `job` once in Python, then
    waits again until told to finish."""

    def __init__(self, job, name="poller", inside=None):
        self.job, self.result = job, {}
        self.inside = inside  # a context the thread is in while it waits and runs `job`
        self.ready, self.go, self.done = threading.Event(), threading.Event(), threading.Event()
        self.again, self.finish = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "the worker thread did not start"

    def _run(self):
        with self.inside if self.inside is not None else contextlib.nullcontext():
            self.ready.set()
            self.go.wait()
            try:
                self.result["value"] = self.job()
            except BaseException as exc:  # shown by the test, not lost in the thread
                self.result["error"] = exc
        self.done.set()
        self.again.wait()
        self.result["modes after stop"] = torch._C._len_torch_dispatch_stack()  # a Python call first
        self.finish.set()

    def run_job(self):
        self.go.set()
        assert self.done.wait(10), "the worker thread did not run its job"
        if "error" in self.result:
            raise self.result["error"]
        return self.result["value"]

    def after_stop(self):
        self.again.set()
        assert self.finish.wait(10)
        self.thread.join(10)
        return self.result["modes after stop"]


@pytest.fixture
def recording(monkeypatch):
    """(rec, start, stop): `start()` adds the CPU stand-in mode as the thread context, as
    torch_ops.install does when a recording starts; `stop()` undoes it, as stop() does."""
    rec = R.Recorder(stand_in_gpu())
    monkeypatch.setattr(R, "current", rec)
    rec.state["torch"] = torch_runtime.TorchState()
    monkeypatch.setattr(torch_ops, "current_stream_ptr", lambda torch, device=None: A)
    monkeypatch.setattr(torch_runtime, "current_stream_ptr", lambda torch, device=None: A)
    rec.register_stream(A, T.UNKNOWN_SITE, fresh=True)
    ops = CpuStandsInForCuda(rec, torch)
    patcher = Patcher(rec.unpatched)

    def start():
        threads.add_context(rec, lambda: torch_ops.make_mode(rec, torch, ops), patcher)

    def stop():
        patcher.restore()
        monkeypatch.setattr(R, "current", None)
    yield rec, start, stop
    patcher.restore()


def launches(rec):
    return [op for op in rec.trace.ops if type(op) is T.Launch]


def notices_naming(rec, thread):
    return [n for n in rec.notices if f"{thread.name!r} (ident {thread.ident})" in n]


def test_without_setprofile_all_threads_each_running_thread_is_named_at_the_start(recording, monkeypatch):
    rec, start, stop = recording
    monkeypatch.setattr(threads, "REACHES_RUNNING_THREADS", False)  # Python < 3.12
    worker = Worker(lambda: None)
    start()
    (notice,) = notices_naming(rec, worker.thread)
    assert "was running before the recording started: its torch operators are not recorded" in notice
    assert "start the thread inside the recording" in notice and "streamcheck run" in notice
    assert not any(threading.current_thread().name in n for n in rec.notices)  # the recording thread sees its own
    worker.run_job()
    stop()
    assert worker.after_stop() == 0


def test_a_thread_never_reached_that_allocates_is_named_with_its_unseen_work(recording, monkeypatch):
    rec, start, stop = recording
    monkeypatch.setattr(threads, "REACHES_RUNNING_THREADS", False)
    worker = Worker(lambda: torch_runtime._allocated(0xB10C))  # torch's allocator callback, in the worker
    start()
    torch_runtime._allocated(0xA10C)  # the recording thread's own allocation: nothing unseen
    assert not any("allocated CUDA memory" in n for n in rec.notices)
    worker.run_job()
    unseen = [n for n in notices_naming(rec, worker.thread) if "allocated CUDA memory through torch at" in n]
    assert len(unseen) == 1 and "its torch operators are unseen (not recorded, not checked)" in unseen[0]
    assert "test_threads_before.py" in unseen[0]  # where, in the worker's code
    stop()
    worker.after_stop()


def test_a_thread_started_after_the_context_was_added_is_not_named(recording, monkeypatch):
    rec, start, stop = recording
    monkeypatch.setattr(threads, "REACHES_RUNNING_THREADS", False)
    start()
    worker = Worker(lambda: torch_runtime._allocated(0xB10C))  # not running at the start: not ours to name
    worker.run_job()
    assert notices_naming(rec, worker.thread) == []
    stop()
    worker.after_stop()


@needs_312
def test_a_running_thread_gets_the_mode_and_its_operators_are_recorded_with_its_tid(recording):
    rec, start, stop = recording
    x = torch.zeros(8)

    def job():
        x[2:4].add_(1)
        return rec.tid()  # this thread's id in the trace
    worker = Worker(job)
    start()
    assert notices_naming(rec, worker.thread) == []  # reached, so nothing to say
    tid = worker.run_job()
    (op,) = launches(rec)
    assert op.name == "aten.add_.Tensor" and op.thread == tid != 0 and op.stream == rec.sid(A)
    assert [(w.start, w.stop) for w in op.writes] == [(8, 16)]
    assert x.tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    stop()
    assert worker.after_stop() == 0  # it left the mode at its first Python event after the stop


@needs_312
def test_a_thread_inside_its_own_dispatch_mode_is_left_alone_and_named(recording):
    from torch.utils._python_dispatch import TorchDispatchMode

    rec, start, stop = recording

    class Own(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def job():
        torch.ones(4).mul_(2)
        return torch._C._len_torch_dispatch_stack()
    worker = Worker(job, inside=Own())  # inside its own mode before the recording starts, waiting
    start()
    assert worker.run_job() == 1  # its own mode only: ours was not put over it
    assert launches(rec) == []
    (notice,) = notices_naming(rec, worker.thread)
    assert "inside a torch dispatch mode of its own" in notice and "not recorded" in notice
    stop()
    assert worker.after_stop() == 0


@needs_312
def test_the_programs_profile_function_is_chained_and_given_back(recording):
    rec, start, stop = recording
    events = []

    def profile(frame, event, arg):
        if threading.current_thread().name == "profiled":
            events.append(event)
    def mine(frame, event, arg):
        pass
    threading.setprofile(profile)  # the program's, for every thread it starts
    sys.setprofile(mine)  # and one for this thread alone
    try:
        worker = Worker(lambda: sys.getprofile(), name="profiled")
        start()
        assert sys.getprofile() is mine  # the recording thread's, untouched
        events.clear()
        assert worker.run_job() is profile  # the worker has the program's function again
        assert "call" in events  # and it profiles the worker's job
        stop()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    worker.after_stop()
