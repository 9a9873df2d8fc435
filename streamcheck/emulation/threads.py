"""Host threads under the emulation: every Python thread uses emulated tensors, streams and events,
as every thread of a process can use CUDA.

- CUDA's current device and stream are per thread: a thread starts on device 0 and its legacy
  default stream, and `torch.cuda.set_stream` / `stream(s)` / `set_device` in one thread leave the
  others' alone (Emulation.current_stream; a thread's entries go when it ends, so a later thread
  that Python gives the same ident starts fresh).
- torch function modes are per thread, and the factories a CPU-only torch refuses reach the
  emulation only through one (FactoryMode): a thread started while the emulation runs enters a
  mode around its `run()` and leaves it as `run()` returns. A thread that was running before
  (a pool's worker) enters one at its first emulated call that reaches Python (an operator or
  method on an emulated tensor, a torch.cuda function); a `device="cuda"` factory that comes
  before any of those fails inside torch's C++, where nothing can see it. The modes of threads
  that outlive the emulation turn inert (they pass every call through) when it ends.
- `Thread.start` and `Thread.join` are happens-before edges (as threading promises; on a GPU
  recording, record/adapters/threads.py): what the parent did before `start()` is ordered before
  the child's work, and all the child did (its `torch.cuda.synchronize()` included) before what the
  joiner does after a `join()` that saw it end. The threads' own hand-offs (queues, events, locks)
  are host_handoffs.py's.
- A refusal (EmulationError) raised in a thread ends that thread and is the run's refusal, one
  line, as in the main thread (`refusals`: `streamcheck run` and the plugin report it); other
  exceptions are the thread's, reported by threading as without us.
streamcheck's own threads (named "streamcheck ...") are left alone.
"""
from __future__ import annotations

import threading

import torch

from ..device.objects import caller_site
from ..timeout import OWN_THREADS
from . import running
from .factory_mode import FactoryMode
from .running import EmulationError



class HostThreads:
    """The emulation's host threads: the per-thread factory modes, the start and join edges, the
    refusals raised in threads. `install()` patches threading.Thread (returns the undos);
    `enter_here()` / `leave_here()` put this thread in and out of the factory mode."""

    def __init__(self, emulation):
        self.emulation = emulation
        self.refusals: list = []  # EmulationError raised in a thread, in order
        self._local = threading.local()  # .mode: this thread's FactoryMode
        self._modes: list = []  # every mode handed out: made inert when the emulation ends

    # --- the factory mode, per thread ---------------------------------------------------------
    def has_mode(self) -> bool:
        return getattr(self._local, "mode", None) is not None

    def enter_here(self) -> None:
        """The calling thread enters a factory mode of this emulation."""
        mode = FactoryMode(self.emulation)
        mode.__enter__()
        self._local.mode = mode
        self._modes.append(mode)

    def leave_here(self) -> None:
        """The calling thread leaves the mode enter_here gave it (if nothing pushed another over it:
        then it stays, inert, rather than pop the program's)."""
        mode = getattr(self._local, "mode", None)
        if mode is None:
            return
        self._local.mode = None
        mode.emulation = None
        try:
            self._modes.remove(mode)
        except ValueError:  # the emulation ended first (stop)
            pass
        if _top_mode() is mode:
            mode.__exit__(None, None, None)

    def stop(self) -> None:
        """The emulation ends: every thread's mode passes calls through from now on."""
        modes, self._modes = self._modes, []
        for mode in modes:
            mode.emulation = None

    # --- threading.Thread ---------------------------------------------------------------------
    def install(self) -> list:
        """Patch Thread.start and Thread.join while the emulation runs; returns the undos."""
        thread_class = threading.Thread
        original_start, original_join = thread_class.start, thread_class.join
        threads = self

        def start(thread):
            emulation = threads.emulation
            if running._active is not emulation or thread.name.startswith(OWN_THREADS):
                return original_start(thread)
            child = emulation.device._thread_starting(caller_site())
            thread._streamcheck_emulated = (emulation, child)
            run = thread.run

            def run_emulated():
                if running._active is not emulation:  # the emulation ended before the thread ran
                    return run()
                return threads.run_thread(child, run)
            thread.run = run_emulated
            return original_start(thread)

        def join(thread, timeout=None):
            result = original_join(thread, timeout)
            emulation = threads.emulation
            if running._active is emulation and not thread.is_alive():
                threads.joined(thread)
            return result

        for replacement, original in ((start, original_start), (join, original_join)):
            for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
                setattr(replacement, attr, getattr(original, attr))
        thread_class.start, thread_class.join = start, join

        def undo():
            if thread_class.__dict__.get("start") is start:  # else the program rebound it: its own stays
                thread_class.start = original_start
            if thread_class.__dict__.get("join") is join:
                thread_class.join = original_join
        return [undo]

    def run_thread(self, child: int, run):
        """In a thread started while emulating: its run() as thread `child`, in a factory mode, on
        device 0's default stream."""
        emulation = self.emulation
        device = emulation.device
        emulation.forget_thread()
        device._thread_running(child)
        self.enter_here()
        try:
            return run()
        except EmulationError as exc:  # one line, the run's (script.py, the plugin): no thread traceback
            self.refusals.append(exc)
        finally:
            self.leave_here()
            emulation.forget_thread()
            device._thread_ended()

    def joined(self, thread) -> None:
        """`thread` ended and the caller joined it: its work is ordered before the caller's next."""
        device = self.emulation.device
        marked = getattr(thread, "_streamcheck_emulated", None)
        if marked is not None and marked[0] is self.emulation:
            child = marked[1]
        else:  # running before the emulation: the id the device gave it at its first call, if any
            with device._lock:
                child = device._threads.get(thread.ident)
            if child is None:
                return
        device._thread_joined(child, caller_site())


def _top_mode():
    """The calling thread's innermost torch function mode, or None."""
    depth = torch._C._len_torch_function_stack()
    return torch._C._get_function_stack_at(depth - 1) if depth else None
