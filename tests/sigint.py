"""Ctrl-C as a terminal delivers it, for the tests that send a real SIGINT.

A process started with SIGINT ignored (a background job, `nohup`, `trap '' INT`) passes that on to
every process it starts, and our CLIs rightly keep it so; a test of what Ctrl-C does must not
inherit it. Inside `sigint_from_a_terminal()` SIGINT raises KeyboardInterrupt in this process, and a
child started there begins with SIGINT at its default (exec resets a handled signal, not an ignored
one), as from a terminal."""
from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def sigint_from_a_terminal():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
