"""Host threads: threading.Thread.start and join are happens-before edges between the
parent's and the child's host work (what the child issues is ordered after what the parent
issued before start; what the parent issues after join, after everything the child did)."""
from __future__ import annotations

from .. import recorder as R
from ..gpu import is_suppressed
from .patching import Patch, forwarding


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


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        Patch("threading.Thread.start", _start),
        Patch("threading.Thread.join", _join),
    )
