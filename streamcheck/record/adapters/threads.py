"""Host threads: threading.Thread.start and join are happens-before edges between the
parent's and the child's host work (what the child issues is ordered after what the parent
issued before start; what the parent issues after join, after everything the child did). So
are the threads' own hand-offs through threading.Event, queue.Queue, the program's Lock, RLock
and Condition, and Barrier: the recording listens to streamcheck/host_handoffs.py (`install`),
which says which calls are edges.

Thread contexts (`add_context`: torch's dispatch mode) are per thread, so each thread that
issues work must be inside them for the recording to see it:
- threads started during the recording enter them in `start` (around `run`);
- threads already running when a context is added (a polling thread, an output processor, a
  data-loader worker started before the recording) enter it at their next Python call or
  return (Python >= 3.12: `threading.setprofile_all_threads` runs a one-shot profile function
  in each of them, which then gives the thread back the program's own profile function, if it
  had set one with threading.setprofile, and forwards the event to it; a per-thread one set
  with sys.setprofile is replaced by that one). A thread already inside a torch dispatch mode
  of its own is left alone (a mode pops whatever is on top when it exits). When the recording
  stops, the modes entered so go inert at once, and each thread leaves its own at its next
  Python event if it is still on top of that thread's stack.
- On Python < 3.12, and for a thread inside its own mode, the recording's notices name each
  such thread (name, ident) at the start: its torch operators are not recorded. A thread not
  reached that allocates through torch's caching allocator during the recording (torch's
  GPU-trace callback, torch_runtime.py) is named again, with where: unseen work, never
  silently missed. Operators such a thread issues without allocating are unseen without that
  second notice.
streamcheck's own threads (named "streamcheck ...", timeout.py) are not reached.
"""
from __future__ import annotations

import sys
import threading

from ...host_handoffs import Listener, listen as listen_to_hand_offs
from .. import recorder as R
from ..gpu import is_suppressed
from .patching import Patch, forwarding, quiet

# threading.setprofile_all_threads (Python >= 3.12) runs a function inside every running thread.
REACHES_RUNNING_THREADS = hasattr(threading, "setprofile_all_threads")
_OWN_THREADS = "streamcheck"  # name prefix of streamcheck's own threads (timeout.run_with_timeout)
_HOW_TO_AVOID = ("start the thread inside the recording (after streamcheck.instrument() starts; under "
                 "`streamcheck run`, after the program imports torch)")

_reaching: set = set()  # Running objects whose threads enter their context at their next Python event
_leave: dict = {}  # thread ident -> contexts to leave there (their recording stopped)
_previous = None  # the program's profile function for all threads (threading.getprofile) when ours went in


def add_context(rec, make, patcher) -> None:
    """`make()` builds a context manager a host thread must be inside for `rec` to see its work
    (torch's TorchDispatchMode). Threads started from now on enter one (`start`); the threads
    running now enter one at their next Python event, or are named as unseen (module docstring)."""
    rec.thread_contexts.append(make)
    running = Running(rec, make)
    rec.state.setdefault("threads", []).append(running)
    if not running.unreached:
        return
    if REACHES_RUNNING_THREADS:
        _reaching.add(running)
        _install_visit()
    else:
        for ident, name in running.unreached.items():
            rec.notice(f"host thread {name!r} (ident {ident}) was running before the recording started: its torch "
                       f"operators are not recorded (Python {sys.version_info[0]}.{sys.version_info[1]} cannot give a "
                       f"running thread torch's dispatch mode; Python >= 3.12 can); {_HOW_TO_AVOID}")
    patcher.on_undo(running.stop)


def unseen_work(rec, what: str) -> None:
    """The calling thread did `what` (torch's allocator reported it): if it is a running thread
    the recording has not reached, name it, once (its operators went unrecorded)."""
    for running in rec.state.get("threads", ()):
        if running.unreached:
            running.unseen(what)


