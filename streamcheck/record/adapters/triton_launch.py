"""Triton kernel launches: `@triton.jit` kernels, and `@triton.autotune` / `@triton.heuristics`
ones (whose `run` ends in the JITFunction's, once per benchmarked config and once for the
chosen one), recorded on the stream Triton launches on, with their reads and writes.

The stream: `JITFunction.run` asks `triton.runtime.driver.active.get_current_stream(device)`
for the current device, which with torch loaded is torch's current stream
(`torch._C._cuda_getCurrentRawStream`, a raw cudaStream_t); the wrapper asks the same just
before the launch. Reads and writes: from the kernel's source (streamcheck/record/triton_access.py:
pointer parameters that reach `tl.store` / atomics are written, the others read, the
undecided counted as written with a notice once per kernel), unless `declare_kernel(name,
...)` says otherwise (by parameter position; the name is the Python function's). Tensor
arguments are recorded by their `__cuda_array_interface__` bytes; wrappers with a `.base`
tensor (`triton.reinterpret`, host tensor descriptors) by their base's.

`warmup=True` compiles only: passed through unrecorded. The first launch of a
specialization compiles and loads a module, which may synchronize the device: noted as an
implicit synchronization, never an edge.

Kernels torch.compile generates do not come here (Inductor launches its compiled binaries, not
`JITFunction.run`): streamcheck/record/adapters/torch_inductor.py records them with this module's plan.
Not seen: Triton's interpreter (`TRITON_INTERPRET=1`, kernels run on the host).
Installed with torch's adapters, and only if triton is imported by then (a recording never
imports it). Written against Triton 3.x (`run(self, *args, grid, warmup, **kwargs)`, read in
3.3 and 3.9); the wrapper takes any arguments and passes them on untouched.
"""
from __future__ import annotations

import inspect
import os
import sys
import textwrap
import weakref
from typing import Optional

from .. import kernel_access
from .. import recorder as R
from ...core.trace import SiteResolver
from ..gpu import suppressed
from ..triton_access import KernelAccess, Source, analyze
from .patching import Patch, forwarding, quiet

_SCALARS = (int, float, complex, bool, str, bytes, type(None))
_MAX_NESTING = 4  # tuples of tensors followed this deep

_PLAN = "_streamcheck_plan"  # attribute a JITFunction keeps its Plan in
_sites = weakref.WeakKeyDictionary()  # recorder -> its resolver that also skips triton's frames


class Plan:
    """What a kernel's launches need, worked out at its first launch: its name, parameter
    names in order, per parameter 'r' / 'w' / '-', and the analysis (for the notices). Valid
    while the kernel's source and its declare_kernel entry stay the same objects."""

    __slots__ = ("name", "full", "src", "declaration", "params", "index", "access", "analysis", "told", "stated")

    def __init__(self, name, full, src, declaration, params, access, analysis: Optional[KernelAccess],
                 stated=frozenset()):
        self.name, self.full, self.src, self.declaration = name, full, src, declaration
        self.params = params
        self.index = {p: i for i, p in enumerate(params)}
        self.access = access  # tuple of 'r' / 'w' / '-', one per parameter
        self.analysis = analysis
        self.stated = stated  # parameters the launcher says are written (Inductor's mutated_arg_names)
        self.told = weakref.WeakSet()  # recordings told of this kernel's assumptions already

    @classmethod
    def by_names(cls, name: str, params, written) -> "Plan":
        """A kernel whose source is not analysed: the parameters in `written` written, the others
        read (their values say whether they hold arrays at all)."""
        written = frozenset(written)
        return cls(name, name, None, None, tuple(params), tuple("w" if p in written else "r" for p in params), None,
                   written)

    def with_writes(self, written) -> "Plan":
        """This plan, with the parameters named in `written` written whatever the source says
        (a compiler's own record of what its kernel mutates: no notice for them)."""
        written = frozenset(written) & frozenset(self.params)
        access = tuple("w" if p in written else a for p, a in zip(self.params, self.access))
        return Plan(self.name, self.full, self.src, self.declaration, self.params, access, self.analysis,
                     self.stated | written)


def _first_def_line(fn) -> int:
    """File line of the `def` (JITFunction.src starts there, below any decorators)."""
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("def "):
            return start + i
    return start


def _scope(fn) -> dict:
    scope = dict(getattr(fn, "__globals__", {}))
    closure = getattr(fn, "__closure__", None)
    if closure:
        for name, cell in zip(fn.__code__.co_freevars, closure):
            try:
                scope[name] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
    return scope


