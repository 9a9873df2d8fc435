"""streamcheck: find CUDA stream races by happens-before analysis and injected schedules.

The layers (docs/architecture.md): `streamcheck.core` is the pure analysis (trace, capture
tracker, happens-before checker and reports, schedules); analyses over a trace (`analyses`), the
device API and its backends (`device`), whole-program recording (`record`), the reruns that prove
(`proofs`), the pictures (`pictures`), the pytest plugin and the CLI sit around it.
"""
import importlib
import importlib.machinery
import sys as _sys

# Nothing is imported here: the console script imports this package before streamcheck.cli can
# catch a Ctrl-C (streamcheck/interrupts.py), and the pytest plugin loads it in every project.

# Modules that lived at the top of the package before it had folders: their old import paths
# (`streamcheck.hb`, `from streamcheck.trace import ...`, `streamcheck.instrument`,
# `streamcheck.sync_proof.prove`) stay the same modules, loaded when first named.
_MOVED = {
    "capture": "core.capture", "compare": "core.compare", "hb": "core.hb", "schedule": "core.schedule",
    "trace": "core.trace",
    "instrument": "record.instrument",
    "sync_proof": "proofs.sync_proof",
    "export": "pictures.export", "timeline": "pictures.timeline",
}


class _MovedAlias:
    """The import system's finder and loader for the old paths."""

    def find_spec(self, fullname, path, target=None):
        package, _, name = fullname.rpartition(".")
        if package == __name__ and name in _MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{_MOVED[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__  # the import system sets the alias's spec on the module next
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # already executed: it keeps its own spec


_sys.meta_path.append(_MovedAlias())


def __getattr__(name):
    # Lazy, so that `import streamcheck` imports neither cupy nor torch. `streamcheck.instrument`
    # is the module streamcheck/record/instrument.py, callable as the context manager.
    if name in ("declare_access", "declare_kernel"):
        return getattr(importlib.import_module(".record.instrument", __name__), name)
    if name in _MOVED:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'streamcheck' has no attribute {name!r}")
