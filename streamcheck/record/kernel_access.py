"""Which arguments a kernel reads and which it may write.

From the CUDA signature (`const T*` is read only, any other pointer may be written) or from
what the user declared with `declare_kernel`, which wins. Pure text processing: shared by
every adapter that launches kernels by source (CuPy's RawKernel / RawModule, Triton later).
"""
from __future__ import annotations

import re
from typing import Optional

_DECLARED: dict = {}  # kernel name -> {arg index: "r" | "w" | "-"} (declare_kernel)


def split_top(text: str) -> list:
    """Split on commas outside (), <>, [] and {}."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def param_access(param: str) -> str:
    """'r' for `const T*` (read only), 'w' for any other pointer (may be written), '-' otherwise."""
    param = re.sub(r"/\*.*?\*/|//[^\n]*", " ", param)
    if "*" not in param and "[" not in param:
        return "-"
    head = param.split("*", 1)[0] if "*" in param else param
    return "r" if re.search(r"\bconst\b", head) else "w"


def kernel_signature(code: Optional[str], name: str) -> Optional[tuple]:
    """Per-parameter access ('r'/'w'/'-') of `__global__ ... name(...)` in CUDA source, or None
    when the kernel is not found (precompiled module, macro-generated name)."""
    if not code:
        return None
    base = name.split("<", 1)[0].strip()
    pattern = re.compile(r"__global__\b[^;{]*?\b" + re.escape(base) + r"\s*\(")
    for match in pattern.finditer(code):
        start = match.end()
        depth, i = 1, start
        while i < len(code) and depth:
            if code[i] == "(":
                depth += 1
            elif code[i] == ")":
                depth -= 1
            i += 1
        params = code[start:i - 1].strip()
        if not params or params == "void":
            return ()
        return tuple(param_access(p) for p in split_top(params))
    return None


def param_names(spec: str) -> list:
    """Names of ElementwiseKernel/ReductionKernel params: 'T x, raw T y' -> ['x', 'y']."""
    return [p.split()[-1] for p in split_top(spec or "") if p.split()]


def declare_kernel(name: str, *, reads=(), writes=(), ignore=()) -> None:
    """Say how kernel `name` (RawKernel/RawModule function or ElementwiseKernel name) uses its
    arguments, by position: overrides what the CUDA signature says. Array arguments not listed
    count as written (the conservative choice)."""
    spec = {}
    for i in reads:
        spec[int(i)] = "r"
    for i in writes:
        spec[int(i)] = "w"
    for i in ignore:
        spec[int(i)] = "-"
    _DECLARED[name] = spec


def declared(name: str) -> Optional[dict]:
    """What declare_kernel said of `name` ({arg index: 'r'/'w'/'-'}), or None."""
    return _DECLARED.get(name)


def forget_declaration(name: str) -> None:
    """Drop what declare_kernel said of `name`: its signature decides again."""
    _DECLARED.pop(name, None)


def access_spec(name: str, code: Optional[str]) -> dict:
    """{arg index: 'r'/'w'/'-'} for a launch of kernel `name` compiled from `code`: the
    declaration if there is one, else the signature; an array passed where the signature has
    no pointer still gets its address, so it counts as written; unknown: {} (all written)."""
    spec = _DECLARED.get(name)
    if spec is not None:
        return spec
    sig = kernel_signature(code, name)
    return {i: ("w" if k == "-" else k) for i, k in enumerate(sig)} if sig is not None else {}
