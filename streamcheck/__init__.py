"""streamcheck: find CUDA stream races by happens-before analysis and injected schedules."""


def __getattr__(name):
    # Lazy, so that `import streamcheck` imports neither cupy nor torch. `streamcheck.instrument`
    # is the module streamcheck/instrument.py, callable as the context manager.
    if name in ("instrument", "declare_access", "declare_kernel"):
        import importlib

        module = importlib.import_module(".instrument", __name__)
        return module if name == "instrument" else getattr(module, name)
    raise AttributeError(f"module 'streamcheck' has no attribute {name!r}")
