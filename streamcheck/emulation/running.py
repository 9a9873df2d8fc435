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