def _is_jitted(obj) -> bool:
    return isinstance(getattr(obj, "src", None), str) and hasattr(getattr(obj, "fn", None), "__code__")


def source_of(jit) -> Source:
    """The triton_access.Source of a JITFunction: its `src` (or the function's source), and a
    resolver that finds the jitted helpers it calls in its own module and closure."""
    fn = jit.fn
    text = getattr(jit, "src", None)
    if not isinstance(text, str):
        text = textwrap.dedent(inspect.getsource(fn))
    try:
        file, first = fn.__code__.co_filename, _first_def_line(fn)
    except (OSError, TypeError):
        file, first = "", 1
    if not text.lstrip().startswith("def"):  # inspect.getsource keeps the decorators
        first -= text[:text.find("def ")].count("\n") if "def " in text else 0
    scope = _scope(fn)
    tl_module = sys.modules.get("triton.language")
    aliases = frozenset(k for k, v in scope.items() if tl_module is not None and v is tl_module)
    imports = {k: v.__name__ for k, v in scope.items()
               if callable(v) and not isinstance(v, type) and str(getattr(v, "__module__", "")).startswith(
                   "triton.language") and not _is_jitted(v)}

    def resolve(dotted: str) -> Optional[Source]:
        root, *rest = dotted.split(".")
        if root not in scope:
            return None
        obj = scope[root]
        for attr in rest:
            obj = getattr(obj, attr)
        return source_of(obj) if _is_jitted(obj) else None

    return Source(text, name=getattr(jit, "__name__", fn.__name__), resolve=resolve, tl_aliases=aliases,
                  tl_imports=imports, file=os.path.basename(file), first_line=first)


def _declaration(name: str, full: str):
    found = kernel_access.declared(name)
    return found if found is not None else kernel_access.declared(full)


def plan_of(jit) -> Plan:
    plan = getattr(jit, _PLAN, None)
    if plan is not None and plan.src is getattr(jit, "src", None) and \
            _declaration(plan.name, plan.full) is plan.declaration:
        return plan
    fn = jit.fn
    name = getattr(jit, "__name__", None) or fn.__name__
    full = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', name)}"
    declared = _declaration(name, full)
    analysis = None
    if declared is None:
        try:
            analysis = analyze(source_of(jit))
        except (OSError, TypeError, ValueError) as exc:  # no source (built at runtime, a frozen app)
            analysis = KernelAccess(name=name, params=(), positional=(), vararg=None, constexprs=frozenset(),
                                    writes=frozenset(), reads=frozenset(), undecided={}, evidence={},
                                    error=f"its source is not available ({exc})")
    params = tuple(getattr(jit, "arg_names", None) or (analysis.params if analysis is not None else ()))
    if declared is not None:
        # declare_kernel: by position; a tensor in a position it does not list is written
        access = tuple(declared.get(i, "w") for i in range(len(params)))
    else:
        access = tuple(analysis.access(p) for p in params)
    plan = Plan(name, full, getattr(jit, "src", None), declared, params, access, analysis)
    try:
        setattr(jit, _PLAN, plan)
    except (AttributeError, TypeError):  # a kernel object without a __dict__: worked out at each launch
        pass
    return plan


def _arrays(rec, value, out: list, depth: int = 0) -> bool:
    """Append the device arrays `value` holds to `out`; False if it holds a pointer whose bytes
    cannot be named (an object with data_ptr() and nothing else)."""
    if isinstance(value, _SCALARS):
        return True
    try:
        is_array = rec.gpu.is_array(value)
    except RuntimeError:
        if getattr(value, "requires_grad", False) is not True:
            raise
        # torch refuses __cuda_array_interface__ on a tensor that requires grad: a detached
        # view has the same bytes (made quietly: it is ours, not the program's)
        with suppressed():
            value = value.detach()
        is_array = rec.gpu.is_array(value)
    if is_array:
        out.append(value)
        return True
    if isinstance(value, (tuple, list)):
        if depth >= _MAX_NESTING:
            return not value
        ok = True
        for item in value:
            ok = _arrays(rec, item, out, depth + 1) and ok
        return ok
    base = getattr(value, "base", None)  # triton.reinterpret's TensorWrapper, TensorDescriptor
    if base is not None and base is not value and depth < _MAX_NESTING and not isinstance(base, _SCALARS):
        return _arrays(rec, base, out, depth + 1)
    if getattr(value, "is_cuda", None) is False:  # a host tensor: Triton refuses it at the launch
        return True
    return not callable(getattr(value, "data_ptr", None))


