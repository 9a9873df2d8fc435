"""Autograd on the emulation, through the native CUDA guard (native/) when this process has it.

With it, torch's engine runs backward passes on emulated tensors as CUDA would: a graph node keeps
the stream current at its forward operator (the guard's current stream is the emulation's), each
backward operator runs on that stream, the engine's syncs between streams are sim events and
waits, and the backward call as a whole ends with the caller's current stream waiting for the
leaves' streams (PyTorch docs, "Stream semantics of backward passes"). The engine runs a device's
backward operators on its own thread while the caller waits: the sim records that thread's calls
as the caller's host thread, at the backward() line when no user frame (a hook, a Function's
backward) is on its stack.

Without it, autograd cannot run here (the engine would abort the process): `backward()`,
`torch.autograd.backward/grad` and `Function.apply` on tensors that require grad are refused in
one line that says why, and forward operators on such tensors run as under no_grad (factory_mode).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Optional

import torch

from ..device.objects import caller_site
from . import cuda_kernels, native
from .running import EmulationError
from .tensors import is_emulated


class Autograd:
    """One emulation's autograd: the guard's callbacks, the backward calls in progress."""

    def __init__(self, emulation):
        self.emulation = emulation
        self.library = native.library()  # None: not loaded, autograd refused
        self._events: dict = {}  # the guard's event id -> (sim event, trace index of its last record)
        self._next_event = 1
        self.calls: list = []  # the backward calls in progress, innermost last (a reentrant one nests)
        self._error: Optional[BaseException] = None  # what a callback raised, for its backward call
        self._engine_used = False  # a backward call ran: the engine's threads may hold this run's objects

    @property
    def enabled(self) -> bool:
        return self.library is not None

    def start(self) -> None:
        lib = self.library
        if lib is None:
            return
        lib.reset_thread()
        lib.set_devices(self.emulation.device.devices)
        lib.set_callbacks((self._record_event, self._block_event, self._query_event, self._synchronize_event,
                           self._query_stream, self._synchronize_stream, self._synchronize_device,
                           self._elapsed_time))

    def stop(self) -> None:
        lib = self.library
        if lib is None:
            return
        try:
            if self._engine_used:
                _drain_engine_threads(self.emulation.device.devices)
        finally:
            lib.set_devices(0)
            lib.set_callbacks(None)
            lib.reset_thread()
            self._events.clear()

    # --- the patched surface ---------------------------------------------------------------
    def patch(self, put) -> None:
        if self.library is None:
            self._patch_refusals(put)
            return
        original = torch.autograd._engine_run_backward

        def run_backward(*args, **kwargs):
            return self.run_backward(original, args, kwargs)
        put(torch.autograd, "_engine_run_backward", run_backward)

    def run_backward(self, original, args, kwargs):
        """torch's engine on a backward() / torch.autograd.grad call, the caller's thread and line
        kept for the engine's own thread, a callback's exception raised as itself."""
        emulation = self.emulation
        emulation.enter()
        devices = emulation.device.devices
        if devices > self.library.guard_devices:
            raise EmulationError(f"backward at {caller_site()} with {devices} emulated devices: the emulation's "
                                 f"autograd drives {self.library.guard_devices} at most; use fewer --devices")
        call = _BackwardCall(threading.get_ident(), emulation.device.host_thread(), caller_site())
        self.calls.append(call)
        self._error = None
        self._engine_used = True
        try:
            with cuda_kernels.registered():  # the engine's own C++ makes CUDA tensors (undefined grads)
                return original(*args, **kwargs)
        except BaseException:
            # The engine wakes the caller before its thread has let go of the failed task (and the
            # Python objects it holds): an exit now would end that thread inside C++ (an abort).
            _drain_engine_threads(devices)
            error, self._error = self._error, None
            if error is not None:
                raise error from None
            raise
        finally:
            self.calls.remove(call)

    def _patch_refusals(self, put) -> None:
        reason = native.unavailable_reason()

        def refuse(what: str):
            raise EmulationError(f"{what} at {caller_site()}: autograd on the sim needs streamcheck's native CUDA "
                                 f"guard, and this run has none ({reason}); check the forward pass here, or the "
                                 "backward pass on a GPU (streamcheck run --backend gpu)")
        def refused_on_emulated(what: str, original):
            # CPU tensors' autograd needs no CUDA guard: it runs as ever.
            def call(*args, **kwargs):
                if _any_emulated((*args, *kwargs.values())):
                    refuse(what)
                return original(*args, **kwargs)
            return call
        # One function object per name: Dynamo's trace rules refuse one object under two names.
        put(torch.Tensor, "backward", refused_on_emulated("backward()", torch.Tensor.backward))
        put(torch.autograd, "backward", refused_on_emulated("torch.autograd.backward", torch.autograd.backward))
        put(torch.autograd, "grad", refused_on_emulated("torch.autograd.grad", torch.autograd.grad))
        function = torch.autograd.Function
        original_apply = function.__dict__["apply"].__func__

        def apply(cls, *args, **kwargs):
            # A graph node on an emulated tensor asks for a CUDA stream: the engine would abort.
            if torch.is_grad_enabled() and any(is_emulated(v) and v.requires_grad
                                               for v in (*args, *kwargs.values())):
                refuse(f"{cls.__name__}.apply")
            return original_apply(cls, *args, **kwargs)
        put(function, "apply", classmethod(apply))

    @staticmethod
    def no_grad_notice() -> str:
        return ("autograd is not emulated in this run (" + native.unavailable_reason() + "): operators on tensors "
                "that require grad ran as under torch.no_grad() (their results do not require grad), and backward() "
                "is refused; check the backward pass on a GPU")

    # --- the engine's thread -----------------------------------------------------------------
    def engine_thread(self):
        """A context for a call from the engine's device thread during a backward call: recorded as
        the caller's host thread, at the backward() line unless a user frame is on the stack. A
        no-op on the caller's own thread (and outside backward calls)."""
        calls = self.calls
        if not calls:
            return contextlib.nullcontext()
        call = calls[-1]
        ident = threading.get_ident()
        if ident == call.ident:
            return contextlib.nullcontext()
        if ident not in call.adopted:
            self.emulation.device.issue_as(call.host_thread)
            call.adopted.add(ident)
        return caller_site.fallback(call.site)

    # --- the guard's callbacks (called from C++, each holding the GIL) -----------------------
    def _callback(self, body, *args):
        """Runs a callback's body; an exception is kept for the backward call (the C++ side
        throws a c10::Error with its text), and -1 returned."""
        try:
            with self.engine_thread():
                self.emulation.enter()
                return body(*args)
        except BaseException as exc:  # noqa: B902 - it must not cross into C++
            if self._error is None:
                self._error = exc
            self.library.set_error(f"{type(exc).__name__}: {exc}".encode(errors="replace"))
            return -1

    def _stream(self, device: int, stream_id: int):
        return self.emulation.stream_by_id(device, stream_id).device_stream

    def _record_event(self, event: int, device: int, stream_id: int) -> int:
        def body():
            nonlocal event
            for destroyed in iter(self.library.pop_destroyed, 0):
                self._events.pop(destroyed, None)  # the sim keeps its events; the guard's id is forgotten
            if event == 0:
                event = self._next_event
                self._next_event += 1
                self._events[event] = (self.emulation.device.event(name="autograd"), None)
            sim_event = self._events[event][0]
            sim_event.record(self._stream(device, stream_id))
            self._events[event] = (sim_event, len(self.emulation.device.trace) - 1)
            return event
        return self._callback(body)

    def _block_event(self, event: int, device: int, stream_id: int) -> int:
        def body():
            self._stream(device, stream_id).wait_event(self._events[event][0])
            return 0
        return self._callback(body)

    def _query_event(self, event: int) -> int:
        return self._callback(lambda: int(self._events[event][0].query()))

    def _synchronize_event(self, event: int) -> int:
        def body():
            self._events[event][0].synchronize()
            return 0
        return self._callback(body)

    def _query_stream(self, device: int, stream_id: int) -> int:
        return self._callback(lambda: int(self._stream(device, stream_id).query()))

    def _synchronize_stream(self, device: int, stream_id: int) -> int:
        def body():
            self._stream(device, stream_id).synchronize()
            return 0
        return self._callback(body)

    def _synchronize_device(self, device: int) -> int:
        def body():
            self.emulation.synchronize(device)
            return 0
        return self._callback(body)

    def _elapsed_time(self, start: int, stop: int) -> float:
        def body():
            first, last = (self.emulation.record_time(self._events[e][1]) for e in (start, stop))
            if first is None or last is None:
                raise RuntimeError("CUDA error: device not ready (an event has not completed; synchronize it first)")
            return (last - first) / 1000.0
        return float(self._callback(body))


