"""run_schedules' oracle: a schedule's result against the sequential reference's."""
from __future__ import annotations

from typing import Optional


def _host(value):
    """numpy view of a result: cupy arrays come back with .get(), others through __array__."""
    import numpy as np

    if type(value).__module__.split(".")[0] == "cupy":
        return value.get()
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        return np.asarray(value)
    return value


def compare(want, got, *, atol: float = 0.0, rtol: float = 0.0, path: str = "result") -> Optional[str]:
    """None when `got` equals `want` (arrays exactly, or within atol/rtol; NaN equals NaN),
    else a one-line description of the first difference."""
    import numpy as np

    want, got = _host(want), _host(got)
    if isinstance(want, dict) and isinstance(got, dict):
        if set(want) != set(got):
            return f"{path}: keys {sorted(map(str, got))} differ from the reference's {sorted(map(str, want))}"
        for key in want:
            diff = compare(want[key], got[key], atol=atol, rtol=rtol, path=f"{path}[{key!r}]")
            if diff:
                return diff
        return None
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(want) != len(got):
            return f"{path}: {len(got)} items, the reference has {len(want)}"
        for i, (w, g) in enumerate(zip(want, got)):
            diff = compare(w, g, atol=atol, rtol=rtol, path=f"{path}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
        w, g = np.asarray(want), np.asarray(got)
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"{path}: got {g.dtype}{list(g.shape)}, the reference is {w.dtype}{list(w.shape)}"
        nan_ok = w.dtype.kind in "fc"
        if atol == 0 and rtol == 0:
            bad = ~((w == g) | (np.isnan(w) & np.isnan(g) if nan_ok else False))
        else:
            bad = ~np.isclose(g, w, atol=atol, rtol=rtol, equal_nan=nan_ok)
        if not bad.any():
            return None
        index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
        tol = f" (atol={atol}, rtol={rtol})" if atol or rtol else " (exact)"
        return (f"{path}: {int(bad.sum())} of {bad.size} elements differ{tol}; first at {index}: "
                f"got {g[index]!r}, want {w[index]!r}")
    if want != got:
        return f"{path}: got {got!r}, want {want!r}"
    return None
