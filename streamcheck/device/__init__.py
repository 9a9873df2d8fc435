"""The device API stream programs are written against (api.py: the front end; objects.py: Buffer,
Region, its errors; backends/: what runs the work). `from streamcheck.device import Device` is the
public path.

The names load when first used, so that importing the backends' registry (the pytest plugin
resolving `auto`) loads neither numpy nor the checker.
"""

__all__ = ["Buffer", "CaptureError", "Device", "DeviceError", "DeviceThread", "Event", "Graph", "KernelError",
           "PeerAccessError", "Region", "Stream", "UndeclaredWriteError", "Work"]


def __getattr__(name):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'streamcheck.device' has no attribute {name!r}")
