"""Host views of pinned memory: `pinned.numpy()` shares the tensor's bytes, and the host's later
reads and writes through the array are host accesses to those bytes (issue 36 item 6).

Inference engines keep numpy views of their pinned staging buffers and read them after a
non_blocking device-to-host copy; a read before the host synchronized with the copy's stream
reads stale bytes. The view is a numpy ndarray subclass that tells its `record` callable, at each
access, which bytes it touched: `record(lo, hi, write, name)` with [lo, hi) host addresses. The
GPU recorder (record/adapters/torch_ops.py) and the emulation (emulation/factory_mode.py) each
give the callable that turns those addresses into a host access of their trace; this module is
the one view both use.

What counts: indexing (a scalar, or a copy by an index array, reads the bytes it selects; a slice
is a view, which records its own accesses later), assignment through indexing, numpy's ufuncs
(`view + 1`, `view.sum()`, `np.add(a, b, out=view)`), numpy functions on it (`np.concatenate`,
`np.copyto`, ...), and the methods that read or write its values (`tolist`, `item`, `copy`,
`astype`, `tobytes`, iteration, printing, `float()`/`int()`/`bool()`, `fill`, `sort`, ...).
Not seen: `np.array(view)` and other copies numpy's C code makes without asking the array, and
raw pointers (`ctypes`, `__array_interface__`).
"""
from __future__ import annotations

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    byte_bounds = np.byte_bounds


def plain(value):
    """`value` as a plain ndarray when it is a HostView (the same bytes), else as it is."""
    return value.view(np.ndarray) if isinstance(value, HostView) else value


class HostView(np.ndarray):
    """An ndarray over pinned host memory whose value reads and writes are recorded."""

    _record = None  # record(lo, hi, write, name); None: not recorded (a copy numpy made)

    @classmethod
    def of(cls, array: np.ndarray, record) -> "HostView":
        view = array.view(cls)
        view._record = record
        return view

    def __array_finalize__(self, obj) -> None:
        # Views made from a view (slices, reshapes) keep recording; arrays numpy makes afresh are
        # handed back as plain arrays below, and one that is not touches no address of the block.
        self._record = getattr(obj, "_record", None)

    # --- recording ---------------------------------------------------------------------------
    def _touch(self, write: bool, name: str, part=None) -> None:
        record = self._record
        array = plain(self) if part is None else part
        if record is None or array.size == 0:
            return
        lo, hi = byte_bounds(array)
        record(lo, hi, write, name)

    def _selected(self, key):
        """The bytes `self[key]` selects, as a plain view when indexing is basic (an element as a
        0-d view), else None (an index array: the whole view is taken as touched)."""
        base = plain(self)
        try:
            if isinstance(key, tuple) and any(k is Ellipsis for k in key):
                part = base[key]
            else:
                part = base[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
        except (IndexError, TypeError, ValueError):
            return None
        return part if np.may_share_memory(part, base) else None

    # --- indexing ------------------------------------------------------------------------------
    def __getitem__(self, key):
        out = super().__getitem__(key)
        if isinstance(out, np.ndarray) and (out.size == 0 or np.may_share_memory(plain(out), plain(self))):
            return out  # a view (or nothing): its own accesses are recorded when they happen
        self._touch(False, "host view read", self._selected(key))
        return plain(out)

    def __setitem__(self, key, value) -> None:
        if isinstance(value, HostView):
            value._touch(False, "host view read")
        self._touch(True, "host view write", self._selected(key))
        plain(self)[key] = plain(value)

    # --- numpy's protocols -----------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for value in inputs:
            if isinstance(value, HostView):
                value._touch(False, f"numpy {ufunc.__name__}")
        out = kwargs.get("out")
        if out is not None:
            for value in out:
                if isinstance(value, HostView):
                    value._touch(True, f"numpy {ufunc.__name__}")
            kwargs["out"] = tuple(plain(value) for value in out)
        result = getattr(ufunc, method)(*(plain(value) for value in inputs), **kwargs)
        if out is not None:  # in place: the view itself, as numpy returns `out`
            outs = tuple(out)
            return outs[0] if len(outs) == 1 else outs
        return result

    def __array_function__(self, func, types, args, kwargs):
        out = kwargs.get("out")
        written = [out] if isinstance(out, HostView) else []
        if func is np.copyto and args and isinstance(args[0], HostView):
            written.append(args[0])
        for value in _leaves(args) + _leaves(tuple(kwargs.values())):
            if isinstance(value, HostView) and all(value is not w for w in written):
                value._touch(False, f"numpy {func.__name__}")
        for value in written:
            value._touch(True, f"numpy {func.__name__}")
        result = func(*_plain_all(args), **{k: _plain_all(v) for k, v in kwargs.items()})
        return out if isinstance(out, HostView) else result

    # --- methods that read or write the values ---------------------------------------------------
    def __iter__(self):
        self._touch(False, "host view read")
        return iter(plain(self))

    def __repr__(self) -> str:
        self._touch(False, "host view read")
        return repr(plain(self))

    def __str__(self) -> str:
        self._touch(False, "host view read")
        return str(plain(self))

    def __format__(self, spec: str) -> str:
        self._touch(False, "host view read")
        return format(plain(self), spec)


def _reading(name: str):
    def method(self, *args, **kwargs):
        self._touch(False, "host view read")
        return getattr(plain(self), name)(*_plain_all(args), **kwargs)
    method.__name__ = name
    return method


def _writing(name: str):
    def method(self, *args, **kwargs):
        self._touch(True, "host view write")
        return getattr(plain(self), name)(*_plain_all(args), **kwargs)
    method.__name__ = name
    return method


for _name in ("tolist", "item", "copy", "astype", "tobytes", "argmax", "argmin", "argsort", "nonzero", "dot",
              "searchsorted", "__bool__", "__float__", "__int__", "__index__", "__complex__"):
    setattr(HostView, _name, _reading(_name))
for _name in ("fill", "sort", "put", "partition"):
    setattr(HostView, _name, _writing(_name))
del _name


def _leaves(values: tuple) -> list:
    out = []
    for value in values:
        if isinstance(value, (list, tuple)):
            out.extend(_leaves(tuple(value)))
        else:
            out.append(value)
    return out


def _plain_all(value):
    if isinstance(value, HostView):
        return plain(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_all(v) for v in value)
    return value
