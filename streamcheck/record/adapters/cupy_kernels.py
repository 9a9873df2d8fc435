"""CuPy kernels: RawKernel and RawModule functions (reads and writes from the CUDA signature
or declare_kernel), ElementwiseKernel and ReductionKernel (inputs read, outputs written).

All four are Cython types: the names `cupy.X` and `cupy._core.X` are rebound to transparent
subclasses (never `cupy._core.raw` / `_kernel` / `_reduction`, which define them).
"""
from __future__ import annotations

from .. import recorder as R
from ..gpu import is_suppressed, suppressed
from ..kernel_access import param_names
from .patching import Patch, quiet, transparent_subclass


def preload(rec, kernel) -> None:
    """Compile and load a RawKernel now: lazy loading at its first launch may synchronize the
    device and hide the very race a delay was meant to expose."""
    try:
        with suppressed():
            kernel.kernel
    except Exception:  # a compile error surfaces at the first call, as without streamcheck
        return
    rec.implicit(f"module load of RawKernel `{kernel.name}` (loaded at definition, not at first launch)")


class KernelProxy:
    """A RawKernel from RawModule.get_function (built inside CuPy, so not our subclass)."""

    def __init__(self, kernel, name: str):
        object.__setattr__(self, "_kernel", kernel)
        object.__setattr__(self, "_name", name)

    def __call__(self, grid, block, args, **kwargs):
        kernel = self._kernel
        if quiet():
            return kernel(grid, block, args, **kwargs)
        return R.current.source_launch(self._name, kernel.code, args, kwargs.get("stream"),
                                       lambda: kernel(grid, block, args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __setattr__(self, name, value):
        setattr(self._kernel, name, value)


def _raw_kernel(RawKernel):
    def __init__(self, *args, **kwargs):
        RawKernel.__init__(self, *args, **kwargs)
        rec = R.current
        if rec is not None and not is_suppressed():
            preload(rec, self)

    def __call__(self, grid, block, args, **kwargs):
        if quiet():
            return RawKernel.__call__(self, grid, block, args, **kwargs)
        return R.current.source_launch(self.name, self.code, args, kwargs.get("stream"),
                                       lambda: RawKernel.__call__(self, grid, block, args, **kwargs))
    return transparent_subclass(RawKernel, {"__init__": __init__, "__call__": __call__})


def _raw_module(RawModule):
    def get_function(self, name):
        return KernelProxy(RawModule.get_function(self, name), name)
    return transparent_subclass(RawModule, {"get_function": get_function})


def _generated_kernel(Kernel, name_at: int, default_name: str):
    """ElementwiseKernel(in, out, operation, name, ...) / ReductionKernel(in, out, map, reduce,
    post, identity, name, ...): record a call as `compute` with its in-params read and its
    out-params written (`name_at`: the position of `name` after in_params and out_params)."""
    def __init__(self, in_params, out_params, *args, **kwargs):
        Kernel.__init__(self, in_params, out_params, *args, **kwargs)
        name = args[name_at] if len(args) > name_at else kwargs.get("name", default_name)
        self._streamcheck = (name, len(param_names(in_params)), len(param_names(out_params)))

    def __call__(self, *args, **kwargs):
        if quiet():
            return Kernel.__call__(self, *args, **kwargs)
        name, nin, nout = self._streamcheck
        rec = R.current
        return rec.compute(name, lambda *a, **k: Kernel.__call__(self, *a, **k), args, kwargs,
                           inplace=rec.arrays(args[nin:nin + nout]), inputs=rec.arrays(args[:nin]),
                           stream=kwargs.get("stream"))
    return transparent_subclass(Kernel, {"__init__": __init__, "__call__": __call__})


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        Patch("cupy.RawKernel", _raw_kernel, also=("cupy._core.RawKernel",)),
        Patch("cupy.RawModule", _raw_module, also=("cupy._core.RawModule",)),
        Patch("cupy.ElementwiseKernel", lambda K: _generated_kernel(K, 1, "kernel"),
              also=("cupy._core.ElementwiseKernel",)),
        Patch("cupy.ReductionKernel", lambda K: _generated_kernel(K, 4, "reduce_kernel"),
              also=("cupy._core.ReductionKernel",)),
    )
