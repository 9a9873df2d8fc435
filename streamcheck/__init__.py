"""streamcheck: find CUDA stream races by happens-before analysis and injected schedules.

The layers (docs/architecture.md): `streamcheck.core` is the pure analysis (trace, capture
tracker, happens-before checker and reports, schedules); the device API (`device`) and its
backends (`backends`), the recorder (`recorder`) and its library adapters (`adapters`), the
pytest plugin and the CLI sit around it.
"""
import sys as _sys

from .core import capture, compare, hb, schedule, trace

# The core's modules lived at the top of the package before it had a core: their old import
# paths (`streamcheck.hb`, `from streamcheck.trace import ...`) stay the same modules.
for _module in (capture, compare, hb, schedule, trace):
    _sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module
del _module


def __getattr__(name):
    # Lazy, so that `import streamcheck` imports neither cupy nor torch. `streamcheck.instrument`
    # is the module streamcheck/instrument.py, callable as the context manager.
    if name in ("instrument", "declare_access", "declare_kernel"):
        import importlib

        module = importlib.import_module(".instrument", __name__)
        return module if name == "instrument" else getattr(module, name)
    raise AttributeError(f"module 'streamcheck' has no attribute {name!r}")
