"""The emulation running in this process, and the error for what it does not model."""
from __future__ import annotations


class EmulationError(RuntimeError):
    """A torch surface the emulation does not model: names it, the user's line, what to do."""


_active = None


def active():
    """The running Emulation (torch_cuda.Emulation)."""
    if _active is None:
        raise EmulationError("an emulated CUDA tensor was used after its `streamcheck run --backend sim` run ended; "
                             "keep emulated tensors inside the run")
    return _active


def set_active(emulation) -> None:
    global _active
    _active = emulation


def is_active() -> bool:
    return _active is not None


ON_A_GPU = "check this program on a GPU (streamcheck run --backend gpu)"


def refused(name: str, why: str):
    """A stand-in for `name` that refuses every call in one line: `<name> at <user's line>: <why>`."""
    from ..device.objects import caller_site

    def refuse(*args, **kwargs):
        raise EmulationError(f"{name} at {caller_site()}: {why}")
    refuse.__name__ = refuse.__qualname__ = name.rsplit(".", 1)[-1]
    refuse.refused = name  # what the API walk test reads
    return refuse
