"""cupy.ndarray operators and methods: `a + b`, `a += b`, `a[i] = b`, `a.sum()`, `a.get()`,
`a.set(h)`, `float(a)`, printing, ...

cupy.ndarray is a Python class over a Cython base: its methods are set on it and deleted
again on undo, which uncovers the base's. An operation that allocates its result, writes in
place or into `out=` is a launch on the current stream; one that returns a view is none.
"""
from __future__ import annotations

from .. import recorder as R
from .patching import Patch, forwarding, quiet

COMPUTE = (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__",
    "__neg__", "__pos__", "__abs__", "__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__",
    "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__lt__", "__le__", "__gt__", "__ge__",
    "__eq__", "__ne__", "__getitem__", "sum", "prod", "mean", "var", "std", "max", "min", "argmax", "argmin",
    "all", "any", "cumsum", "cumprod", "dot", "astype", "copy", "clip", "round", "conj", "ravel", "flatten",
    "reshape", "take", "repeat", "argsort", "nonzero", "trace", "real", "imag",
)
IN_PLACE = ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
            "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__", "fill", "sort", "put")
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__complex__", "__index__",
              "__repr__", "__str__", "__format__")  # a copy to the host, then a sync of the current stream


def compute_method(label: str):
    def wrap(orig):
        if not callable(orig):  # an attribute (`a.imag` allocates zeros for a real array): wrap its getter
            return _compute_attribute(label, orig)

        def method(self, *args, **kwargs):
            if quiet():
                return orig(self, *args, **kwargs)
            return R.current.compute(label, orig, (self,) + args, kwargs)
        return forwarding(orig, method)
    return wrap


def _compute_attribute(label: str, descriptor) -> property:
    """A data descriptor of the Cython base (`real`, `imag`) as a property that records its
    getter like a method and keeps its setter."""
    def get(self):
        if quiet():
            return descriptor.__get__(self, type(self))
        return R.current.compute(label, descriptor.__get__, (self, type(self)), {})

    def set(self, value):
        descriptor.__set__(self, value)
    return property(get, set, None, getattr(descriptor, "__doc__", None))


def in_place_method(label: str):
    def wrap(orig):
        def method(self, *args, **kwargs):
            if quiet():
                return orig(self, *args, **kwargs)
            return R.current.compute(label, orig, (self,) + args, kwargs, inplace=(self,))
        return forwarding(orig, method)
    return wrap


def host_read_method(label: str):
    def wrap(orig):
        def method(self, *args, **kwargs):
            if quiet():
                return orig(self, *args, **kwargs)
            return R.current.host_read(label, self, None, True, lambda: orig(self, *args, **kwargs))
        return forwarding(orig, method)
    return wrap


def _setitem(orig_set):
    import cupy

    orig_get = cupy.ndarray.__getitem__

    def __setitem__(self, key, value):
        if quiet():
            return orig_set(self, key, value)
        rec = R.current
        target = self
        try:
            view = R.inside(orig_get, self, key)
            if isinstance(view, cupy.ndarray) and view.data.mem is self.data.mem:
                target = view  # basic indexing: only the view's bytes are written
        except Exception:
            pass
        return rec.launch("ndarray.__setitem__", lambda: orig_set(self, key, value), reads=rec.arrays((value,)),
                          writes=(target,))
    return forwarding(orig_set, __setitem__)


def _get(orig):
    def get(self, *args, **kwargs):
        if quiet():
            return orig(self, *args, **kwargs)
        stream = kwargs.get("stream", args[0] if args else None)
        blocking = kwargs.get("blocking", args[3] if len(args) > 3 else True)
        # CuPy rule: get() synchronizes only the given (or current) stream, and not at all
        # with blocking=False.
        return R.current.host_read("ndarray.get", self, stream, bool(blocking), lambda: orig(self, *args, **kwargs))
    return forwarding(orig, get)


def _set(orig):
    def set(self, arr, stream=None):
        if quiet():
            return orig(self, arr, stream)
        return R.current.host_write(self, stream, lambda: orig(self, arr, stream))
    return forwarding(orig, set)


def patches() -> tuple:
    """The entry points this adapter intercepts (the operators this CuPy version has)."""
    import cupy

    def present(names):
        return [name for name in names if hasattr(cupy.ndarray, name)]
    return (
        tuple(Patch(f"cupy.ndarray.{name}", compute_method(f"ndarray.{name}")) for name in present(COMPUTE))
        + tuple(Patch(f"cupy.ndarray.{name}", in_place_method(f"ndarray.{name}")) for name in present(IN_PLACE))
        + tuple(Patch(f"cupy.ndarray.{name}", host_read_method(f"ndarray.{name}")) for name in present(HOST_READS))
        + (
            Patch("cupy.ndarray.__setitem__", _setitem),
            Patch("cupy.ndarray.get", _get),
            Patch("cupy.ndarray.set", _set),
        )
    )
