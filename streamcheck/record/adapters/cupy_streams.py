"""CuPy streams, events and device synchronization.

Stream and Event are plain Python classes in CuPy: their methods are wrapped in place.
`cupy.cuda.Device` is a Cython type: the name is rebound to a transparent subclass whose
`synchronize` is recorded (never in cupy.cuda.device, its defining module; see patching.py).
"""
from __future__ import annotations

from .. import recorder as R
from ..gpu import is_suppressed
from .patching import Patch, forwarding, quiet, transparent_subclass


def _event_record(orig):
    def record(self, stream=None):
        if quiet():
            return orig(self, stream)
        return R.current.event_record(self, stream, lambda: orig(self, stream))
    return forwarding(orig, record)


def _event_synchronize(orig):
    def synchronize(self):
        if quiet():
            return orig(self)
        return R.current.event_sync(self, lambda: orig(self))
    return forwarding(orig, synchronize)


def _event_done(prop):
    def done(self):
        if quiet():
            return prop.fget(self)
        return R.current.event_query(self, lambda: prop.fget(self))
    return property(done) if isinstance(prop, property) else None


def _stream_record(orig):
    def record(self, event=None):
        if quiet():
            return orig(self, event)
        return R.current.event_record(event, self, lambda: orig(self, event))
    return forwarding(orig, record)


def _stream_wait_event(orig):
    def wait_event(self, event):
        if quiet():
            return orig(self, event)
        return R.current.stream_wait(self, event, lambda: orig(self, event))
    return forwarding(orig, wait_event)


def _stream_synchronize(orig):
    def synchronize(self):
        if quiet():
            return orig(self)
        return R.current.stream_sync(self, lambda: orig(self))
    return forwarding(orig, synchronize)


def _stream_done(prop):
    def done(self):
        if quiet():
            return prop.fget(self)
        return R.current.stream_query(self, lambda: prop.fget(self))
    return property(done) if isinstance(prop, property) else None


def _stream_init(orig):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        rec = R.current
        if rec is not None and not is_suppressed() and self.ptr not in (0, 1, 2):
            rec.register_stream(self.ptr, rec.site(), fresh=True)  # a new stream (its pointer may be reused)
    return forwarding(orig, __init__)


def _device_synchronize(orig):
    def deviceSynchronize():
        if quiet():
            return orig()
        return R.current.device_sync(orig)
    return forwarding(orig, deviceSynchronize)


def _device_class(Device):
    def synchronize(self):
        if quiet():
            return Device.synchronize(self)
        return R.current.device_sync(lambda: Device.synchronize(self))
    return transparent_subclass(Device, {"synchronize": synchronize})


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        Patch("cupy.cuda.stream.Event.record", _event_record),
        Patch("cupy.cuda.stream.Event.synchronize", _event_synchronize),
        Patch("cupy.cuda.stream.Event.done", _event_done),
        Patch("cupy.cuda.stream._BaseStream.record", _stream_record),
        Patch("cupy.cuda.stream._BaseStream.wait_event", _stream_wait_event),
        Patch("cupy.cuda.stream._BaseStream.synchronize", _stream_synchronize),
        Patch("cupy.cuda.stream._BaseStream.done", _stream_done),
        Patch("cupy.cuda.stream.Stream.__init__", _stream_init),
        Patch("cupy.cuda.runtime.deviceSynchronize", _device_synchronize),
        Patch("cupy.cuda.Device", _device_class),
    )
