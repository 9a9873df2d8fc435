"""Backends of the device API: what runs the work the front end (device/api.py) recorded. Each is
a subclass of protocol.Backend in a module of its own; the analysis lives in streamcheck/core.

A backend is found by name: the built-in ones below, then the `streamcheck.backends` entry-point
group (`name = "package.module:Class"`), so a new backend is one new module.
"""
from __future__ import annotations

import importlib

from ...record.gpu import gpu_available  # noqa: F401 (public here; backends' availability checks read it here)

BUILT_IN = {
    "sim": "streamcheck.device.backends.sim:SimBackend",  # the CPU: a seeded scheduler runs the streams
    "cupy": "streamcheck.device.backends.cupy_backend:CupyBackend",  # a GPU through CuPy
}
BACKENDS = tuple(BUILT_IN)  # the built-in names, in the order the docs list them
ENTRY_POINT_GROUP = "streamcheck.backends"


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (e.g. cupy without a GPU); the message says what to do."""


def _registered() -> dict:
    """name -> "module:Class": the built-in backends, then any installed through entry points."""
    found = dict(BUILT_IN)
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            found.setdefault(ep.name, ep.value)
    except Exception:  # broken package metadata: the built-in backends still work
        pass
    return found


def backend_names() -> tuple:
    return tuple(_registered())


def _target(name: str):
    """The `module:Class` registered as `name`, or None. A built-in name wins over entry points
    (_registered's setdefault), so it is answered without scanning every installed
    distribution's metadata (about 10 ms: most of a small sim program's time, once per Device)."""
    return BUILT_IN.get(name) or _registered().get(name)


def backend_class(name: str):
    """The Backend subclass registered as `name`."""
    target = _target(name)
    if target is None:
        raise ValueError(f"unknown backend {name!r}; choose one of: auto, {', '.join(backend_names())}")
    module, _, cls = target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable(f"backend {name!r} ({target}) cannot be loaded: {exc}") from None


def resolve(name: str) -> str:
    """`auto` becomes cupy when a GPU is present, else sim."""
    if name == "auto":
        return "cupy" if gpu_available() else "sim"
    if _target(name) is None:
        raise ValueError(f"unknown backend {name!r}; choose one of: auto, {', '.join(backend_names())}")
    return name


def make_backend(name, *, device, policy="eager", seed=0, **params):
    if not isinstance(name, str):
        return name  # an already-built backend object
    cls = backend_class(resolve(name))
    reason = cls.unavailable()
    if reason is not None:
        raise BackendUnavailable(reason)
    return cls(device, policy=policy, seed=seed, **params)
