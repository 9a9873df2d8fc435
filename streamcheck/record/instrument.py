"""Whole-program mode: record what an unmodified CuPy program asks of the GPU, and check it.

    with streamcheck.instrument() as session:
        main()
    print(session.report())

or, for a whole script, `streamcheck run script.py` (streamcheck/commands/run.py).

While a session is active, the library adapters (streamcheck/record/adapters/, one module per area:
streams and events, graphs, kernels, ndarray methods, module functions, the allocator, host
threads) wrap CuPy's Python entry points; each call becomes trace records through the one
recorder (streamcheck/record/recorder.py), checked as they happen by the happens-before checker.
What it cannot see, and how to declare it, is in docs/instrument.md.

Importing this module imports neither cupy nor torch: they load when a session starts.
"""
from __future__ import annotations

import functools
import sys
import threading
import types
from typing import Optional

from . import recorder as R
from .adapters import install
from .adapters.patching import ImportWatcher
from .gpu import MAX_DELAY_US, cuda_device_present, external_stream, is_suppressed, suppressed, warm_up
from .kernel_access import declare_kernel, kernel_signature  # noqa: F401 (public here too)
from .recorder import Recorder, captured_work, format_capture_errors  # noqa: F401 (public here too)

__all__ = ["instrument", "start", "stop", "active", "current_session", "suppressed", "declare_access",
           "declare_kernel", "torch_stream", "Session", "InstrumentError", "format_capture_errors"]


class InstrumentError(RuntimeError):
    """instrument() cannot run here (no GPU, nested sessions); the message says what to do."""


class Session(Recorder):
    """A recording of a GPU program: the recorder on CUDA (adapters.cuda_device.CudaGpu), with
    the adapters of the libraries it uses (CuPy, torch) patched in while it is active."""

    def __init__(self, *, delay_us: float = 0.0, delay_streams=(), delay_kernels=(), seed: int = 0,
                 check: bool = True, probe=None, strict_free: bool = False):
        from .adapters.cuda_device import CudaGpu

        if not isinstance(delay_us, (int, float)) or not 0 <= delay_us <= MAX_DELAY_US:
            raise InstrumentError(f"instrument: delay_us must be in [0, {MAX_DELAY_US}] µs (the spin kernel's cap), "
                                  f"got {delay_us!r}")
        libraries = loaded_libraries()
        if not ({"cupy", "torch"} & set(libraries)):
            raise InstrumentError("streamcheck.instrument: neither CuPy nor torch is installed; install "
                                  "'streamcheck[gpu]' (CuPy) or a CUDA build of torch")
        super().__init__(CudaGpu(libraries.get("cupy"), libraries.get("torch")), delay_us=delay_us,
                         delay_streams=delay_streams, delay_kernels=delay_kernels, seed=seed, check=check,
                         strict_free=strict_free)
        self.libraries = set(libraries)
        self.patcher = None
        self.started_at = self.site()
        self.started_by = threading.current_thread()
        if probe is not None:  # a race-confirmation rerun (confirm_gpu.Probe)
            self.set_probe(probe)

    def library_loaded(self, name: str, module) -> None:
        """The program imported `name` (cupy, torch) after the recording started: adapt it too."""
        if name in self.libraries or self.patcher is None:
            return
        self.libraries.add(name)
        self.gpu.add_library(name, module)
        self.refresh_library_dirs()
        install(self, {name}, self.patcher)

    def warm_up(self, pool_bytes: int = 64 << 20) -> None:
        """Get implicit synchronizations out of the way before the program runs (gpu.warm_up);
        record each as such."""
        gpu = self.gpu
        for reason in warm_up(cupy=gpu.cupy, torch=gpu.torch, spin=self.intercepts, pool_bytes=pool_bytes):
            self.implicit(f"warm-up: {reason}")


def loaded_libraries() -> dict:
    """The GPU libraries a recording adapts: CuPy if installed (imported now: cheap, and the
    program's CuPy calls are what is recorded), torch if the program already imported it (a
    recording never imports torch itself)."""
    import importlib.util

    found = {}
    if "cupy" in sys.modules or importlib.util.find_spec("cupy") is not None:
        try:
            import cupy

            found["cupy"] = cupy
        except ImportError:
            pass
    for name in ("torch", "triton"):
        if name in sys.modules:
            found[name] = sys.modules[name]
    return found


def active() -> bool:
    """Whether a session is recording now."""
    return isinstance(R.current, Session)


def current_session() -> Optional[Session]:
    rec = R.current
    return rec if isinstance(rec, Session) else None


