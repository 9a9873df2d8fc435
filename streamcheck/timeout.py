"""Time limits: one run of a program in a thread of its own (run_schedules' runs, `streamcheck run
--backend sim`'s runs, `streamcheck fuzz`'s examples), a Deadline that several runs share (one limit
for a whole run_schedules call or a whole `streamcheck run`), and a TimeLimit on the code the current
thread runs (a whole test under the pytest plugin).

Python cannot kill a thread. A run goes in a thread of its own; once its time is up, the thread
is interrupted with an exception raised inside it (CPython's PyThreadState_SetAsyncExc), which
stops a Python loop, with or without device calls, at its next bytecode. A thread blocked inside
one C call (a lock acquired without a timeout, a long time.sleep, a wait on a real GPU) sees that
exception only when the call returns: it is abandoned, as a daemon thread, and the caller goes on.
The main thread can be woken from such a call: a signal makes the call return (EINTR) and run
its Python handler, which raises there (TimeLimit does that).

Before interrupting, the stack of the thread is taken (sys._current_frames): a timeout says where
the program was, not only that it was late.
"""
from __future__ import annotations

import _thread
import ctypes
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional

# The name prefix of streamcheck's own threads (a run's thread, a time limit's watchdog): the emulation
# leaves them alone (they are not the program's).
OWN_THREADS = "streamcheck"
# How long an interrupted thread gets to unwind before it is abandoned.
UNWIND_SECONDS = 1.0
# The signal that wakes the main thread from a blocking call (its handler chains to any other's).
WAKE_SIGNAL = getattr(signal, "SIGALRM", None)


class Interrupted(BaseException):
    """Raised inside a run's thread when its time is up. Not an Exception: a program's own
    `except Exception` must not swallow it and loop on."""


class RunTimedOut(Exception):
    """The run did not finish within `seconds`; `interrupted`: its thread stopped (else it was
    abandoned, still running); `stack`: its frames when the time was up (traceback.StackSummary,
    outermost first; empty if the thread had none)."""

    def __init__(self, seconds: float, interrupted: bool, stack=()):
        state = "interrupted" if interrupted else "abandoned: it is blocked in a call Python cannot interrupt"
        super().__init__(f"did not finish within {seconds:g} s (its thread was {state})")
        self.seconds, self.interrupted, self.stack = seconds, interrupted, traceback.StackSummary.from_list(stack)

    def where(self, keep: Callable[[str], bool], relative: Callable[[str], str] = lambda path: path,
              limit: int = 6, below: Optional[Callable[[str], bool]] = None) -> list:
        """Where the run was, innermost last, one line per frame: the frames whose file `keep`
        accepts (the user's), at most `limit`, and only those inside the last frame whose file
        `below` accepts (the runner that started the program); the innermost frames of all when
        none is kept (it hung inside a library before reaching the user's code)."""
        stack = list(self.stack)
        if below is not None:
            starts = [i for i, f in enumerate(stack) if below(f.filename)]
            stack = stack[starts[-1] + 1:] if starts else stack
        frames = [f for f in stack if keep(f.filename)] or stack[-2:]
        return [f"{relative(f.filename)}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else "")
                for f in frames[-limit:]]


def stack_of(thread_id: Optional[int]) -> traceback.StackSummary:
    """The frames thread `thread_id` is in now, outermost first (empty if it has none)."""
    frame = sys._current_frames().get(thread_id)
    return traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()


class Deadline:
    """One limit shared by several runs: each gets what is left. `seconds` None or 0: no limit."""

    def __init__(self, seconds: Optional[float]):
        self.seconds = seconds or None
        self._ends = None if self.seconds is None else time.monotonic() + self.seconds

    def remaining(self) -> Optional[float]:
        """Seconds left (at least a millisecond, so a late run still starts and times out), None: no limit."""
        if self._ends is None:
            return None
        return max(self._ends - time.monotonic(), 0.001)

    @property
    def expired(self) -> bool:
        return self._ends is not None and time.monotonic() >= self._ends


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
    except BaseException:  # Ctrl-C (or the caller's own TimeLimit) reaches this thread only: stop the run too
        _interrupt(thread.ident)
        raise
    if thread.is_alive():
        stack = stack_of(thread.ident)
        # Again and again until the thread leaves `call`: an interrupt that lands in a weakref
        # callback or a __del__ is swallowed there (Python reports it as unraisable) and the loop goes on.
        unwound_by = time.monotonic() + UNWIND_SECONDS
        with _QuietSwallowedInterrupts():
            while thread.is_alive() and not outcome and time.monotonic() < unwound_by:
                _interrupt(thread.ident)
                thread.join(0.05)
            thread.join(max(unwound_by - time.monotonic(), 0))
        raise RunTimedOut(seconds, interrupted=not thread.is_alive(), stack=stack)
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["result"]


