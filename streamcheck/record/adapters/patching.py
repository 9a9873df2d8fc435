"""How adapters intercept a library: a table of `Patch` entries, applied and undone by a
`Patcher`.

Transparency rules every patch obeys (a program behaves identically under instrumentation,
injected delays aside):
- A wrapper passes straight through when nothing records (`quiet()`): no recording, a nested
  call inside one already recorded, or streamcheck's own work (gpu.suppressed()).
- A Cython type is never replaced in the module that defines it. Cython modules imported
  later `cimport` the type from there and read its `__pyx_vtable__`, which a Python subclass
  does not have (CuPy: `KeyError: '__pyx_vtable__'` at `import cupyx.cusolver`). Only the
  names Python code looks up (`cupy.RawKernel`, `cupy.cuda.Device`) are rebound, to a
  subclass that `isinstance` treats as the original (`transparent_subclass`).
- Everything is undone, in reverse order, when the recording stops.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import Callable

from .. import recorder
from ..gpu import thread_state


def quiet() -> bool:
    """True when wrappers must pass straight through: no recording, nested call, or suppressed."""
    return recorder.current is None or thread_state.depth or thread_state.suppress


@dataclass(frozen=True)
class Patch:
    """Rebind `target` (a dotted path: module, then attributes) to `wrap(original)`.

    `also`: more dotted paths that hold the same original object (re-exports) and get the same
    replacement. `wrap` may return None to leave the target alone (nothing to intercept in
    this library version)."""

    target: str
    wrap: Callable
    also: tuple = ()


def resolve(path: str):
    """(owner object, attribute name) of a dotted path: the longest importable module prefix,
    then attributes. Raises LookupError naming what is missing."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            try:
                owner = getattr(owner, name)
            except AttributeError:
                raise LookupError(f"{path}: no attribute {name!r}") from None
        return owner, parts[-1]
    raise LookupError(f"{path}: module not importable")


class Patcher:
    """Sets attributes and remembers how to undo it. What cannot be patched in this library
    version goes to `unpatched` (a list the recording reports), never into the program."""

    def __init__(self, unpatched: list):
        self.unpatched = unpatched
        self.undo: list = []  # callables, run in reverse order

    def set(self, owner, name: str, value, what: str) -> bool:
        missing = object()
        old = getattr(owner, "__dict__", {}).get(name, missing)
        if isinstance(old, type) and isinstance(owner, type(importlib)) and old.__module__ == owner.__name__:
            self.unpatched.append(f"{what}: not replaced in the module that defines it (Cython modules "
                                  "imported later read its vtable there)")
            return False
        try:
            setattr(owner, name, value)
        except (AttributeError, TypeError) as exc:
            self.unpatched.append(f"{what}: {exc}")
            return False

        def undo():
            if getattr(owner, "__dict__", {}).get(name) is not value:
                # The program rebound it itself while we recorded: its own patch stays.
                self.unpatched.append(f"{what}: rebound by the program during the recording; left as it set it")
                return
            if old is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self.undo.append(undo)
        return True

    def apply(self, patch: Patch) -> bool:
        try:
            owner, name = resolve(patch.target)
            original = getattr(owner, name)
        except (LookupError, AttributeError) as exc:
            self.unpatched.append(f"{patch.target}: not in this library version ({exc})")
            return False
        try:
            replacement = patch.wrap(original)
        except TypeError as exc:  # e.g. a final type that cannot be subclassed
            self.unpatched.append(f"{patch.target}: {exc}")
            return False
        if replacement is None:
            return False
        done = self.set(owner, name, replacement, patch.target)
        for path in patch.also:
            try:
                other, other_name = resolve(path)
            except LookupError:
                continue
            if getattr(other, other_name, None) is original:
                self.set(other, other_name, replacement, path)
        return done

    def on_undo(self, undo: Callable) -> None:
        self.undo.append(undo)

    def after_import(self, module: str, loaded: Callable) -> None:
        """Call `loaded(module object)` now if `module` is imported, else right after the program
        imports it (libraries import parts of themselves lazily: torch.compile loads Inductor's
        runtime at the first compile); never imports it itself."""
        def guarded(found) -> None:
            try:
                loaded(found)
            except Exception as exc:  # never into the program's import
                self.unpatched.append(f"{module}: {type(exc).__name__}: {exc}")
        found = sys.modules.get(module)
        if found is not None:
            guarded(found)
            return
        watcher = ImportWatcher({module: guarded})
        self.undo.append(watcher.remove)

    def restore(self) -> None:
        while self.undo:
            undo = self.undo.pop()
            try:
                undo()
            except (AttributeError, TypeError):
                pass


class ImportWatcher:
    """A sys.meta_path finder that lets the normal import of each awaited module run, then
    calls its callback with the module (once: the callback is forgotten after it ran)."""

    def __init__(self, waiting: dict):
        self.waiting = dict(waiting)  # module name -> callback(module)
        if self.waiting:
            sys.meta_path.insert(0, self)

    def find_spec(self, name, path=None, target=None):
        loaded = self.waiting.pop(name, None)
        if loaded is None:
            return None
        self.remove()  # the real spec, found without us
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.waiting:
                sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterExec(spec.loader, loaded)
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _AfterExec:
    """A module's own loader, which calls `loaded(module)` once the module has run."""

    def __init__(self, loader, loaded: Callable):
        self._loader, self._loaded = loader, loaded

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._loaded(module)

    def __getattr__(self, name):  # resources, source, file names: the real loader's
        return getattr(self._loader, name)


def transparent_subclass(base: type, body: dict) -> type:
    """A subclass of `base` with the methods in `body`, named like it, that `isinstance` and
    `issubclass` treat as `base` itself: objects the library made before (or without) the
    recording still pass the program's checks against the rebound name."""

    class Transparent(type(base)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, base)

    namespace = dict(body, __module__=base.__module__, __qualname__=base.__qualname__,
                     __doc__=base.__doc__)
    return Transparent(base.__name__, (base,), namespace)


def forwarding(orig, call: Callable) -> Callable:
    """`call` dressed as `orig` (name, doc, __wrapped__) for introspection."""
    call.__name__ = getattr(orig, "__name__", call.__name__)
    call.__qualname__ = getattr(orig, "__qualname__", call.__qualname__)
    call.__doc__ = getattr(orig, "__doc__", None)
    call.__wrapped__ = orig
    return call