class HostToDevice(torch.autograd.Function):
    """`x.cuda()` / `x.to("cuda")` of a host tensor that requires grad: a graph node whose backward
    copies the gradient back to the host, as torch's copy between devices does."""

    @staticmethod
    def forward(ctx, source, emulation, index, dtype, non_blocking):
        ctx.source_dtype = source.dtype
        return emulation.to_device(source.detach(), index, dtype, non_blocking)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(device="cpu", dtype=ctx.source_dtype), None, None, None, None


class _Probe(torch.Tensor):
    """A one-element tensor on cuda:N that the emulation never sees (its operators run on meta
    tensors): a backward of it is a task for the engine's thread of that device that records nothing."""

    @staticmethod
    def __new__(cls, index: int, requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(cls, (1,), dtype=torch.float32, device=torch.device("cuda", index),
                                                   requires_grad=requires_grad)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        index = next(a.device.index for a in args if isinstance(a, _Probe))

        def meta(value):
            if isinstance(value, _Probe):
                return torch.empty(1, device="meta")
            return torch.device("meta") if isinstance(value, torch.device) else value
        out = func(*map(meta, args), **{k: meta(v) for k, v in (kwargs or {}).items()})
        return _Probe(index) if isinstance(out, torch.Tensor) else out


_probes: dict = {}  # device index -> (leaf, gradient): kept, so the engine's thread never frees them


def _drain_engine_threads(devices: int) -> None:
    """Returns once each device's engine thread finished what it was doing: a backward of a probe
    queued behind it. Run before the caller may exit, so the thread is idle, holding nothing."""
    run_backward = torch.autograd.graph._engine_run_backward  # torch's, not the emulation's wrapper
    for index in range(devices):
        if index not in _probes:
            _probes[index] = (_Probe(index, requires_grad=True), _Probe(index))
        leaf, gradient = _probes[index]
        leaf.grad = None
        run_backward((leaf,), (gradient,), False, False, (), allow_unreachable=True, accumulate_grad=True)


class _BackwardCall:
    """One backward() / torch.autograd.grad call in progress: its caller's thread and line."""

    __slots__ = ("ident", "host_thread", "site", "adopted")

    def __init__(self, ident: int, host_thread: int, site):
        self.ident = ident
        self.host_thread = host_thread
        self.site = site
        self.adopted: set = set()  # the engine threads whose calls are recorded as the caller's


def _any_emulated(values) -> bool:
    """Whether an emulated tensor is among `values` (one level into lists and tuples)."""
    for value in values:
        if is_emulated(value):
            return True
        if isinstance(value, (list, tuple)) and any(is_emulated(v) for v in value):
            return True
    return False
