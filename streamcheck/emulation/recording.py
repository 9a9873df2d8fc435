"""What an emulated run recorded, as the GPU recording answers it (races, trace, capture errors,
summary, report), and a torch function as a device-API program, so that everything built on
device programs (run_schedules, confirmation, the sync proof) takes torch code too.
"""
from __future__ import annotations

from typing import Optional


class EmulatedRecording:
    """A sim Device that ran torch code under the emulation, answering what `streamcheck run`'s later
    stages and the pytest plugin ask a recording (instrument.Session): races, trace, checker,
    capture_errors, findings, errors, refused, unpatched, libraries, summary(), report()."""

    def __init__(self, device, emulation, what: str):
        self.device = device
        self.emulation = emulation
        self.what = what  # "ran prog.py", "the test's torch code"
        self.errors: list = []  # recorded through the device API: nothing is refused half-way
        self.refused: list = []
        self.unpatched: list = []
        self.libraries = ("torch (emulated on the sim)",)

    @property
    def trace(self):
        return self.device.trace

    @property
    def checker(self):
        return self.device.checker

    @property
    def races(self):
        return self.device.races

    @property
    def hazards(self):
        return self.device.hazards

    @property
    def notices(self) -> list:
        return list(self.emulation.notices) if self.emulation is not None else []

    @property
    def capture_errors(self) -> list:
        """CUDA's refusals during a capture: what the checker saw and what the program got."""
        found = list(self.checker.capture_errors) if self.checker is not None else []
        seen = {str(e) for e in found}
        program = self.emulation.capture_errors if self.emulation is not None else []  # None: it never began
        return found + [e for e in program if str(e) not in seen]

    @property
    def findings(self) -> int:
        return len(self.races) + len(self.capture_errors)

    def summary(self) -> str:
        return (f"streamcheck: {self.what} on the sim (CUDA emulated on the CPU), {self.device.schedule.policy}: "
                f"{len(self.trace)} operations on {len(self.device._stream_objects)} stream(s)")

    def report(self, width: Optional[int] = None) -> str:
        from ..core.hb import format_hazards, format_report
        from ..record.recorder import format_capture_errors

        lines = [format_report(self.races, width=width)]
        if self.hazards:
            lines.append(format_hazards(self.hazards, width=width))
        if self.capture_errors:
            lines.append(format_capture_errors(self.capture_errors))
        lines.extend(f"streamcheck: note: {text}" for text in self.notices)
        return "\n".join(lines)


def takes_no_arguments(fn) -> bool:
    """Whether `fn` is a torch program (called with nothing) rather than a device-API program
    (called with its Device)."""
    import inspect

    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                   for p in parameters)


def torch_program(fn, site=None):
    """`fn()` (torch code that returns tensors) as a device-API program: on the Device it is given,
    under the emulation; its tensors come back as numpy arrays read as `.cpu()` reads them (a copy on
    the current stream, then a wait for it), so a result its stream has not finished is read stale.
    `site`: where the caller takes the result (a run_schedules(...) line): what the host does after
    `fn` returned (its tensors freed, its result read) is recorded there."""
    def program(device):
        from ..device.objects import caller_site
        from .torch_cuda import run_on

        with run_on(device):
            if site is None:
                return host_values(fn())
            with caller_site.fallback(site):
                return host_values(fn())

    program.__name__ = getattr(fn, "__name__", "program")
    program.__wrapped__ = fn
    program.runs_on_sim = True  # whatever the backend: the emulation needs the sim's device
    return program


def host_values(value):
    """Tensors in `value` (through lists, tuples and dicts) as numpy arrays, read by the host."""
    import torch

    if isinstance(value, torch.Tensor):
        host = value.detach().cpu()
        if type(host) is not torch.Tensor:  # pinned memory: the host reads it now
            host = host.clone()
        if host.dtype in (torch.bfloat16,):  # numpy has no bfloat16: float32 holds it exactly
            host = host.float()
        return host.numpy()
    if isinstance(value, dict):
        return {k: host_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_values(v) for v in value)
    return value