def accesses(rec, plan: Plan, args, kwargs) -> tuple:
    reads, writes, undecided, opaque = [], [], set(), []
    params, access, index = plan.params, plan.access, plan.index
    n = len(params)

    def take(i: int, name: str, value) -> None:
        kind = access[i] if i < n else "w"  # past the parameters (a *args): written
        if kind == "-":
            return
        found: list = []
        if not _arrays(rec, value, found):
            opaque.append(name)
        if not found:
            return
        (reads if kind == "r" else writes).extend(found)
        if kind == "w" and plan.analysis is not None and name not in plan.analysis.writes and name not in plan.stated:
            undecided.add(name)

    for i, value in enumerate(args):
        take(i, params[i] if i < n else f"#{i}", value)
    for key, value in kwargs.items():
        i = index.get(key)
        if i is not None:
            take(i, key, value)
    if (undecided or opaque or (plan.analysis is not None and plan.analysis.notes)) and rec not in plan.told:
        _tell(rec, plan, undecided, opaque)
    return reads, writes


def _tell(rec, plan: Plan, undecided, opaque) -> None:
    """The notices of a kernel, once per recording: the arguments assumed written and why,
    the pointers whose bytes cannot be named, stores the analysis cannot attribute."""
    if plan.analysis is not None:
        for note in plan.analysis.notes:
            rec.notice(f"Triton kernel `{plan.name}`: {note}")
    if undecided and plan.analysis is not None:
        rec.notice(plan.analysis.assumed(undecided))
    if opaque:
        rec.notice(f"Triton kernel `{plan.name}`: argument(s) {', '.join(f'`{p}`' for p in opaque)} hold a "
                   "pointer (data_ptr()) without __cuda_array_interface__: their bytes are not checked")
    if undecided or opaque or plan.analysis is None or not plan.analysis.undecided:
        plan.told.add(rec)  # else: an undecided parameter may still get a tensor at a later launch


def _site(rec):
    """The user's line: the first frame outside streamcheck, the GPU library and triton
    (`kernel[grid](...)` goes through triton's __getitem__ lambda and its autotuner)."""
    resolver = _sites.get(rec)
    if resolver is None:
        triton = sys.modules.get("triton")
        extra = ()
        if triton is not None and getattr(triton, "__file__", None):
            extra = (os.path.dirname(os.path.abspath(triton.__file__)) + os.sep,)
        resolver = _sites[rec] = SiteResolver(tuple(rec.site.internal) + extra)
    return resolver()


def _launch_stream() -> int:
    """The cudaStream_t Triton launches on now, asked the way JITFunction.run asks it."""
    driver = sys.modules["triton.runtime"].driver.active
    return int(driver.get_current_stream(driver.get_current_device()))


def _compiled(jit) -> Optional[int]:
    """How many specializations Triton has compiled for `jit` (its per-device kernel caches)."""
    try:
        return sum(len(cache[0]) for cache in jit.device_caches.values())
    except (AttributeError, TypeError, IndexError, KeyError):
        return None


def _run(orig):
    def run(self, *args, **kwargs):
        if kwargs.get("warmup") or quiet():
            return orig(self, *args, **kwargs)
        rec = R.current
        try:
            plan = plan_of(self)
            stream = _launch_stream()
            reads, writes = accesses(rec, plan, args, kwargs)
            site = _site(rec)
        except Exception as exc:  # never into the program: this launch goes unrecorded
            rec.errors.append(f"Triton launch of `{getattr(self, '__name__', self)}`: {type(exc).__name__}: {exc}; "
                              "not recorded")
            return orig(self, *args, **kwargs)
        before = _compiled(self)
        result = rec.launch(plan.name, lambda: orig(self, *args, **kwargs), stream=stream, reads=reads, writes=writes,
                            site=site)
        if before is not None and (_compiled(self) or 0) > before:
            rec.implicit(f"compile and module load of Triton kernel `{plan.name}` (its first launch with these "
                         "argument types)")
        return result
    return forwarding(orig, run)


def install(rec, patcher) -> None:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        rec.notice("TRITON_INTERPRET is set: Triton kernels run in its interpreter on the host; their launches are "
                   "not checked")


def patches() -> tuple:
    """The entry points this adapter intercepts (none while triton is not loaded)."""
    if "triton" not in sys.modules:
        return ()
    return (Patch("triton.runtime.jit.JITFunction.run", _run),)
