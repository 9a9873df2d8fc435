"""CuPy module functions: cupy.matmul and friends, reductions, creation and copies, ufuncs,
cupy.copyto, cupy.asnumpy, and the library calls of cupy.linalg (cuSOLVER / cuBLAS) and
cupy.fft (cuFFT). Each is one launch on the current stream when it allocates its result or
writes `out=`, so a delay can target library calls like any kernel.

The names in the cupy namespaces are rebound; CuPy's own modules keep calling what they
define (and whatever runs inside a recorded call is part of it).
"""
from __future__ import annotations

from .. import recorder as R
from .patching import Patch, forwarding, quiet

FUNCTIONS = ("matmul", "dot", "vdot", "inner", "outer", "tensordot", "einsum", "kron", "concatenate", "stack",
             "hstack", "vstack", "dstack", "where", "clip", "sum", "prod", "mean", "var", "std", "amax",
             "amin", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "sort", "argsort", "zeros", "ones",
             "full", "zeros_like", "ones_like", "full_like", "arange", "linspace", "eye", "identity", "copy",
             "ascontiguousarray", "asfortranarray", "array", "asarray", "asanyarray", "tril", "triu", "diag",
             "flip", "roll", "tile", "broadcast_to", "transpose", "reshape", "maximum", "minimum")
H2D = ("array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray")  # from a host array: a copy
CREATION = ("zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "linspace", "eye",
            "identity")  # write their result; `*_like` reads only its argument's shape
LINALG = ("cholesky", "det", "eigh", "eigvalsh", "inv", "lstsq", "norm", "pinv", "qr", "slogdet", "solve", "svd")
FFT = ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2", "rfftn", "irfftn",
       "hfft", "ihfft")


def _stream_of(kwargs):
    stream = kwargs.get("stream")
    return stream if hasattr(stream, "ptr") else None


def compute_function(label: str, h2d: bool = False, creation: bool = False):
    def wrap(fn):
        if not callable(fn) or isinstance(fn, type):
            return None

        def function(*args, **kwargs):
            if quiet():
                return fn(*args, **kwargs)
            return R.current.compute(label, fn, args, kwargs, h2d=h2d, inputs=() if creation else None,
                                     stream=_stream_of(kwargs))
        return forwarding(fn, function)
    return wrap


class UfuncProxy:
    """Stands in for a cupy.ufunc in the cupy namespace (ufunc is a Cython type whose
    __call__ cannot be patched): records calls, forwards the rest."""

    def __init__(self, ufunc, name: str):
        self._ufunc = ufunc
        self.__name__ = name  # the name in the cupy namespace (CuPy's own is e.g. 'cupy_exp')
        self.__doc__ = getattr(ufunc, "__doc__", None)
        self.__wrapped__ = ufunc

    def __call__(self, *args, **kwargs):
        if quiet():
            return self._ufunc(*args, **kwargs)
        return R.current.compute(f"cupy.{self.__name__}", self._ufunc, args, kwargs)

    def __getattr__(self, name):
        attr = getattr(self._ufunc, name)
        if name in ("reduce", "accumulate", "outer", "reduceat") and callable(attr):
            label = f"cupy.{self.__name__}.{name}"

            def method(*args, **kwargs):
                if quiet():
                    return attr(*args, **kwargs)
                return R.current.compute(label, attr, args, kwargs)
            return method
        if name == "at" and callable(attr):
            label = f"cupy.{self.__name__}.at"

            def at(a, *args, **kwargs):
                if quiet():
                    return attr(a, *args, **kwargs)
                return R.current.compute(label, attr, (a,) + args, kwargs, inplace=(a,))
            return at
        return attr

    def __repr__(self):
        return f"<streamcheck-recorded {self._ufunc!r}>"


def _copyto(copyto):
    def copyto_(dst, src, *args, **kwargs):
        if quiet():
            return copyto(dst, src, *args, **kwargs)
        return R.current.compute("cupy.copyto", copyto, (dst, src) + args, kwargs, inplace=(dst,))
    return forwarding(copyto, copyto_)


def _asnumpy(asnumpy):
    import cupy

    def asnumpy_(a, stream=None, *args, **kwargs):
        if quiet() or isinstance(a, cupy.ndarray) or not hasattr(a, "__cuda_array_interface__"):
            return asnumpy(a, stream, *args, **kwargs)  # ndarray: recorded by ndarray.get
        return R.current.host_read("cupy.asnumpy", a, stream, kwargs.get("blocking", True),
                                   lambda: asnumpy(a, stream, *args, **kwargs))
    return forwarding(asnumpy, asnumpy_)


def _ufunc_patches() -> tuple:
    """One patch per ufunc in the cupy namespace (not already a recorded function)."""
    import cupy

    return tuple(Patch(f"cupy.{name}", lambda u, name=name: UfuncProxy(u, name))
                 for name, value in sorted(vars(cupy).items())
                 if isinstance(value, cupy.ufunc) and name not in FUNCTIONS)


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        tuple(Patch(f"cupy.{name}", compute_function(f"cupy.{name}", h2d=name in H2D, creation=name in CREATION))
              for name in FUNCTIONS)
        + tuple(Patch(f"cupy.linalg.{name}", compute_function(f"cupy.linalg.{name}")) for name in LINALG)
        + tuple(Patch(f"cupy.fft.{name}", compute_function(f"cupy.fft.{name}")) for name in FFT)
        + _ufunc_patches()
        + (
            Patch("cupy.copyto", _copyto),
            Patch("cupy.asnumpy", _asnumpy),
        )
    )
