"""streamcheck: find CUDA stream races by happens-before analysis and injected schedules.

The layers (docs/architecture.md): `streamcheck.core` is the pure analysis (trace, capture
tracker, happens-before checker and reports, schedules); the device API (`device`) and its
backends (`backends`), the recorder (`recorder`) and its library adapters (`adapters`), the
pytest plugin and the CLI sit around it.
"""
import importlib
import importlib.machinery
import sys as _sys

# Nothing is imported here: the console script imports this package before streamcheck.cli can
# catch a Ctrl-C (streamcheck/interrupts.py), and the pytest plugin loads it in every project.

# The core's modules lived at the top of the package before it had a core: their old import
# paths (`streamcheck.hb`, `from streamcheck.trace import ...`) stay the same modules, loaded
# when first named.
_MOVED_TO_CORE = ("capture", "compare", "hb", "schedule", "trace")


class _CoreAlias:
    """The import system's finder and loader for the old paths."""

    def find_spec(self, fullname, path, target=None):
        package, _, name = fullname.rpartition(".")
        if package == __name__ and name in _MOVED_TO_CORE:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.core.{spec.name.rpartition('.')[2]}")

    def exec_module(self, module):
        pass  # the core's module, already executed


_sys.meta_path.append(_CoreAlias())


def __getattr__(name):
    # Lazy, so that `import streamcheck` imports neither cupy nor torch. `streamcheck.instrument`
    # is the module streamcheck/instrument.py, callable as the context manager.
    if name in ("instrument", "declare_access", "declare_kernel"):
        module = importlib.import_module(".instrument", __name__)
        return module if name == "instrument" else getattr(module, name)
    if name in _MOVED_TO_CORE:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'streamcheck' has no attribute {name!r}")
