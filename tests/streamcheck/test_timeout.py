"""streamcheck/timeout.py: a run in a thread of its own, interrupted once its time is up."""
from __future__ import annotations

import re
import threading
import time

import pytest

from streamcheck.timeout import UNWIND_SECONDS, Deadline, RunTimedOut, TimeLimit, run_with_timeout


def test_the_result_and_the_exception_come_back_to_the_caller():
    assert run_with_timeout(lambda: 6 * 7, 5) == 42
    seen = []

    def fails():
        seen.append(threading.current_thread().name)
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside") as info:
        run_with_timeout(fails, 5, name="the run")
    assert seen == ["the run"]  # it ran in its own thread...
    assert info.traceback[-1].name == "fails"  # ...and its traceback came along
    # No limit: the caller's own thread.
    assert run_with_timeout(lambda: threading.current_thread(), 0) is threading.current_thread()


def test_a_python_loop_is_interrupted_even_when_it_catches_exceptions():
    stop, caught = threading.Event(), []

    def loop():
        while not stop.is_set():  # the flag only ends a loop this test failed to interrupt
            try:
                time.sleep(0.001)  # the work, where the interrupt lands: inside the handler's reach
            except Exception as exc:  # a program's own handler must not swallow the interrupt
                caught.append(exc)

    start = time.perf_counter()
    try:
        with pytest.raises(RunTimedOut, match=r"did not finish within 0.2 s \(its thread was interrupted\)") as info:
            run_with_timeout(loop, 0.2)
    finally:
        stop.set()
    assert info.value.interrupted and info.value.seconds == 0.2
    assert caught == []
    assert time.perf_counter() - start < 0.2 + UNWIND_SECONDS


def test_a_thread_blocked_in_c_is_abandoned_and_the_caller_goes_on():
    release = threading.Event()
    start = time.perf_counter()
    with pytest.raises(RunTimedOut, match="abandoned: it is blocked in a call Python cannot interrupt") as info:
        run_with_timeout(release.wait, 0.1, name="blocked run")
    assert not info.value.interrupted
    assert 0.1 + UNWIND_SECONDS <= time.perf_counter() - start < 0.1 + UNWIND_SECONDS + 1
    (blocked,) = [t for t in threading.enumerate() if t.name == "blocked run"]
    assert blocked.daemon  # it cannot keep the process alive at exit
    release.set()  # the call returns, the pending interrupt ends the thread
    blocked.join(5)
    assert not blocked.is_alive()


def test_a_timeout_says_where_the_run_was():
    def loop_here():
        while True:
            pass

    with pytest.raises(RunTimedOut) as info:
        run_with_timeout(loop_here, 0.2)
    where = info.value.where(lambda path: path == __file__)
    assert len(where) >= 1 and where[-1].startswith(f"{__file__}:")
    assert re.search(r"in loop_here: (pass|while True:)$", where[-1]), where


@pytest.mark.parametrize("blocking", [False, True])
def test_a_time_limit_stops_this_thread_in_a_loop_or_a_blocking_call(blocking):
    start = time.perf_counter()
    with pytest.raises(RunTimedOut, match=r"did not finish within 0.3 s \(its thread was interrupted\)") as info:
        with TimeLimit(0.3):
            if blocking:
                time.sleep(1000)  # the main thread: the limit's signal makes the call return
            else:
                while True:
                    pass
    assert time.perf_counter() - start < 0.3 + UNWIND_SECONDS
    assert info.value.stack[-1].name == "test_a_time_limit_stops_this_thread_in_a_loop_or_a_blocking_call"
    # Left early, a limit interrupts nothing afterwards.
    with TimeLimit(0.2):
        pass
    time.sleep(0.4)


def test_a_deadline_is_shared_by_the_runs_under_it():
    deadline = Deadline(0.5)
    assert 0 < deadline.remaining() <= 0.5 and not deadline.expired
    time.sleep(0.3)
    assert deadline.remaining() <= 0.2
    time.sleep(0.25)
    assert deadline.expired and deadline.remaining() > 0  # a late run still starts, and times out at once
    assert Deadline(0).remaining() is None and not Deadline(None).expired


class _RaisesInDel:
    def __init__(self, exception):
        self.exception = exception

    def __del__(self):
        raise self.exception


def test_an_interrupt_swallowed_in_a_finalizer_is_not_reported_and_the_limit_still_stops_the_block(monkeypatch):
    """An interrupt that lands in a __del__ (or a gc callback) is swallowed there, and Python would
    say "Exception ignored in ..."; the limit interrupts again, so only that report is dropped: any
    other unraisable exception still reaches the hook, and the block still stops."""
    from streamcheck.timeout import Interrupted

    reported = []
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: reported.append(unraisable.exc_type))
    with pytest.raises(RunTimedOut):
        with TimeLimit(0.2):
            _RaisesInDel(Interrupted())  # dropped at once: its __del__ raises what a limit raises
            _RaisesInDel(ValueError("a program's own"))
            while True:
                pass
    assert reported == [ValueError]
    _RaisesInDel(Interrupted())  # once the limit is left, the hook it found is back
    assert reported == [ValueError, Interrupted]
