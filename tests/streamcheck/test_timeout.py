"""streamcheck/timeout.py: a run in a thread of its own, interrupted once its time is up."""
from __future__ import annotations

import threading
import time

import pytest

from streamcheck.timeout import UNWIND_SECONDS, RunTimedOut, run_with_timeout


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