class Running:
    """The host threads running when one thread context was added to `rec` (other than the
    adding thread and streamcheck's own): those not reached yet, and those that entered it."""

    def __init__(self, rec, make):
        self.rec = rec
        self.make = make
        me = threading.get_ident()
        self.unreached = {t.ident: t.name for t in threading.enumerate()
                          if t.ident != me and t.is_alive() and not t.name.startswith(_OWN_THREADS)}
        self.entered: dict = {}  # ident -> the context entered in that thread
        self.named: set = set()  # idents whose unseen work was named
        self.stopped = False
        self._lock = threading.Lock()  # a thread entering while the recording stops: one or the other first

    def visited(self, ident: int) -> None:
        """In thread `ident`, at a Python event: enter the context there if it is still due."""
        name = self.unreached.get(ident)
        if name is None:
            return
        if _mode_stack():
            self.rec.notice(f"host thread {name!r} (ident {ident}) was running before the recording started, inside "
                            "a torch dispatch mode of its own (streamcheck's cannot be put over it): its torch "
                            f"operators are not recorded; {_HOW_TO_AVOID}")
            return  # stays unreached: its allocations are still named as unseen
        with self._lock:
            if self.stopped:
                return
            context = self.make()
            context.__enter__()
            self.entered[ident] = context
            del self.unreached[ident]

    def unseen(self, what: str) -> None:
        ident = threading.get_ident()
        name = self.unreached.get(ident)
        if name is None or ident in self.named or R.depth():  # inside a recorded operator: the mode is on
            return
        self.named.add(ident)
        self.rec.notice(f"host thread {name!r} (ident {ident}), running since before the recording, {what} at "
                        f"{self.rec.site()} without streamcheck's dispatch mode: its torch operators are unseen "
                        f"(not recorded, not checked); {_HOW_TO_AVOID}")

    def stop(self) -> None:
        """The recording stops: its modes are inert (they pass through when R.current is not
        rec); each thread that entered one leaves it at its next Python event."""
        _reaching.discard(self)
        with self._lock:
            self.stopped = True
            entered, self.entered = self.entered, {}
        alive = {t.ident for t in threading.enumerate()}
        for ident, context in entered.items():
            if ident in alive:
                _leave.setdefault(ident, []).append(context)
        if entered and REACHES_RUNNING_THREADS:
            _install_visit()


def _mode_stack() -> tuple:
    """The calling thread's torch dispatch modes, innermost last (none without torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    depth = torch._C._len_torch_dispatch_stack()
    return tuple(torch._C._get_dispatch_stack_at(i) for i in range(depth))


def _install_visit() -> None:
    """`_visit` as the profile function of every running thread but this one, once each."""
    global _previous
    own = sys.getprofile()
    _previous = threading.getprofile()
    threading.setprofile_all_threads(_visit)
    threading.setprofile(_previous)  # threads started from now on: as the program set it (start() reaches them)
    sys.setprofile(own)


def _visit(frame, event, arg):
    """A profile function that runs once in a thread: leaves the contexts of stopped recordings,
    enters those due, then gives the thread back the program's profile function. Never raises
    into the program's thread."""
    previous = _previous
    sys.setprofile(previous)
    ident = threading.get_ident()
    for context in reversed(_leave.pop(ident, ())):
        stack = _mode_stack()
        if stack and stack[-1] is context:  # under a mode the program entered since: stays, inert
            try:
                context.__exit__(None, None, None)
            except Exception:  # the recording is over: nowhere to report, nothing to break
                pass
    for running in tuple(_reaching):
        try:
            running.visited(ident)
        except Exception as exc:
            running.rec.errors.append(f"entering a thread context in host thread {ident}: {type(exc).__name__}: "
                                      f"{exc} (that thread's torch operators are not recorded)")
    if previous is not None:
        previous(frame, event, arg)


def _start(orig):
    def start(self):
        rec = R.current
        if rec is None or is_suppressed():
            return orig(self)
        child = rec.thread_starting()
        run = self.run

        def run_registered():
            if R.current is not rec:
                return run()
            rec.thread_running(child)
            contexts = [make() for make in rec.thread_contexts]  # per-thread state, e.g. torch's dispatch mode
            for context in contexts:
                context.__enter__()
            try:
                return run()
            finally:
                for context in reversed(contexts):
                    context.__exit__(None, None, None)
        self.run = run_registered
        self._streamcheck_thread = child
        return orig(self)
    return forwarding(orig, start)


def _join(orig):
    def join(self, timeout=None):
        result = orig(self, timeout)
        rec = R.current
        child = getattr(self, "_streamcheck_thread", None)
        if rec is not None and child is not None and not self.is_alive():
            rec.thread_joined(child)
        return result
    return forwarding(orig, join)


class HandOffs(Listener):
    """The recording's ear for host threads' hand-offs (host_handoffs.Listener) while it is the one
    recording, outside recorded operations and streamcheck's own work (patching.quiet); the threads
    it knows are those that issued recorded work."""

    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def knows_caller(self) -> bool:
        return self.rec.knows_thread()

    def record(self, kind, channel: int, what: str) -> None:
        if R.current is self.rec and not quiet():
            self.rec.thread_hand_over(kind, channel, what)


def install(rec, patcher) -> None:
    """Listen to the host threads' hand-offs until the recording stops."""
    listener = rec.state["hand-offs"] = HandOffs(rec)  # held by the recording: host_handoffs holds it weakly
    patcher.on_undo(listen_to_hand_offs(listener))


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        Patch("threading.Thread.start", _start),
        Patch("threading.Thread.join", _join),
    )