class _QuietSwallowedInterrupts:
    """While a time limit may interrupt: an Interrupted that lands in a __del__, a weakref or a
    garbage-collector callback is swallowed there, and Python reports it as unraisable ("Exception
    ignored in ..." on stderr, a warning under pytest). The limit raises it again until the block
    is left, so that report is noise: it is dropped; any other goes to the hook installed before."""

    def __enter__(self):
        self._previous = sys.unraisablehook
        sys.unraisablehook = self._hook
        return self

    def __exit__(self, *exc) -> None:
        if sys.unraisablehook == self._hook:  # another tool may have put its own since: left alone
            sys.unraisablehook = self._previous

    def _hook(self, unraisable) -> None:
        if unraisable.exc_type is Interrupted:
            return
        self._previous(unraisable)


def _interrupt(thread_id: int, exception=Interrupted) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exception) if exception is not None else None)


class TimeLimit:
    """`with TimeLimit(seconds):` the block, run in this thread, is interrupted once `seconds` passed
    (None or 0: no limit) and RunTimedOut is raised out of the `with`, carrying the stack the block
    was in. A watchdog thread does it: in the main thread with a signal (WAKE_SIGNAL), whose handler
    raises there, so a blocking call such as time.sleep returns too; in another thread with an
    asynchronous exception (a blocked C call there finishes first)."""

    def __init__(self, seconds: Optional[float]):
        self.seconds = seconds or None
        self.fired = False
        self.stack = traceback.StackSummary()
        self._done = False
        # Plain C locks: a threading.Event's set() would be recorded as the program's hand-off
        # (host_handoffs.py) while a device listens. `_ended` is held until the block ends.
        self._lock = _thread.allocate_lock()
        self._ended = _thread.allocate_lock()
        self._ended.acquire()
        self._previous = None

    def __enter__(self) -> "TimeLimit":
        if self.seconds is None:
            return self
        self._target = threading.get_ident()
        self._by_signal = WAKE_SIGNAL is not None and threading.current_thread() is threading.main_thread()
        if self._by_signal:
            self._previous = signal.signal(WAKE_SIGNAL, self._on_signal)
        self._quiet = _QuietSwallowedInterrupts().__enter__()
        self._watchdog = threading.Thread(target=self._watch, name=f"{OWN_THREADS} time limit", daemon=True)
        self._watchdog.start()
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if self.seconds is None:
            return False
        try:
            with self._lock:
                self._done = True
                fired = self.fired
            self._ended.release()
            if fired and not self._by_signal:
                _interrupt(self._target, None)  # one still pending must not land after the block
            if self._by_signal:
                signal.signal(WAKE_SIGNAL, self._previous if self._previous is not None else signal.SIG_DFL)
        except Interrupted:  # the last one landed here, as the block ended
            fired = True
        finally:
            self._quiet.__exit__()
        if fired and not (kind is not None and issubclass(kind, (KeyboardInterrupt, SystemExit))):
            raise RunTimedOut(self.seconds, interrupted=True, stack=self.stack) from None
        return False

    def _on_signal(self, signum, frame) -> None:
        if self.fired and not self._done:
            raise Interrupted
        previous = self._previous
        if callable(previous):  # another tool's alarm (pytest-timeout's): its own handler
            previous(signum, frame)

    def _watch(self) -> None:
        if self._ended.acquire(timeout=self.seconds):
            return
        with self._lock:
            if self._done:
                return
            self.stack = stack_of(self._target)
            self.fired = True
        # Again until the block is left: one that lands in a weakref callback or __del__ is swallowed there.
        pause = 0.05
        while True:
            with self._lock:
                if self._done:
                    return
                if self._by_signal:
                    signal.pthread_kill(self._target, WAKE_SIGNAL)
                else:
                    _interrupt(self._target)
            if self._ended.acquire(timeout=pause):
                return
            pause = min(pause * 2, 1.0)


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
