"""The architecture, checked: the analysis core imports nothing outside itself, the tool never
imports its subject, and no import cycle exists anywhere in streamcheck/ or flashnorm_kernels/,
counting imports inside functions as well as at module level (docs/architecture.md)."""
from __future__ import annotations

import ast
import os

from tests.paths import ROOT

PACKAGES = ("streamcheck", "flashnorm_kernels")
CORE = "streamcheck.core"
# What the core may import besides itself: the standard library and numpy, nothing that
# touches a GPU, a framework, or the rest of streamcheck.
CORE_THIRD_PARTY = {"numpy"}


def _modules() -> dict:
    """module name -> path, for every .py file of the packages."""
    found = {}
    for package in PACKAGES:
        for folder, _dirs, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str) -> set:
    """Absolute names of everything `module` imports, anywhere in its body."""
    path = MODULES[module]
    is_package = path.endswith("__init__.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            names.add(prefix)
            # `from package import submodule` imports the submodule
            names.update(f"{prefix}.{alias.name}" for alias in node.names if f"{prefix}.{alias.name}" in MODULES)
    return names


def _internal_edges() -> dict:
    edges = {}
    for module in MODULES:
        targets = set()
        for name in _imports(module):
            # the module itself or its longest known prefix (an attribute import names a module's member)
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # parents load implicitly
                targets.add(name)
        edges[module] = targets
    return edges


def _cycles(edges: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_core_exists_and_imports_nothing_outside_itself():
    core = [m for m in MODULES if m == CORE or m.startswith(CORE + ".")]
    assert {f"{CORE}.trace", f"{CORE}.hb", f"{CORE}.capture", f"{CORE}.schedule"} <= set(core)
    import sys

    stdlib = set(sys.stdlib_module_names)
    bad = []
    for module in core:
        for name in _imports(module):
            top = name.split(".")[0]
            inside = name == CORE or name.startswith(CORE + ".")
            if not inside and top not in stdlib and top not in CORE_THIRD_PARTY:
                bad.append(f"{module} imports {name}")
    assert bad == []


def test_the_tool_never_imports_its_subject():
    bad = [f"{m} imports {name}" for m in MODULES if m.startswith("streamcheck")
           for name in _imports(m) if name.split(".")[0] == "flashnorm_kernels"]
    assert bad == []


def test_no_import_cycles():
    assert _cycles(_internal_edges()) == []


def test_imports_inside_functions_count_and_the_cycle_finder_finds_cycles():
    # Session.__init__ imports the CuPy device adapter inside the function, not at the top.
    assert "streamcheck.record.adapters.cuda_device" in _imports("streamcheck.record.instrument")
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
