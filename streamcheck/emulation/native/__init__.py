"""The emulation's native half: cuda_guard.cpp, a CUDA device guard and CUDA hooks for a CPU-only
torch, so that torch's autograd engine runs on emulated cuda tensors (a CPU-only build has no CUDA
guard, and the engine aborts the process when it asks for one).

Torch reads its CUDA hooks once, at its import: the library must be in the process before torch,
so `streamcheck run --backend sim` and an emulated pytest run re-exec themselves with it in
LD_PRELOAD (`reexec_with_library`). It is built by streamcheck/native_build.py (the machine's C++
compiler against the installed torch's headers, a few seconds, once per torch and source, cached).
Nothing here imports torch, so a process about to re-exec pays nothing for it.

Where it cannot be had (no compiler, a CUDA build of torch, STREAMCHECK_NATIVE=0), the emulation
refuses backward() in one line that says why (`unavailable_reason`).
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Optional

from ... import native_build
from ...native_build import NativeUnavailable

SOURCE = Path(__file__).with_name("cuda_guard.cpp")
LIBRARY_NAME = "libstreamcheck_cuda_guard.so"
LIBRARY = native_build.NativeLibrary(LIBRARY_NAME, SOURCE)
SWITCH = "STREAMCHECK_NATIVE"  # "0": never build or preload it
PRELOADED = "STREAMCHECK_NATIVE_PRELOADED"  # set in the re-exec's environment: one re-exec, never a loop
UNAVAILABLE = "STREAMCHECK_NATIVE_UNAVAILABLE"  # why a run goes on without it (for the refusal's line)
_SYMBOL = "streamcheck_native_version"


def loaded() -> bool:
    """Whether the library is in this process (preloaded: the only way it takes effect)."""
    try:
        return hasattr(ctypes.CDLL(None), _SYMBOL)
    except OSError:  # pragma: no cover - dlopen(NULL) does not fail on Linux
        return False


def unavailable_reason() -> str:
    """Why this process runs without the library: what its launcher found, or what is missing."""
    if loaded():
        return ""
    given = os.environ.get(UNAVAILABLE)
    if given:
        return given
    if os.environ.get(SWITCH) == "0":
        return f"{SWITCH}=0 turned it off"
    return ("this process was not started with it (`streamcheck run --backend sim` and pytest "
            "--streamcheck-emulate-cuda load it before torch)")


def library_path() -> Path:
    """Where the library for this torch and this source is (built or not)."""
    return native_build.library_path(LIBRARY)


def _check_cpu_build(torch_dir: Path) -> None:
    lib = torch_dir / "lib"
    if any(lib.glob("libc10_cuda*")) or any(lib.glob("libc10_hip*")):
        raise NativeUnavailable("torch here is a CUDA build, whose own CUDA guard would serve the emulation's tensors; "
                                "the emulation's autograd needs a CPU-only torch")


def build() -> Path:
    """The library, built now unless the cache has it (native_build.build)."""
    return native_build.build(LIBRARY, before_building=_check_cpu_build)


def preload_environment(path: Path, environ=None) -> dict:
    """`environ` (default os.environ) with the library preloaded and the re-exec marked."""
    env = dict(os.environ if environ is None else environ)
    previous = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{path} {previous}".strip() if previous else str(path)
    env[PRELOADED] = "1"
    env.pop(UNAVAILABLE, None)
    return env


def reexec_with_library(argv) -> str:
    """Replace this process with `argv` run with the library preloaded (os.execve: no return).
    Returns instead, with '' when the library is loaded already, or the one-line reason it cannot
    be had (also left in the environment, so the emulation's refusal says it)."""
    if loaded():
        return ""
    if os.environ.get(SWITCH) == "0":
        return _unavailable(f"{SWITCH}=0 turned it off")
    if os.environ.get(PRELOADED):
        return _unavailable("it was preloaded but did not load (LD_PRELOAD ignored it)")
    if sys.platform != "linux":
        return _unavailable("it is built and preloaded on Linux only")
    try:
        path = build()
    except NativeUnavailable as exc:
        return _unavailable(str(exc))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.execve(sys.executable, [sys.executable, *argv], preload_environment(path))
    return ""  # pragma: no cover - execve does not return


def _unavailable(reason: str) -> str:
    os.environ[UNAVAILABLE] = reason
    return reason


def python_argv() -> list:
    """This interpreter's arguments after its own name (`-m pytest ...`, `script.py ...`), as given."""
    return list(getattr(sys, "orig_argv", [sys.executable, *sys.argv])[1:])


class Library:
    """The library's C functions (ctypes), once it is loaded."""

    def __init__(self):
        lib = ctypes.CDLL(None)
        self.guard_devices = lib.streamcheck_native_guard_devices()
        self.set_devices = _function(lib.streamcheck_native_set_devices, None, ctypes.c_int)
        self.current_device = _function(lib.streamcheck_native_current_device, ctypes.c_int)
        self.set_current_device = _function(lib.streamcheck_native_set_current_device, ctypes.c_int, ctypes.c_int)
        self.current_stream = _function(lib.streamcheck_native_current_stream, ctypes.c_int64, ctypes.c_int)
        self.set_current_stream = _function(lib.streamcheck_native_set_current_stream, ctypes.c_int, ctypes.c_int,
                                            ctypes.c_int64)
        self.reset_thread = _function(lib.streamcheck_native_reset_thread, None)
        self.set_error = _function(lib.streamcheck_native_set_error, None, ctypes.c_char_p)
        self.pop_destroyed = _function(lib.streamcheck_native_pop_destroyed, ctypes.c_int64)
        self._set_callbacks = _function(lib.streamcheck_native_set_callbacks, None, *[ctypes.c_void_p] * 8)
        self._callbacks = ()  # the CFUNCTYPE objects: alive while the library may call them

    # The callbacks' C types, in streamcheck_native_set_callbacks' order.
    CALLBACK_TYPES = (
        ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int64),  # record_event
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int64),  # block_event
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64),  # query_event
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64),  # synchronize_event
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int64),  # query_stream
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int64),  # synchronize_stream
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int),  # synchronize_device
        ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_int64, ctypes.c_int64),  # elapsed_time
    )

    def set_callbacks(self, functions) -> None:
        """Python functions for the guard's events and synchronizes (None: clear them)."""
        if functions is None:
            self._set_callbacks(*[None] * len(self.CALLBACK_TYPES))
            self._callbacks = ()
            return
        made = tuple(kind(f) for kind, f in zip(self.CALLBACK_TYPES, functions))
        self._set_callbacks(*[ctypes.cast(f, ctypes.c_void_p) for f in made])
        self._callbacks = made


def _function(f, restype, *argtypes):
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_library: Optional[Library] = None


def library() -> Optional[Library]:
    """The loaded library's functions, or None where it is not loaded."""
    global _library
    if _library is None and loaded():
        _library = Library()
    return _library
