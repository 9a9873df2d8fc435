"""The architecture, checked: the analysis core imports nothing outside itself, the tool never
imports its subject, each layer's folder imports only the layers its row in docs/architecture.md
lists, and no import cycle exists anywhere in streamcheck/ or flashnorm_kernels/, counting imports
inside functions as well as at module level."""
from __future__ import annotations

import ast
import os

from tests.paths import ROOT

PACKAGES = ("streamcheck", "flashnorm_kernels")
CORE = "streamcheck.core"
# What the core may import besides itself: the standard library and numpy, nothing that
# touches a GPU, a framework, or the rest of streamcheck.
CORE_THIRD_PARTY = {"numpy"}
# What each layer's folder may import besides itself and the leaves (docs/architecture.md's table).
# Layers not named here (plugin/, commands/, cli.py, strategies.py) sit above them all.
LEAVES = ("streamcheck.atomic_files", "streamcheck.timeout", "streamcheck.interrupts", "streamcheck.native_build")
# Beside the core: modules every layer may use, each importing only the core (checked below).
BESIDE_THE_CORE = ("streamcheck.host_handoffs",)
MAY_IMPORT = {
    "streamcheck.analyses": ("streamcheck.core",),
    "streamcheck.pictures": ("streamcheck.core",),
    "streamcheck.device": ("streamcheck.core",),
    "streamcheck.record": ("streamcheck.core", "streamcheck.device"),
    "streamcheck.proofs": ("streamcheck.core", "streamcheck.analyses", "streamcheck.device", "streamcheck.record",
                           "streamcheck.plugin.results"),
    # torch's CUDA emulated over the device API, with the torch adapter's access rule (one model).
    "streamcheck.emulation": ("streamcheck.core", "streamcheck.device", "streamcheck.record"),
}
# Imports against those rules the tree has, each with its reason; a new one fails the test.
CROSSINGS = {
    ("streamcheck.device.backends", "streamcheck.record.gpu"): "gpu_available: the GPU plumbing both GPU paths share",
    ("streamcheck.device.backends.cupy_backend", "streamcheck.record.gpu"): "the bounded spin, capture modes, warm-up",
    ("streamcheck.device.backends.cupy_backend", "streamcheck.proofs.confirm_gpu"):
        "the cupy backend runs confirmation's probe (lazily, only when a rerun asks for one)",
}
# Nothing below the CLI imports it.
ABOVE_ALL = ("streamcheck.cli", "streamcheck.commands", "streamcheck.__main__")


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


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _layer_violations(edges: dict) -> list:
    """`a imports b` for every edge a layer's rule does not allow."""
    bad = []
    for module, targets in sorted(edges.items()):
        if not module.startswith("streamcheck"):
            continue  # the subject plugs into the CLI (its commands) like any package
        layer = next((layer for layer in MAY_IMPORT if _within(module, (layer,))), None)
        for target in sorted(targets):
            if not target.startswith("streamcheck") or _within(target, LEAVES + BESIDE_THE_CORE) \
                    or (module, target) in CROSSINGS:
                continue
            below_the_cli = not _within(module, ABOVE_ALL)
            if below_the_cli and _within(target, ABOVE_ALL):
                bad.append(f"{module} imports {target}")
            elif layer and not _within(target, (layer,) + MAY_IMPORT[layer]):
                bad.append(f"{module} imports {target}")
    return bad


def test_each_layer_imports_only_the_layers_below_it():
    edges = _internal_edges()
    assert _layer_violations(edges) == []
    beside = {f"{m} imports {t}" for m in BESIDE_THE_CORE for t in edges[m] if not _within(t, (CORE,))}
    assert beside == set()


def test_the_layer_rules_see_an_import_across_layers():
    # A picture that needs the device API, a proof that runs the CLI, a recorder that runs reruns.
    edges = {"streamcheck.pictures.export": {"streamcheck.device.api", "streamcheck.core.trace"},
             "streamcheck.proofs.confirm": {"streamcheck.commands.run"},
             "streamcheck.record.recorder": {"streamcheck.proofs.confirm_gpu", "streamcheck.atomic_files"},
             "streamcheck.device.backends.sim": {"streamcheck.record.gpu"}}
    assert _layer_violations(edges) == ["streamcheck.device.backends.sim imports streamcheck.record.gpu",
                                        "streamcheck.pictures.export imports streamcheck.device.api",
                                        "streamcheck.proofs.confirm imports streamcheck.commands.run",
                                        "streamcheck.record.recorder imports streamcheck.proofs.confirm_gpu"]
    assert all((a, b) in _internal_edges_or_none() for a, b in CROSSINGS), "a crossing the tree no longer has"


def _internal_edges_or_none() -> set:
    return {(a, b) for a, targets in _internal_edges().items() for b in targets}


def test_imports_inside_functions_count_and_the_cycle_finder_finds_cycles():
    # Session.__init__ imports the CuPy device adapter inside the function, not at the top.
    assert "streamcheck.record.adapters.cuda_device" in _imports("streamcheck.record.instrument")
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
