"""One run of an unmodified torch script on the sim: its CUDA calls emulated (torch_cuda), its
standard output captured for the comparison with the reference run, its exit status as Python
would give it. The script runs in this process (`runpy`, as `python script.py` would: argv,
`__main__`, its folder first on sys.path); the modules it imports from its own folder are
forgotten after the run, so the next run executes them again against its own device.
"""
from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
import traceback
from dataclasses import dataclass, field
from typing import Optional

from ..interrupts import exit_status
from ..timeout import RunTimedOut, TimeLimit


_OURS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")  # streamcheck's package


@dataclass
class ScriptRun:
    """What one run did: its output, its exit status, the device it ran on (trace, races,
    schedule), the emulation's notices; `refused`: the one line of a surface the sim does not
    model (EmulationError), '' if none; `error`: the traceback of an exception the script raised;
    `timed_out`: why it was interrupted ('' if it finished), and `hung_at`: where it was then (the
    script's frames, innermost last, paths relative to the working directory)."""

    stdout: str
    status: int
    device: object
    emulation: object = None
    notices: list = field(default_factory=list)
    capture_errors: list = field(default_factory=list)
    refused: str = ""
    error: str = ""
    timed_out: str = ""
    hung_at: list = field(default_factory=list)


class _Tee(io.TextIOBase):
    """Captures what the script prints, and passes it on when the run is the one the user sees."""

    def __init__(self, echo: Optional[io.TextIOBase]):
        self.parts: list = []
        self.echo = echo

    def write(self, text: str) -> int:
        self.parts.append(text)
        if self.echo is not None:
            self.echo.write(text)
        return len(text)

    def flush(self) -> None:
        if self.echo is not None:
            self.echo.flush()

    def getvalue(self) -> str:
        return "".join(self.parts)


def run_script(path: str, argv=(), *, policy="sequential", seed: int = 0, check: bool = True, devices: int = 1,
               echo: bool = False, timeout: Optional[float] = None, device=None, **policy_params) -> ScriptRun:
    """Run the script at `path` once on a fresh sim device with `policy` (and its seed and
    parameters), or on `device` (a sim Device a rerun built: confirmation, the sync proof).
    `echo`: its output also goes to this process's stdout. `timeout`: seconds before the run is
    interrupted (None: no limit). The script runs in the caller's thread: from the main thread, a
    blocking call (time.sleep) is interrupted too (timeout.TimeLimit)."""
    from ..core.trace import CallSite
    from ..device import Device
    from ..device.objects import caller_site
    from .torch_cuda import EmulationError, run_on

    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    tee = _Tee(sys.stdout if echo else None)
    box: dict = {}

    given = device

    def body():
        device = box["device"] = given if given is not None else Device(
            "sim", check=check, policy=policy, seed=seed, devices=devices, **policy_params)
        with run_on(device) as emulation:
            box["emulation"] = emulation
            try:
                with TimeLimit(timeout):  # the script's time, not the emulation's set-up (torch._dynamo's import)
                    runpy.run_path(path, run_name="__main__")
            finally:  # what the run said (an emulation already running goes back to its own run after it)
                box["notices"], box["capture_errors"] = list(emulation.notices), list(emulation.capture_errors)

    before = set(sys.modules)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, folder)
    saved_flag = os.environ.get("STREAMCHECK_RUN")
    os.environ["STREAMCHECK_RUN"] = "1"  # as on the GPU: a program (or its test) can tell it is being checked
    status, refused, error, timed_out, hung_at = 0, "", "", "", []
    # What happens with no frame of the script on the stack (its globals freed as it ends, or as the
    # exception that ended it is dropped below) is the script's doing at its last line, not runpy's,
    # a thread's or streamcheck's.
    try:
        with caller_site.fallback(CallSite(path, _last_line(path), "<module>")), contextlib.redirect_stdout(tee):
            try:
                body()
            except SystemExit as exc:
                status = exit_status(exc.code)
            except EmulationError as exc:
                status, refused = 2, str(exc)
            except RunTimedOut as exc:
                status, timed_out, hung_at = 1, str(exc), _script_frames(exc)
            except Exception as exc:  # the script's own failure: reported as Python would
                refused = _refusal_inside(exc)
                status = 2 if refused else 1
                if not refused:
                    error = "".join(traceback.format_exception(type(exc), exc, _from_the_script(exc.__traceback__)))
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_flag is None:
            os.environ.pop("STREAMCHECK_RUN", None)
        else:
            os.environ["STREAMCHECK_RUN"] = saved_flag
        _forget_modules(before, folder)
    emulation = box.get("emulation")
    if emulation is not None and emulation.threads.refusals and not refused:
        # A thread's refusal is the run's, as the main thread's is (the thread's traceback went to stderr).
        status, refused, error = 2, str(emulation.threads.refusals[0]), ""
    return ScriptRun(stdout=tee.getvalue(), status=status, device=box.get("device"), emulation=emulation,
                     notices=box.get("notices", []), capture_errors=box.get("capture_errors", []), refused=refused,
                     error=error, timed_out=timed_out, hung_at=hung_at)


def _script_frames(exc: RunTimedOut) -> list:
    """Where the script was when its time ran out: its own frames, inside run_script's (not the
    callers of the command that ran it, on the same stack), not runpy's, torch's or ours."""
    from ..core.trace import USER
    from ..device.objects import caller_site

    def relative(path: str) -> str:
        shown = os.path.relpath(path)
        return path if shown.startswith(os.pardir) else shown

    return exc.where(lambda path: caller_site.kind_of(path) == USER and not os.path.abspath(path).startswith(_OURS),
                     relative, below=lambda path: os.path.abspath(path) == os.path.abspath(__file__))


def _from_the_script(tb):
    """The traceback from the script's first frame on: as `python script.py` shows it, without the frames of
    streamcheck and runpy that ran it (frames below the script's, in libraries it called, all stay)."""
    while tb is not None and tb.tb_next is not None:
        file = tb.tb_frame.f_code.co_filename
        if not (os.path.abspath(file).startswith(_OURS) or "runpy" in file):
            break
        tb = tb.tb_next
    return tb


def _last_line(path: str) -> int:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return max(1, sum(1 for _ in f))
    except OSError:
        return 1


def _refusal_inside(exc: BaseException) -> str:
    """An EmulationError that a library wrapped in its own exception (a kernel's KernelError)."""
    from .torch_cuda import EmulationError

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, EmulationError):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return ""


def _forget_modules(before: set, folder: str) -> None:
    """Modules the script imported from its own folder run again in the next run."""
    prefix = os.path.join(folder, "")
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None) or ""
        if os.path.abspath(file).startswith(prefix):
            del sys.modules[name]
