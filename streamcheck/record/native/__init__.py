"""The recorder's native operator observer (observer.cpp): torch's operators seen from the
dispatcher's RecordFunction callbacks in C++, with no Python frame per operator, as compact records
in a buffer that the recorder drains (record/adapters/torch_native.py turns them into trace records
by torch_ops' rules). What it records and why is in observer.cpp's header; the design in
docs/architecture.md ("Recording torch operators in C++").

The library is built against the user's own torch and Python (streamcheck/native_build.py: g++,
a few seconds, cached) and loaded with ctypes; no CUDA toolkit is needed. It is opt-in until the whole
GPU suite passes through it (docs/gpu-results.md): `STREAMCHECK_NATIVE_RECORD=1` turns it on, otherwise the recorder
uses its Python path, a TorchDispatchMode; `=0` refuses to load it at all. Where it cannot be had
(no compiler, no Python headers, a Python whose frames it cannot read), the Python path runs and the
recording says why in one line (`unavailable_reason`).
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Optional

from ... import native_build
from ...core.trace import reads_frames
from ...native_build import NativeUnavailable

SWITCH = "STREAMCHECK_NATIVE_RECORD"  # "1": the recorder uses this observer where it builds; "0" or unset: Python
LIBRARY = native_build.NativeLibrary("libstreamcheck_record.so", Path(__file__).with_name("observer.cpp"),
                                     python=True, headers=(Path(__file__).parents[2] / "core" / "native" / "frames.h",))

# torch_ops.native_description's flags (observer.cpp's OpFlag).
VIEW, MATH, AUTOCAST, NO_ACCESS, LAYOUT_ONLY, COPY, SPECIAL, READING, HOST_OUTPUT, IGNORED, CUSTOM = (
    1 << i for i in range(11))
# A record's flags (observer.cpp's RecordFlag) and an access's roles.
STREAM_BEFORE, HAS_STREAM, SPECIAL_RECORD, TRACE_RECORD = 1, 2, 4, 8
READ, WRITTEN, FRESH = 0, 1, 2
# c10::DeviceType of the devices it can observe.
DEVICE_TYPES = {"cpu": 0, "cuda": 1}


class Observer:
    """The library's C functions (ctypes.PyDLL: called with the GIL held)."""

    def __init__(self, path: Path):
        lib = ctypes.PyDLL(str(path))
        obj = ctypes.py_object

        def f(name, restype, *argtypes):
            function = getattr(lib, f"streamcheck_native_{name}")
            function.restype, function.argtypes = restype, list(argtypes)
            return function

        self.path = path
        self._enable = f("enable", ctypes.c_int, ctypes.c_int, obj, obj, obj, obj, ctypes.c_int)
        self.disable = f("disable", None)
        self.stream_handles = f("stream_handles", ctypes.c_int)
        self.observe_thread = f("observe_thread", ctypes.c_int, ctypes.c_int)
        self.thread_has_callbacks = f("thread_has_callbacks", ctypes.c_int)
        self.pause = f("pause", None, ctypes.c_int)
        self._take = f("take", ctypes.c_int, obj)
        self.drain = f("drain", ctypes.c_int, obj)
        self.waiting = ctypes.c_uint64.in_dll(lib, "streamcheck_native_waiting")  # .value: records not yet taken
        self._stack = f("stack", ctypes.c_int, ctypes.c_uint, obj)
        self.reset_stacks = f("reset_stacks", None)
        self._frames_here = f("frames_here", ctypes.c_int, obj)
        # trace_hook(kind, fire, others, callback): a callable to stand for a GPU-trace registry's fire_callbacks (its
        # kind's callbacks become records of the buffer; the registry's own `fire` runs after while `others` is not
        # empty; an allocator callback it cannot defer goes to `callback`, torch_runtime's).
        self.trace_hook = f("trace_hook", obj, ctypes.c_int, obj, obj, obj)

    def enable(self, device: str, describe, classify, begin, end, depth: int) -> None:
        """Record operators on tensors of `device` ("cuda"; "cpu" for tests) on the threads that
        call observe_thread(1). Python's functions: describe(name, overload) -> (index, flags,
        written, device argument) or None; classify(code) -> its kind (SiteResolver.code_kind);
        begin() and end(ok) around a special operator that may wait; `depth`: the user's frames kept."""
        self._enable(DEVICE_TYPES[device], describe, classify, begin, end, depth)

    def take(self) -> list:
        """The records made since the last take, in issue order: (op index, thread ident, stream,
        device, stack id, flags, special slot, accesses), an access (lo, hi, storage, storage bytes,
        device, role)."""
        out: list = []
        self._take(out)
        return out

    # drain(lane): the records made since the last take turned into trace records, the ordinary operators that
    # the recorder's tables answer for in C++, the others by lane's Python (torch_native.NativeRecording._lane).

    def stack(self, stack_id: int) -> Optional[tuple]:
        """((code, offset), ...) innermost first, and the user's frame's index (-1: none); None for no stack."""
        out: list = []
        self._stack(stack_id, out)
        return out[0] if out else None

    def frames_here(self) -> list:
        out: list = []
        self._frames_here(out)
        return out


_observer: Optional[Observer] = None
_failure: str = ""


def unavailable_reason() -> str:
    """Why this process records torch operators through the Python path ('' where it need not)."""
    if os.environ.get(SWITCH) == "0":
        return f"{SWITCH}=0 turned it off"
    if _observer is None and not _failure:
        load()
    return _failure


def load() -> Optional[Observer]:
    """The observer, built and loaded once per process; None where it cannot be had (the reason:
    unavailable_reason). Needs torch imported (the library links to its libraries)."""
    global _observer, _failure
    if os.environ.get(SWITCH) == "0":
        return None
    if _observer is not None or _failure:
        return _observer
    try:
        path = native_build.build(LIBRARY)
        observer = Observer(path)
    except NativeUnavailable as exc:
        _failure = str(exc)
        return None
    except OSError as exc:  # the library does not load against this torch
        _failure = f"its library did not load ({exc})"
        return None
    if not reads_frames(observer.frames_here):
        _failure = (f"it cannot read the frames of this Python ({sys.version.split()[0]}) as Python does: "
                    "call sites would be wrong")
        return None
    _observer = observer
    return observer


__all__ = ["Observer", "load", "unavailable_reason", "NativeUnavailable", "SWITCH"]
