"""Backends of the device API. Each is an adapter; the analysis lives in hb.py."""
from __future__ import annotations

BACKENDS = ("sim", "cupy")


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (e.g. cupy without a GPU); the message says what to do."""


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


def resolve(name: str) -> str:
    """`auto` becomes cupy when a GPU is present, else sim."""
    if name == "auto":
        return "cupy" if gpu_available() else "sim"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of: auto, {', '.join(BACKENDS)}")
    return name


def make_backend(name, *, device, policy="eager", seed=0, **params):
    if not isinstance(name, str):
        return name  # an already-built backend object
    name = resolve(name)
    if name == "sim":
        from .sim import SimBackend
        return SimBackend(device, policy=policy, seed=seed, **params)
    if not gpu_available():
        raise BackendUnavailable("backend 'cupy' needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]'); "
                                 "none found here. Use backend='sim' to run on the CPU.")
    from .cupy_backend import CupyBackend
    return CupyBackend(device, policy=policy, seed=seed, **params)
