"""A time limit on one run of a program: run_schedules' schedules and `streamcheck fuzz`'s examples.

Python cannot kill a thread. The run goes in a thread of its own; once its time is up, the thread
is interrupted with an exception raised inside it (CPython's PyThreadState_SetAsyncExc), which
stops a Python loop, with or without device calls, at its next bytecode. A thread blocked inside
one C call (a lock acquired without a timeout, a long time.sleep, a wait on a real GPU) sees that
exception only when the call returns: it is abandoned, as a daemon thread, and the caller goes on.
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable, Optional

# How long an interrupted thread gets to unwind before it is abandoned.
UNWIND_SECONDS = 1.0


class Interrupted(BaseException):
    """Raised inside a run's thread when its time is up. Not an Exception: a program's own
    `except Exception` must not swallow it and loop on."""


class RunTimedOut(Exception):
    """The run did not finish within `seconds`; `interrupted`: its thread stopped (else it was
    abandoned, still running)."""

    def __init__(self, seconds: float, interrupted: bool):
        state = "interrupted" if interrupted else "abandoned: it is blocked in a call Python cannot interrupt"
        super().__init__(f"did not finish within {seconds:g} s (its thread was {state})")
        self.seconds, self.interrupted = seconds, interrupted


def run_with_timeout(call: Callable[[], Any], seconds: Optional[float], name: str = "streamcheck run") -> Any:
    """`call()` in a thread named `name`: its result, or its exception raised here (with its
    traceback); RunTimedOut once `seconds` passed. `seconds` None or 0: `call()` in this thread."""
    __tracebackhide__ = True  # pytest: a failure shows the program's frames, not these
    if not seconds:
        return call()
    outcome: dict = {}

    def body() -> None:
        __tracebackhide__ = True
        try:
            outcome["result"] = call()
        except BaseException as exc:  # pytest.fail and skip are BaseExceptions too: all go to the caller
            outcome["error"] = exc  # (an Interrupted too: it is not raised, the caller raises RunTimedOut)

    thread = threading.Thread(target=body, name=name, daemon=True)  # daemon: an abandoned one never blocks exit
    thread.start()
    try:
        thread.join(seconds)
    except BaseException:  # Ctrl-C reaches this thread only: stop the run too
        _interrupt(thread)
        raise
    if thread.is_alive():
        # Again and again until the thread leaves `call`: an interrupt that lands in a weakref
        # callback or a __del__ is swallowed there (Python reports it as unraisable) and the loop goes on.
        unwound_by = time.monotonic() + UNWIND_SECONDS
        while thread.is_alive() and not outcome and time.monotonic() < unwound_by:
            _interrupt(thread)
            thread.join(0.05)
        thread.join(max(unwound_by - time.monotonic(), 0))
        raise RunTimedOut(seconds, interrupted=not thread.is_alive())
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["result"]


def _interrupt(thread: threading.Thread) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupted))


def last_operation(device, first: int = 0) -> str:
    """The last operation `device` recorded from trace index `first` on (the program's own, not
    the device's set-up): its kind, name and call site; or that there was none."""
    ops = device.trace.ops
    if len(ops) <= first:
        return "none (the program made no device call)"
    op = ops[-1]
    name = getattr(op, "name", "")
    named = f" `{name}`" if isinstance(name, str) and name else ""
    where = f" (in {op.site.function})" if op.site.function else ""
    return f"{type(op).__name__}{named} at {op.site}{where}"
