"""Which parameters of a Triton kernel it writes, from the kernel's Python source.

Triton kernels have no `const` in their signature: every argument is a pointer or a scalar,
and whether a pointer is written shows only in the body. This module reads the body (the
`ast` of `JITFunction.src`, never triton itself) and follows, per parameter, where its
pointer value flows:

- through pointer arithmetic (`x_ptr + offs`), local assignments (`p = ...`, `p += ...`,
  including loop-carried ones), `tl.make_block_ptr` / `tl.advance` /
  `tl.make_tensor_descriptor`, `tl.where`, `tl.multiple_of`, broadcasts and reshapes;
- to a sink that writes memory: `tl.store`, `tl.atomic_*` (except `atomic_load`/`atomic_poll`),
  `tl.store_tensor_descriptor`, a descriptor's `.store` / `.atomic_*` / `.scatter`.

A parameter that reaches a sink is *written*; one that cannot be followed to the end is
*undecided*, with the reason (a call into a function the analysis cannot read, a function
passed in as a constexpr, `tl.inline_asm_elementwise`, a pointer taken out of a tuple, a
statement it does not model): the launch adapter counts it as written and says it assumed
so. Every other non-constexpr parameter is *read* (a scalar parameter lands there too; only
tensor arguments are recorded at a launch, so that costs nothing).

The analysis is flow-sensitive (an assignment replaces what a name held; the branches of an
`if` are joined; a loop body is repeated until nothing changes), so reusing one variable for
a load pointer and then a store pointer does not make the loaded tensor written.

Jitted helpers are followed when the caller supplies `Source.resolve` (the launch adapter
looks names up in the kernel's globals): a helper is summarised once (which of its
parameters it writes, which flow into its return value) and the summary is applied at each
call. Without a resolver a helper that receives a pointer makes that pointer undecided.
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Optional

__all__ = ["Source", "KernelAccess", "analyze", "DEFAULT_TL_ALIASES"]

DEFAULT_TL_ALIASES = frozenset({"tl", "triton.language", "language"})
_MAX_DEPTH = 8  # helper nesting followed; deeper calls are undecided

ELEM = "elem"  # origin kind: a value taken out of a tuple (or struct) parameter
DIRECT = ""

# tl functions that write through their first argument (the pointer, block pointer or descriptor).
_TL_WRITES = frozenset({
    "store", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_xchg",
    "atomic_xor", "atomic_store", "store_tensor_descriptor", "_experimental_descriptor_store",
    "experimental_descriptor_store",
})
_POINTER_KEYWORDS = ("pointer", "ptr", "base", "desc", "desc_pointer")
# tl functions that read through their first argument and return data, not pointers.
_TL_READS = frozenset({
    "load", "atomic_load", "atomic_poll", "load_tensor_descriptor", "_experimental_descriptor_load",
    "experimental_descriptor_load",
})
# tl functions whose effect on memory cannot be read from the source.
_TL_OPAQUE = frozenset({"inline_asm_elementwise"})
# tl functions that write no memory and may return a pointer derived from some of their
# arguments: name -> (positions, keywords) of those arguments (a shape, stride or offset never is).
_TL_CARRY = {
    **dict.fromkeys(("make_block_ptr", "make_tensor_descriptor", "_experimental_make_tensor_descriptor", "advance"),
                    ((0,), ("base",))),
    **dict.fromkeys(("broadcast_to", "cast", "expand_dims", "flip", "gather", "max_constancy", "max_contiguous",
                     "multiple_of", "permute", "ravel", "reshape", "split", "squeeze", "trans", "unsqueeze", "view"),
                    ((0,), ("input", "src"))),
    **dict.fromkeys(("broadcast", "cat", "interleave", "join"), ((0, 1), ("input", "other", "a", "b"))),
    "where": ((1, 2), ("x", "y")),
    "tuple": (tuple(range(16)), ("args",)),
}
# tl functions that write no memory and return values, never pointers (Triton 3.x's
# triton.language.__all__ less the ones above, and the names older 3.x versions had).
_TL_VALUES = frozenset("""
PropagateNan TRITON_MAX_TENSOR_NUMEL abs add arange argmax argmin associative_scan assume bfloat16 bitonic_merge
block_type cdiv ceil clamp condition const constexpr constexpr_type cos cumprod cumsum debug_barrier device_assert
device_print div_rn dot dot_scaled dtype erf exp exp2 expect_zero fdiv float16 float32 float64 float8e4b15
float8e4b8 float8e4nv float8e5 float8e5b16 floor fma full histogram int1 int16 int32 int64 int8 log log2
map_elementwise max maximum min minimum mul num_programs pair_uniform_to_normal philox philox_impl pi32_t
pointer_type program_id rand rand4x randint randint4x randn randn4x range reduce reduce_or rsqrt sigmoid sin slice
softmax sort sqrt sqrt_rn static_assert static_print static_range sub sum swizzle2d tensor tensor_descriptor
to_tensor topk uint16 uint32 uint64 uint8 uint_to_uniform_float umulhi void xor_sum zeros zeros_like
""".split())
# Methods of tl values (tensors, block pointers, descriptors) that write through the receiver.
_WRITE_METHODS = frozenset({
    "store", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_xchg",
    "atomic_xor", "atomic_store", "scatter",
})
_READ_METHODS = frozenset({"load", "atomic_load", "atomic_poll"})
# Attributes of tl values that are metadata, not pointers.
_META_ATTRS = frozenset({
    "dtype", "type", "shape", "numel", "ndim", "rank", "element_ty", "block_shape", "layout", "handle", "value",
    "primitive_bitwidth", "is_ptr", "name",
})
# Python builtins a kernel may call on values: no memory effect, the result carries the arguments.
_BUILTINS = frozenset({
    "abs", "bool", "float", "int", "isinstance", "len", "max", "min", "print", "range", "sum", "hasattr", "str", "type",
})
_BUILTIN_CARRY = frozenset({"enumerate", "list", "reversed", "tuple", "zip"})  # their results hold their arguments
_RANGES = frozenset({"range", "static_range"})  # loops over integers


@dataclass(frozen=True)
class Source:
    """A kernel's (or helper's) source and what is needed to read its calls.

    `resolve(dotted_name)`: the Source of the jitted function that name means where this
    function is defined, or None; `tl_aliases`: dotted names bound to `triton.language`;
    `tl_imports`: local name -> triton.language function (`from triton.language import
    store`); `file`, `first_line`: where line 1 of `text` is, for the reasons given."""

    text: str
    name: str = ""
    resolve: Optional[Callable[[str], Optional["Source"]]] = None
    tl_aliases: frozenset = DEFAULT_TL_ALIASES
    tl_imports: Mapping = field(default_factory=dict)
    file: str = ""
    first_line: int = 1


@dataclass(frozen=True)
class KernelAccess:
    """What a kernel does with its parameters. `writes`, `reads` and `undecided` are disjoint
    and, with `constexprs`, cover `params`; `evidence` says where each write was seen,
    `undecided` why each parameter could not be decided. `returns`: (parameter, kind) that
    may flow into the return value (helpers). `error`: the source could not be read at all
    (every argument then counts as written)."""

    name: str
    params: tuple
    positional: tuple  # the parameters that can be passed by position, in order
    vararg: Optional[str]
    constexprs: frozenset
    writes: frozenset
    reads: frozenset
    undecided: Mapping
    evidence: Mapping
    notes: tuple = ()
    returns: frozenset = frozenset()
    error: str = ""

    def access(self, param: str) -> str:
        """'w' (written, or undecided: assumed written), 'r' (read) or '-' (constexpr)."""
        if param in self.constexprs:
            return "-"
        if param in self.reads:
            return "r"
        return "w"  # written, undecided, or a name the analysis does not know

    def spec(self) -> dict:
        """{argument position: 'r' | 'w' | '-'} over the positional parameters (kernel_access's form)."""
        return {i: self.access(p) for i, p in enumerate(self.positional)}

    def assumed(self, params=None) -> str:
        """One line saying which parameters (of `params`, default all undecided) were assumed
        written and why; "" when none was."""
        if self.error:
            return f"Triton kernel `{self.name}`: {self.error}; every tensor argument counted as written"
        chosen = [p for p in self.params if p in self.undecided and (params is None or p in params)]
        if not chosen:
            return ""
        why = "; ".join(f"`{p}`: {self.undecided[p]}" for p in chosen)
        return (f"Triton kernel `{self.name}`: assumed written (could not tell from its source): {why}. "
                f"streamcheck.declare_kernel({self.name!r}, reads=..., writes=...) says otherwise")


def analyze(source, name: str = "") -> KernelAccess:
    """The access of the kernel in `source` (a Source, or source text: a `def`, decorators
    allowed)."""
    if isinstance(source, str):
        source = Source(source, name=name)
    return _analyze(source, depth=0, stack=(), cache={})


# --- the analysis -------------------------------------------------------------------------------

def _parse(source: Source):
    text = textwrap.dedent(source.text)
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return None, f"its source does not parse ({exc.msg}, line {exc.lineno})"
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            return node, ""
    return None, "no function definition in its source"


def _unreadable(name: str, error: str) -> KernelAccess:
    return KernelAccess(name=name, params=(), positional=(), vararg=None, constexprs=frozenset(), writes=frozenset(),
                        reads=frozenset(), undecided=MappingProxyType({}), evidence=MappingProxyType({}), error=error)


def _analyze(source: Source, depth: int, stack: tuple, cache: dict) -> KernelAccess:
    key = (source.text, source.name, source.file, source.first_line)
    if key in cache:
        return cache[key]
    node, error = _parse(source)
    if node is None:
        result = _unreadable(source.name or "?", error)
    else:
        result = _Function(source, node, depth, stack + (key,), cache).run()
    cache[key] = result
    return result


def _is_constexpr(annotation) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return "constexpr" in annotation.value
    dotted = _dotted(annotation.value if isinstance(annotation, ast.Subscript) else annotation)
    return dotted is not None and dotted.rpartition(".")[2] == "constexpr"


def _dotted(node) -> Optional[str]:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _root(node) -> Optional[str]:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_broadcast_index(node) -> bool:
    """`[:, None]`, `[None, :]`, `[:]`: tensor indexing (slices and None only), not a tuple element."""
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return all(isinstance(i, ast.Slice) or (isinstance(i, ast.Constant) and (i.value is None or i.value is Ellipsis))
               for i in items)


def _elem(origins) -> frozenset:
    return frozenset((p, ELEM) for p, _kind in origins)


def _join(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, frozenset()) | v
    return out


class _Function:
    """One function's analysis: an environment (local name -> origins: frozenset of
    (parameter, kind)) carried through the statements in order."""

    def __init__(self, source: Source, node: ast.FunctionDef, depth: int, stack: tuple, cache: dict):
        self.source, self.node, self.depth, self.stack, self.cache = source, node, depth, stack, cache
        self.name = source.name or node.name
        args = node.args
        self.positional = tuple(a.arg for a in args.posonlyargs + args.args)
        self.vararg = args.vararg.arg if args.vararg else None
        every = list(args.posonlyargs + args.args) + ([args.vararg] if args.vararg else []) + list(args.kwonlyargs)
        self.params = tuple(a.arg for a in every)
        self.constexprs = frozenset(a.arg for a in every if _is_constexpr(a.annotation))
        self.writes: dict = {}
        self.undecided: dict = {}
        self.notes: list = []
        self.returns: set = set()
        self.gave_up = ""
        self.env: dict = {}
        for p in self.params:
            if p in self.constexprs:
                self.env[p] = frozenset()
            else:
                self.env[p] = frozenset({(p, ELEM if p == self.vararg else DIRECT)})
        self.locals = set(self.params)  # every name the function binds (not module names)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                self.locals.add(sub.id)

    def where(self, node) -> str:
        line = self.source.first_line + getattr(node, "lineno", 1) - 1
        return f"{self.source.file}:{line}" if self.source.file else f"line {line}"

    def run(self) -> KernelAccess:
        self.block(self.node.body)
        if self.gave_up:
            for p in self.params:
                if p not in self.constexprs:
                    self.undecided.setdefault(p, self.gave_up)
        writes = frozenset(self.writes)
        undecided = {p: r for p, r in self.undecided.items() if p not in writes and p not in self.constexprs}
        reads = frozenset(p for p in self.params if p not in self.constexprs and p not in writes and p not in undecided)
        return KernelAccess(name=self.name, params=self.params, positional=self.positional, vararg=self.vararg,
                            constexprs=self.constexprs, writes=writes, reads=reads,
                            undecided=MappingProxyType(undecided), evidence=MappingProxyType(dict(self.writes)),
                            notes=tuple(dict.fromkeys(self.notes)), returns=frozenset(self.returns))

    # --- effects ---
    def sink(self, origins, node, what: str, detail: str = "") -> None:
        if not origins:
            self.notes.append(f"{self.where(node)}: {what} through a pointer no parameter gives (one loaded from "
                              "memory?): the memory it writes is not seen; declare it with declare_access")
        for p, kind in origins:
            if kind == ELEM:
                self.undecided.setdefault(p, f"{what} at {self.where(node)} through an element of tuple parameter "
                                             f"`{p}` (its elements are not told apart)")
            else:
                self.writes.setdefault(p, f"{what} at {self.where(node)}{detail}")

    def opaque(self, origins, reason: str) -> None:
        for p, _kind in origins:
            self.undecided.setdefault(p, reason)

    # --- statements ---
    def block(self, body) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, node) -> None:
        kind = type(node)
        if kind is ast.Assign:
            value = self.expr(node.value)
            for target in node.targets:
                self.assign(target, node.value, value)
        elif kind is ast.AnnAssign:
            if node.value is not None:
                self.assign(node.target, node.value, self.expr(node.value))
        elif kind is ast.AugAssign:
            value = self.expr(node.value)
            if isinstance(node.target, ast.Name):
                self.env[node.target.id] = self.env.get(node.target.id, frozenset()) | value
            else:
                self.expr(node.target)
        elif kind is ast.Expr:
            self.expr(node.value)
        elif kind is ast.Return:
            if node.value is not None:
                self.returns.update(self.expr(node.value))
        elif kind is ast.If:
            self.expr(node.test)
            before = dict(self.env)
            self.block(node.body)
            after_body, self.env = self.env, before
            self.block(node.orelse)
            self.env = _join(after_body, self.env)
        elif kind in (ast.For, ast.While):
            self.loop(node)
        elif kind is ast.With:
            for item in node.items:
                value = self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, item.context_expr, value)
            self.block(node.body)
        elif kind is ast.Assert:
            self.expr(node.test)
        elif kind in (ast.Pass, ast.Break, ast.Continue, ast.Global, ast.Nonlocal):
            pass
        elif kind is ast.Try:
            before = dict(self.env)
            self.block(node.body)
            self.block(node.orelse)
            joined = self.env
            for handler in node.handlers:
                self.env = dict(before)
                self.block(handler.body)
                joined = _join(joined, self.env)
            self.env = joined
            self.block(node.finalbody)
        else:  # a def, a class, match, del, raise, ...: not modelled
            self.gave_up = f"a `{kind.__name__}` statement at {self.where(node)}, which the analysis does not model"

    def loop(self, node) -> None:
        is_for = isinstance(node, ast.For)
        if is_for:
            it = node.iter
            callee = _dotted(it.func) if isinstance(it, ast.Call) else None
            over = self.expr(it)
            if callee is not None and callee.rpartition(".")[2] in _RANGES:
                items = frozenset()
            else:  # iterating a tuple (or zip/enumerate of tuples): its elements
                items = _elem(over)
        for _ in range(64):  # origins only grow, so this ends far sooner
            before = dict(self.env)
            if is_for:
                self.assign(node.target, None, items)
            else:
                self.expr(node.test)
            self.block(node.body)
            self.env = _join(before, self.env)
            if self.env == before:
                break
        self.block(node.orelse)

    def assign(self, target, value_node, value) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value_node, (ast.Tuple, ast.List)) and len(value_node.elts) == len(target.elts) and \
                    not any(isinstance(e, ast.Starred) for e in value_node.elts):
                for t, v in zip(target.elts, value_node.elts):
                    self.assign(t, v, self.expr(v))
                return
            # unpacking a call's results (tl.split) keeps their kind; unpacking a tuple value gives elements
            parts = value if isinstance(value_node, ast.Call) else _elem(value)
            for t in target.elts:
                self.assign(t.value if isinstance(t, ast.Starred) else t, None, parts)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, None, value)
        else:  # x.attr = v, x[i] = v: Triton has no such stores into memory
            self.expr(target)

    # --- expressions ---
    def expr(self, node) -> frozenset:
        if node is None:
            return frozenset()
        kind = type(node)
        if kind is ast.Name:
            return self.env.get(node.id, frozenset())
        if kind is ast.Constant:
            return frozenset()
        if kind is ast.BinOp:
            # Pointer arithmetic is pointer ± integer: a product, quotient, shift or mask of a
            # pointer is a type error in Triton, so `row * stride` carries no pointer.
            left, right = self.expr(node.left), self.expr(node.right)
            return left | right if isinstance(node.op, (ast.Add, ast.Sub)) else frozenset()
        if kind is ast.UnaryOp:
            operand = self.expr(node.operand)
            return operand if isinstance(node.op, ast.UAdd) else frozenset()
        if kind is ast.BoolOp:
            return frozenset().union(*(self.expr(v) for v in node.values))
        if kind is ast.Compare:  # a mask, never a pointer
            self.expr(node.left)
            for c in node.comparators:
                self.expr(c)
            return frozenset()
        if kind is ast.IfExp:
            self.expr(node.test)
            return self.expr(node.body) | self.expr(node.orelse)
        if kind is ast.Call:
            return self.call(node)
        if kind is ast.Attribute:
            value = self.expr(node.value)
            if node.attr in _META_ATTRS:
                return frozenset()
            if node.attr == "T":
                return value
            return _elem(value)  # a field of a tuple-like parameter
        if kind is ast.Subscript:
            value = self.expr(node.value)
            self.expr(node.slice)
            return value if _is_broadcast_index(node.slice) else _elem(value)
        if kind in (ast.Tuple, ast.List, ast.Set):
            return frozenset().union(*(self.expr(e) for e in node.elts))
        if kind is ast.Starred:
            return self.expr(node.value)
        if kind is ast.NamedExpr:
            value = self.expr(node.value)
            self.assign(node.target, node.value, value)
            return value
        if kind is ast.Slice:
            for part in (node.lower, node.upper, node.step):
                self.expr(part)
            return frozenset()
        if kind is ast.Dict:
            return frozenset().union(*(self.expr(v) for v in node.values))
        if kind in (ast.JoinedStr, ast.FormattedValue):
            return frozenset()
        # comprehensions, lambdas, await...: not modelled; what they touch cannot be followed
        seen = frozenset().union(*(self.env.get(n.id, frozenset()) for n in ast.walk(node) if isinstance(n, ast.Name)))
        self.opaque(seen, f"used in a `{kind.__name__}` at {self.where(node)}, which the analysis does not model")
        return seen

    def call(self, node: ast.Call) -> frozenset:
        args = [self.expr(a) for a in node.args]
        star = frozenset().union(*(args[i] for i, a in enumerate(node.args) if isinstance(a, ast.Starred)))
        kwargs = {}
        extra = frozenset()
        for kw in node.keywords:
            value = self.expr(kw.value)
            if kw.arg is None:  # **mapping
                extra |= value
            else:
                kwargs[kw.arg] = value
        every = frozenset().union(*args, *kwargs.values(), extra)
        func = node.func

        # a method of a value (a tensor, a block pointer, a descriptor): a local, or an
        # expression such as `tl.load(p).to(...)`, rather than a module path
        if isinstance(func, ast.Attribute) and (_root(func.value) in self.locals or _dotted(func.value) is None):
            receiver = self.expr(func.value)
            method = func.attr
            if method in _WRITE_METHODS:
                self.sink(receiver, node, f"`.{method}`")
                return frozenset()
            if method in _READ_METHODS:
                return frozenset()
            return receiver  # .to(), .reshape(), .advance(), ...: the receiver's pointer, if any

        dotted = _dotted(func)
        if dotted is None or (isinstance(func, ast.Name) and func.id in self.locals):
            # computed callee, or a function passed in as an argument (a constexpr): not readable
            what = f"`{dotted}`, a function given as an argument," if dotted else "a computed function"
            self.opaque(every, f"passed at {self.where(node)} to {what} which the analysis cannot read")
            return every

        tl_name = self.tl_function(dotted)
        if tl_name is not None:
            return self.tl_call(tl_name, node, args, kwargs, every)
        if dotted in _BUILTINS:
            return frozenset()
        if dotted in _BUILTIN_CARRY:
            return every
        return self.helper_call(dotted, node, args, kwargs, star, extra, every)

    def tl_function(self, dotted: str) -> Optional[str]:
        """The triton.language function `dotted` names here, or None."""
        if dotted in self.source.tl_imports:
            return self.source.tl_imports[dotted]
        for alias in self.source.tl_aliases | DEFAULT_TL_ALIASES:
            if dotted.startswith(alias + "."):
                return dotted.rpartition(".")[2]
        return None

    def tl_call(self, name: str, node, args, kwargs, every) -> frozenset:
        if name in _TL_WRITES:
            pointer = args[0] if args else next((kwargs[k] for k in _POINTER_KEYWORDS if k in kwargs), frozenset())
            self.sink(pointer, node, f"tl.{name}")
            return frozenset()
        if name in _TL_READS:
            return frozenset()
        if name in _TL_OPAQUE:
            self.opaque(every, f"passed at {self.where(node)} to tl.{name} (inline assembly may write memory)")
            return every
        carry = _TL_CARRY.get(name)
        if carry is not None:
            positions, keywords = carry
            return frozenset().union(*(args[i] for i in positions if i < len(args)),
                                     *(kwargs[k] for k in keywords if k in kwargs))
        if name in _TL_VALUES:
            return frozenset()
        self.opaque(every, f"passed at {self.where(node)} to tl.{name}, which the analysis does not know")
        return every

    def helper_call(self, dotted: str, node, args, kwargs, star, extra, every) -> frozenset:
        if not every:
            return frozenset()  # nothing of ours goes in: whatever it does, it is not to our parameters
        helper = None
        if self.source.resolve is not None and self.depth < _MAX_DEPTH:
            try:
                helper = self.source.resolve(dotted)
            except Exception:  # a lookup that fails is a helper we cannot read
                helper = None
        if helper is None:
            self.opaque(every, f"passed at {self.where(node)} to `{dotted}`, which the analysis cannot read")
            return every
        key = (helper.text, helper.name, helper.file, helper.first_line)
        if key in self.stack:
            self.opaque(every, f"passed at {self.where(node)} to `{dotted}`, a recursive call")
            return every
        summary = _analyze(helper, self.depth + 1, self.stack, self.cache)
        bound = None if summary.error or extra else _bind(summary, args, kwargs, star, node)
        if bound is None:
            why = summary.error or "its arguments do not match its parameters"
            self.opaque(every, f"passed at {self.where(node)} to `{dotted}` ({why})")
            return every
        site = f"`{dotted}` at {self.where(node)}"
        for note in summary.notes:
            self.notes.append(f"{site}: {note}")
        for q, origins in bound.items():
            if not origins:  # nothing of ours in that argument (`offs` beside the pointer)
                continue
            if q in summary.writes:
                self.sink(origins, node, f"`{dotted}`", f" ({summary.evidence.get(q, 'written')})")
            elif q in summary.undecided:
                self.opaque(origins, f"passed to {site} as `{q}`: {summary.undecided[q]}")
        result = set()
        for q, kind in summary.returns:
            origins = bound.get(q, frozenset())
            result.update(_elem(origins) if kind == ELEM else origins)
        return frozenset(result)


def _bind(summary: KernelAccess, args, kwargs, star, node) -> Optional[dict]:
    """helper parameter -> origins of what the call passes it; None if the call does not fit."""
    bound: dict = {}
    positional = [a for a, n in zip(args, node.args) if not isinstance(n, ast.Starred)]
    if len(positional) > len(summary.positional) and summary.vararg is None:
        return None
    for q, origins in zip(summary.positional, positional):
        bound[q] = origins
    rest = positional[len(summary.positional):]
    if summary.vararg is not None:
        bound[summary.vararg] = _elem(frozenset().union(*rest, star))
    if star:  # f(*t): whatever t holds may land in any parameter not yet bound by position
        for q in summary.positional[len(positional):]:
            bound[q] = bound.get(q, frozenset()) | _elem(star)
    for k, origins in kwargs.items():
        if k not in summary.params:
            return None
        bound[k] = bound.get(k, frozenset()) | origins
    return bound
