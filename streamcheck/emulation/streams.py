"""torch.cuda's streams and events on the sim, and the `stream(s)` / `device(i)` contexts."""
from __future__ import annotations

import torch

from ..device.objects import caller_site
from .running import EmulationError, active

# Made-up raw handles (`cuda_stream`, `cuda_event`): distinct, nonzero, never dereferenced on the sim.
_STREAM_HANDLE_BASE = 0x5C0000
_EVENT_HANDLE_BASE = 0x5E0000
# torch.cuda.Stream.priority_range() on an sm_90 GPU under torch: (lowest, highest); lower is more urgent.
PRIORITY_RANGE = (0, -3)


class EmulatedStream:
    """torch.cuda.Stream on the sim: one device stream."""

    def __init__(self, emulation, device_stream, priority: int = 0):
        self._emulation = emulation
        self.device_stream = device_stream
        self.device_index = device_stream.device_index
        self.device = torch.device("cuda", self.device_index)
        self.priority = priority
        self.stream_id = device_stream.id
        self.device_type = 1  # CUDA's DeviceType
        # The legacy default stream's handle is 0 (cudaStreamLegacy's null handle), as torch reports it.
        self.cuda_stream = 0 if device_stream.id == 0 else _STREAM_HANDLE_BASE + device_stream.id

    @property
    def native_handle(self) -> int:
        return self.cuda_stream

    def __cuda_stream__(self) -> tuple:
        """The CUDA stream protocol (version 0, the handle), as libraries exchange streams."""
        return 0, self.cuda_stream

    @staticmethod
    def priority_range() -> tuple:
        return PRIORITY_RANGE

    def is_capturing(self) -> bool:
        tracker = self._emulation.device.capture_tracker
        return bool(tracker.active and tracker.capturing(self.device_stream.id) is not None)

    def wait_event(self, event) -> None:
        self._emulation.enter()
        event._wait(self)

    def wait_stream(self, stream) -> None:
        # torch: record an event on `stream` now, then wait for it (covers work issued so far).
        self._emulation.enter()
        with caller_site.held(caller_site()):  # one user call, three device calls: one site
            marker = self._emulation.device.event(name="wait_stream")
            marker.record(stream.device_stream)
            self.device_stream.wait_event(marker)

    def record_event(self, event=None):
        event = event if event is not None else EmulatedEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        self._emulation.enter()
        return self.device_stream.query()

    def synchronize(self) -> None:
        self._emulation.enter()
        self.device_stream.synchronize()

    def __enter__(self):
        self._context = stream(self)
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def __eq__(self, other) -> bool:
        return isinstance(other, EmulatedStream) and other.device_stream is self.device_stream

    def __hash__(self) -> int:
        return hash(self.device_stream.id)

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x} (sim: " \
               f"{self.device_stream.name})>"


class _StreamType(type):
    """torch.cuda.Stream while emulating: a call makes an emulated stream; `isinstance` is true of them."""

    def __call__(cls, device=None, priority=0, **kwargs):
        if kwargs.get("stream_ptr") is not None or kwargs.get("stream_id") is not None:
            raise EmulationError(f"torch.cuda.Stream(stream_id=...) at {caller_site()}: the sim makes its own "
                                 "streams; create one with torch.cuda.Stream()")
        return active().new_stream(device, priority)

    def __instancecheck__(cls, obj):
        return isinstance(obj, EmulatedStream)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, EmulatedStream)


class Stream(metaclass=_StreamType):
    """torch.cuda.Stream while emulating (`torch.cuda.Stream(device=None, priority=0)`)."""

    priority_range = staticmethod(EmulatedStream.priority_range)


class EmulatedEvent:
    """torch.cuda.Event on the sim."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False):
        self._emulation = active()
        self._event = None  # created at the first record, as torch creates cudaEvent_t lazily
        self._record_index = None  # the trace index of its last record
        self._device_index = None  # the device of the stream it was last recorded on
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.interprocess = interprocess
        # external=True makes a capture record (and wait for) the event as a graph node that other
        # work can see: the sim's capture records and waits for events as it does eagerly.
        self.external = external

    @property
    def device(self):
        index = self._device_index if self._device_index is not None else self._emulation.current_device()
        return torch.device("cuda", index)

    @property
    def cuda_event(self) -> int:
        """The raw handle: 0 until the first record creates the event (torch creates it lazily)."""
        return 0 if self._event is None else _EVENT_HANDLE_BASE + self._event.id

    event_id = cuda_event

    def ipc_handle(self, *args, **kwargs):
        raise EmulationError(f"torch.cuda.Event.ipc_handle at {caller_site()}: sharing an event with another "
                             "process is not emulated (each emulated process has its own sim device); check this "
                             "program on a GPU (streamcheck run --backend gpu)")

    @classmethod
    def from_ipc_handle(cls, *args, **kwargs):
        raise EmulationError(f"torch.cuda.Event.from_ipc_handle at {caller_site()}: an event of another process "
                             "does not exist on the sim; check this program on a GPU (streamcheck run --backend gpu)")

    def _device_event(self):
        if self._event is None:
            self._event = self._emulation.device.event()
        return self._event

    def record(self, stream=None) -> None:
        emulation = self._emulation
        emulation.enter()
        stream = stream if stream is not None else emulation.current_stream()
        self._device_event().record(stream.device_stream)
        self._device_index = stream.device_index
        self._record_index = len(emulation.device.trace) - 1  # its EventRecord: the sim times it by index

    def _wait(self, stream) -> None:
        if self._event is not None:  # waiting on a never-recorded event is a no-op (CUDA)
            stream.device_stream.wait_event(self._event)

    def wait(self, stream=None) -> None:
        self._emulation.enter()
        self._wait(stream if stream is not None else self._emulation.current_stream())

    def query(self) -> bool:
        self._emulation.enter()
        return True if self._event is None else self._event.query()

    def synchronize(self) -> None:
        self._emulation.enter()
        if self._event is not None:
            self._event.synchronize()

    def elapsed_time(self, end) -> float:
        """Sim time between the two records, in milliseconds of 1 µs per scheduler step."""
        emulation = self._emulation
        emulation.enter()
        # torch's checks, in its order and with its exception types (c10/cuda/CUDAEvent.h).
        if not self.enable_timing or not end.enable_timing:
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._event is None or end._event is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        start, stop = emulation.record_time(self._record_index), emulation.record_time(end._record_index)
        if start is None or stop is None:
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (stop - start) / 1000.0

    def __repr__(self) -> str:
        return "<torch.cuda.Event (sim)>" if self._event is None else f"<torch.cuda.Event (sim: {self._event.name})>"



class stream:
    """torch.cuda.stream(s) on the sim: `s` is the current stream (of its device) inside."""

    def __init__(self, s):
        self.s = s

    def __enter__(self):
        if self.s is None:
            return None
        emulation = active()
        self._previous = emulation.current_stream(self.s.device_index)
        self._device = emulation.current_device()
        emulation.set_current_device(self.s.device_index)
        emulation.set_current_stream(self.s)
        return self.s

    def __exit__(self, *exc):
        if self.s is None:
            return
        emulation = active()
        emulation.set_current_stream(self._previous)
        emulation.set_current_device(self._device)


class device:
    """torch.cuda.device(i) on the sim."""

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        emulation = active()
        self._previous = emulation.current_device()
        if self.index is not None:
            emulation.set_current_device(emulation.device_index(self.index))

    def __exit__(self, *exc):
        active().set_current_device(self._previous)