def start(*, delay_us: float = 0.0, delay_streams=(), delay_kernels=(), seed: int = 0, warm_up: bool = True,
          check: bool = True, probe=None, edits=None, on_start=None, strict_free: bool = False) -> Session:
    """Begin recording (see instrument()). Raises InstrumentError without a GPU or if a session
    is already active."""
    running = R.current
    if running is not None:
        where = getattr(running, "started_at", None)
        raise InstrumentError("streamcheck.instrument: a session is already recording"
                              + (f" (started at {where})" if where else "")
                              + "; stop it first (sessions do not nest)")
    from ..device import backends

    if not backends.gpu_available() and not cuda_device_present():
        raise InstrumentError("streamcheck.instrument needs an NVIDIA GPU and CuPy (pip install "
                              "'streamcheck[gpu]') or a CUDA build of torch; none found here. The device API's sim "
                              "backend (Device('sim')) checks stream programs on the CPU.")
    session = Session(delay_us=delay_us, delay_streams=delay_streams, delay_kernels=delay_kernels, seed=seed,
                      check=check, probe=probe, strict_free=strict_free)
    session.patcher = install(session, session.libraries)
    session.activate()
    if warm_up:
        session.warm_up()
    if edits is not None:  # the sync audit's proof rerun: the program's syncs, not the warm-up's
        edits.start(session.trace.ops)
        session.edits = edits
    if on_start is not None:  # the program's own work starts now (streamcheck run --time-script)
        on_start()
    return session


def stop() -> Optional[Session]:
    """Stop recording, undo every patch, and return the session (None if none was active).
    While the thread that started it runs, only that thread may stop it: its work may still
    be recording."""
    session = current_session()
    if session is None:
        return None
    owner = session.started_by
    if owner is not threading.current_thread() and owner.is_alive():
        raise InstrumentError(f"streamcheck.instrument: stop() called from another thread than the one that "
                              f"started the session at {session.started_at}, which still runs; stop it from that "
                              "thread (or use `with streamcheck.instrument():` there)")
    session.deactivate()
    session.patcher.restore()
    return session


class StartAtImport(ImportWatcher):
    """Start recording when the program imports CuPy or torch, not before (`streamcheck run`);
    triton, imported before or after, joins the recording:
    CuPy reads its environment (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM, ...) at import, and a
    program may set it first. The finder lets the normal import run, then starts the session;
    when the other library is imported later, the session adapts it too. `session` stays None
    if the program imports neither."""

    def __init__(self, **options):
        self.options = options
        self.session: Optional[Session] = None
        waiting = [name for name in ("cupy", "torch", "triton") if name not in sys.modules]
        if not {"cupy", "torch"} <= set(waiting):  # one is loaded already (e.g. by a sitecustomize): start now
            self.session = start(**options)
        super().__init__({name: functools.partial(self.imported, name) for name in waiting})

    def imported(self, name: str, module) -> None:
        if self.session is not None:
            self.session.library_loaded(name, module)
        elif name != "triton":  # triton alone launches nothing: it joins when torch or CuPy starts
            self.session = start(**self.options)


class instrument:
    """Record and check the CuPy work issued inside the block; yields the Session.

    delay_us: spin this long (bounded, ≤ 50 ms) on targeted streams before each launch/copy,
    so that races strike. delay_streams: short stream names to target ("legacy", "s1", "s2", ...
    in creation order, "ptds<thread>", "torch", or "all"); none named: seed-chosen (an
    independent coin per (seed, stream), the sim's rule). delay_kernels: only before these
    kernels (library calls by their label: "cupy.matmul", "cupy.fft.fft", ...).
    warm_up: get implicit syncs out of the way first. strict_free: a free while another stream
    may still use the memory is a FREE race even if no allocation gets its bytes (default: a
    hazard, session.hazards; core.trace.Free)."""

    def __init__(self, *, delay_us: float = 0.0, delay_streams=(), delay_kernels=(), seed: int = 0,
                 warm_up: bool = True, strict_free: bool = False):
        self._options = dict(delay_us=delay_us, delay_streams=delay_streams, delay_kernels=delay_kernels, seed=seed,
                             warm_up=warm_up, strict_free=strict_free)

    def __enter__(self) -> Session:
        return start(**self._options)

    def __exit__(self, *exc) -> bool:
        stop()
        return False


def declare_access(reads=(), writes=(), *, stream=None, name: str = "declared access") -> None:
    """Record work streamcheck cannot see (torch ops, kernels launched through ctypes or
    another library) as a launch on `stream` (a CuPy or torch stream; None: CuPy's current
    stream) reading `reads` and writing `writes` (CuPy arrays or __cuda_array_interface__
    objects such as torch tensors). Does nothing when no session is recording."""
    rec = R.current
    if rec is None or is_suppressed():
        return
    rec.declare(reads, writes, stream=stream, name=name)


def torch_stream():
    """torch's current stream as a CuPy stream, to use as the caller's stream of CuPy code
    inside a torch model: `with torch_stream(): flashnorm(x)`."""
    import cupy
    import torch

    ptr = torch.cuda.current_stream().cuda_stream
    rec = R.current
    if rec is not None and ptr != 0:  # `--delay-stream torch` targets it (the legacy stream keeps its name)
        if rec.knows_stream(ptr):
            rec.alias_stream(rec.sid(ptr), "torch")
        else:
            rec.register_stream(ptr, rec.site(), short="torch")
    return external_stream(cupy, ptr)


class _InstrumentModule(types.ModuleType):
    """`streamcheck.instrument` is both this module and the context manager: importing the
    submodule rebinds the package attribute to the module, so the module itself is callable."""

    def __call__(self, **kwargs):
        return instrument(**kwargs)


sys.modules[__name__].__class__ = _InstrumentModule
