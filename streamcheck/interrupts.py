"""Ctrl-C in the command-line tools (`streamcheck`, `flashnorm`): exit status 130 and one line,
wherever the interrupt lands.

Light on purpose (the standard library only): a console script imports its module before it can
catch anything, so the handling is installed before the heavy imports (numpy, torch,
transformers) that a Ctrl-C most often interrupts.

    install()                  first thing in main(): remember that SIGINT came, then raise
                               KeyboardInterrupt as Python does
    received()                 True once SIGINT came: a library that caught the KeyboardInterrupt
                               and raised something else (a failed lazy import) was interrupted
    at_exit(line)              at interpreter exit (atexit callbacks such as torch's clean-up,
                               module teardown), Ctrl-C prints `line` and ends the process with
                               130 at once: a KeyboardInterrupt there would be a traceback nobody
                               can catch
    exit_status(code)          the status Python exits with for SystemExit(code) (the CLI's script
                               runs, on the GPU and on the sim, end as `python script.py` would)
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Callable

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C stopped

_received = False
_exit_line: list = []  # the line at_exit() was last given; its atexit callback is registered once


def _raise_keyboard_interrupt(signum, frame) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT raises KeyboardInterrupt (Python's default) and is remembered for received()."""
    global _received
    _received = False
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started with Ctrl-C ignored (nohup, `&`): keep it so
        return
    try:
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    except ValueError:  # main() called from another thread: Ctrl-C is its main thread's to handle
        pass


def received() -> bool:
    return _received


def at_exit(line: str | Callable[[], str]) -> None:
    """At interpreter exit, Ctrl-C prints `line` (or what it returns) on stderr and exits 130 at once.

    Registered after the heavy imports, so it runs before their atexit callbacks (last in, first
    out). In-process callers of a main() (tests) keep Python's Ctrl-C until their own exit."""
    if not _exit_line:
        atexit.register(lambda: signal.signal(signal.SIGINT, _stop))
    _exit_line[:] = [line]


def _stop(signum, frame) -> None:
    line = _exit_line[0]
    text = line() if callable(line) else line
    for stream in (sys.stdout, sys.stderr):  # os._exit does not flush
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: nothing more to say there
            pass
    try:
        os.write(2, (text + "\n").encode(errors="replace"))
    except OSError:
        pass
    os._exit(INTERRUPTED)


def exit_status(code) -> int:
    """The exit status Python gives SystemExit(code): 0 for None, the int itself, else 1 after
    printing `code` to stderr."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
