"""Every public torch.cuda name is emulated, refused in one line, or unchanged (docs/emulation.md's table
"Every torch.cuda name", the one source of truth): the walk of torch's public CUDA API finds each name in
the table, so a torch that adds a name fails here until it is classified; each refused name raises
EmulationError naming it and this file's line; each emulated one runs with typical arguments.
"""
from __future__ import annotations

import ast
import copy
import importlib
import pkgutil
import re
import types
import warnings
from pathlib import Path

import pytest
import torch

from streamcheck.device import Device
from streamcheck.emulation.torch_cuda import Emulation, EmulationError

HERE = Path(__file__)
DOC = HERE.parents[3] / "docs" / "emulation.md"
SECTION = "## Every `torch.cuda` name"
KINDS = ("emulated", "refused", "unchanged")


# --- the table ---------------------------------------------------------------------------------------------

def doc_table() -> dict:
    """name -> (kind, note) from the section's rows; a row may name several names."""
    text = DOC.read_text(encoding="utf-8")
    assert SECTION in text, f"{DOC.name} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    table = {}
    for row in body.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[1] not in KINDS:
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            assert name not in table, f"{name} is classified twice"
            table[name] = (cells[1], cells[2])
    return table


# --- the walk ----------------------------------------------------------------------------------------------

def _is_api(module, name: str, value) -> bool:
    """Whether `module.name` is the module's API, not a name it imported for itself (os, typing's Any,
    functools' lru_cache, torch's private helpers, torch itself)."""
    if name.startswith("_"):
        return False
    if isinstance(value, types.ModuleType):
        return value.__name__.startswith(module.__name__ + ".")
    import typing
    if getattr(typing, name, None) is value:
        return False
    home = getattr(value, "__module__", None)
    if isinstance(value, (types.FunctionType, type)) or callable(value):
        return isinstance(home, str) and home.startswith("torch") and not home.startswith("torch._")
    return True  # data: flags, tables, type aliases


def _stub_members(class_name: str) -> set:
    """The public members torch's stubs give a C class (torch/_C/__init__.pyi): what a GPU build's
    CUDA classes have beyond what a CPU-only build shows."""
    tree = ast.parse((Path(torch.__file__).parent / "_C" / "__init__.pyi").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            names = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            names |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            return {n for n in names if not n.startswith("_")}
    raise AssertionError(f"torch's stubs have no class {class_name}")


_PROTOCOL = ("__cuda_stream__", "__enter__", "__exit__")  # dunders that are API: protocols programs use


def _members(cls, *stub_classes) -> set:
    names = {n for n in dir(cls) if not n.startswith("_") or n in _PROTOCOL}
    for stub in stub_classes:
        names |= _stub_members(stub)
    return names


def walk() -> set:
    """Every public name of torch's CUDA API, as the table spells it."""
    cuda = torch.cuda
    names = set()
    for name in dir(cuda):
        if _is_api(cuda, name, getattr(cuda, name)):
            names.add(f"torch.cuda.{name}")
    for info in pkgutil.iter_modules(cuda.__path__):  # submodules, imported by torch or not
        if not info.name.startswith("_"):
            names.add(f"torch.cuda.{info.name}")
    for sub in ("memory", "graphs", "streams", "random"):  # re-exported by torch.cuda, or their own rows
        module = importlib.import_module(f"torch.cuda.{sub}")
        own = getattr(module, "__all__", None) or [
            n for n in dir(module) if getattr(getattr(module, n), "__module__", None) == module.__name__]
        names |= {f"torch.cuda.{sub}.{n}" for n in own if not n.startswith("_") and not hasattr(cuda, n)}
    # The CUDA classes as a GPU build has them: subclasses of torch.Stream / torch.Event there, with C
    # bases that are stubs in a CPU-only build.
    names |= {f"torch.cuda.Stream.{n}" for n in _members(cuda.Stream, "_CudaStreamBase") | _members(torch.Stream)}
    names |= {f"torch.cuda.Event.{n}" for n in _members(cuda.Event, "_CudaEventBase") | _members(torch.Event)}
    names |= {f"torch.cuda.CUDAGraph.{n}" for n in _members(cuda.CUDAGraph, "_CUDAGraph")}
    names |= {f"torch.Stream.{n}" for n in _members(torch.Stream)}
    names |= {f"torch.Event.{n}" for n in _members(torch.Event)}
    accelerator = torch.accelerator
    names |= {f"torch.accelerator.{n}" for n in dir(accelerator) if _is_api(accelerator, n, getattr(accelerator, n))}
    backends = torch.backends.cuda
    names |= {f"torch.backends.cuda.{n}" for n in dir(backends) if _is_api(backends, n, getattr(backends, n))}
    return names


WALKED = walk()
TABLE = doc_table()


def test_every_public_cuda_name_is_classified_in_the_docs_table():
    missing = sorted(WALKED - set(TABLE))
    assert not missing, (f"{len(missing)} public name(s) of torch {torch.__version__}'s CUDA API are not in "
                         f"{DOC.name}'s table ({SECTION}): classify each as emulated, refused or unchanged:\n"
                         + "\n".join(missing))


def test_the_table_names_only_what_torch_has():
    stale = sorted(set(TABLE) - WALKED)
    assert not stale, f"{DOC.name}'s table names what torch {torch.__version__} does not have:\n" + "\n".join(stale)


# --- under the emulation ------------------------------------------------------------------------------------

def emulate(program, *, policy: str = "sequential", **params):
    dev = Device("sim", policy=policy, **params)
    with Emulation(dev) as emulation:
        value = program()
    return dev, value, emulation


def _resolve(name: str):
    """The object `name` names under the emulation (an instance's member through an instance)."""
    instances = {"torch.cuda.Stream": lambda: torch.cuda.Stream(), "torch.cuda.Event": lambda: torch.cuda.Event(),
                 "torch.cuda.CUDAGraph": lambda: torch.cuda.CUDAGraph(),
                 "torch.Stream": lambda: torch.Stream(device="cuda"), "torch.Event": lambda: torch.Event(device="cuda")}
    owner, _, member = name.rpartition(".")
    if owner in instances:
        return getattr(instances[owner](), member)
    parts = name.split(".")
    value = importlib.import_module(parts[0])
    for k, part in enumerate(parts[1:], 2):
        if not hasattr(value, part) and isinstance(value, types.ModuleType):
            importlib.import_module(".".join(parts[:k]))  # a submodule torch has not imported yet
        value = getattr(value, part)
    return value


def _module_members(name: str) -> list:
    """What a refused module refuses, read from torch before any emulation: its public functions (and the
    private ones surface.REFUSED_MODULES lists), and its public types."""
    from streamcheck.emulation.surface import REFUSED_MODULES, public_functions
    module = importlib.import_module(name)
    short = name.rsplit(".", 1)[-1]
    kept = {"is_available"} if short == "nccl" else set()  # nccl.is_available() is False, not refused
    members = [n for n in public_functions(module) + list(REFUSED_MODULES.get(short, ("", ()))[1]) if n not in kept]
    members += [n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_")
                and v.__module__.startswith(name)]
    assert members, f"{name} is refused but has nothing to call"
    return members


_SUBMODULES = {f"torch.cuda.{info.name}" for info in pkgutil.iter_modules(torch.cuda.__path__)}
REFUSED_MEMBERS = {n: _module_members(n) for n, (kind, _) in TABLE.items() if kind == "refused" and n in _SUBMODULES}


def _refused_callables(name: str, value) -> list:
    """(name, callable) for each thing a refused row refuses: the name itself, or a refused module's members."""
    if not isinstance(value, types.ModuleType):
        return [(name, value)]
    return [(f"{name}.{member}", getattr(value, member)) for member in REFUSED_MEMBERS[name]]


def _call(target):
    return target()  # the-call


def test_every_refused_name_raises_one_line_naming_it_and_the_callers_line():
    where = f"{HERE.name}:{_line('# the-call')}"

    def program():
        problems = []
        for name in sorted(n for n, (kind, _) in TABLE.items() if kind == "refused"):
            for what, target in _refused_callables(name, _resolve(name)):
                try:
                    _call(target)
                except EmulationError as exc:
                    text = str(exc)
                    short = what.rsplit(".", 1)[-1]
                    if "\n" in text or short not in text or where not in text:
                        problems.append(f"{what}: {text!r}")
                except Exception as exc:  # noqa: BLE001 (any other error is the finding)
                    problems.append(f"{what}: {type(exc).__name__}: {exc}")
                else:
                    problems.append(f"{what}: not refused")
        return problems

    _, problems, _ = emulate(program)
    assert not problems, "\n".join(problems)


def _line(tag: str) -> int:
    hits = [n for n, text in enumerate(HERE.read_text(encoding="utf-8").splitlines(), 1) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, tag
    return hits[0]


# A typical call of each emulated name, run under the emulation (properties: read through an instance).
def _graph_kept():
    g = torch.cuda.CUDAGraph(keep_graph=True)
    x = torch.ones(2, device="cuda")
    with torch.cuda.graph(g):
        x.mul_(2)
    g.instantiate()
    g.replay()
    return x.tolist()


def _accelerator_graph():
    x = torch.ones(2, device="cuda")
    g = torch.accelerator.Graph()
    with torch.cuda.stream(torch.cuda.Stream()):
        with g:
            x.add_(1)
    g.replay()
    return x.tolist()


TYPICAL = {
    "torch.cuda.is_available": lambda: torch.cuda.is_available(),
    "torch.cuda.is_initialized": lambda: torch.cuda.is_initialized(),
    "torch.cuda.init": lambda: torch.cuda.init(),
    "torch.cuda.device_count": lambda: torch.cuda.device_count(),
    "torch.cuda.current_device": lambda: torch.cuda.current_device(),
    "torch.cuda.set_device": lambda: torch.cuda.set_device(0),
    "torch.cuda.device": lambda: torch.cuda.device(0).__enter__(),
    "torch.cuda.device_of": lambda: torch.cuda.device_of(torch.ones(1, device="cuda")).__enter__(),
    "torch.cuda.get_device_name": lambda: torch.cuda.get_device_name(0),
    "torch.cuda.get_device_capability": lambda: torch.cuda.get_device_capability(),
    "torch.cuda.get_device_properties": lambda: torch.cuda.get_device_properties(0).total_memory,
    "torch.cuda.get_arch_list": lambda: torch.cuda.get_arch_list(),
    "torch.cuda.get_gencode_flags": lambda: torch.cuda.get_gencode_flags(),
    "torch.cuda.is_bf16_supported": lambda: torch.cuda.is_bf16_supported(),
    "torch.cuda.is_tf32_supported": lambda: torch.cuda.is_tf32_supported(),
    "torch.cuda.has_half": lambda: torch.cuda.has_half,
    "torch.cuda.has_magma": lambda: torch.cuda.has_magma,
    "torch.cuda.can_device_access_peer": lambda: torch.cuda.can_device_access_peer(0, 0),
    "torch.cuda.Stream": lambda: torch.cuda.Stream(priority=-1),
    "torch.cuda.current_stream": lambda: torch.cuda.current_stream(),
    "torch.cuda.default_stream": lambda: torch.cuda.default_stream(0),
    "torch.cuda.set_stream": lambda: torch.cuda.set_stream(torch.cuda.current_stream()),
    "torch.cuda.stream": lambda: torch.cuda.stream(torch.cuda.Stream()).__enter__(),
    "torch.cuda.StreamContext": lambda: torch.cuda.StreamContext(torch.cuda.Stream()).__enter__(),
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize(),
    "torch.cuda.Stream.query": lambda: torch.cuda.Stream().query(),
    "torch.cuda.Stream.synchronize": lambda: torch.cuda.Stream().synchronize(),
    "torch.cuda.Stream.wait_event": lambda: torch.cuda.Stream().wait_event(torch.cuda.Event()),
    "torch.cuda.Stream.wait_stream": lambda: torch.cuda.Stream().wait_stream(torch.cuda.current_stream()),
    "torch.cuda.Stream.record_event": lambda: torch.cuda.Stream().record_event(),
    "torch.cuda.Stream.__enter__": lambda: torch.cuda.Stream().__enter__(),
    "torch.cuda.Stream.__exit__": lambda: (lambda s: (s.__enter__(), s.__exit__(None, None, None)))(torch.cuda.Stream()),
    "torch.cuda.Stream.is_capturing": lambda: torch.cuda.Stream().is_capturing(),
    "torch.cuda.Stream.device": lambda: torch.cuda.Stream().device,
    "torch.cuda.Stream.device_index": lambda: torch.cuda.Stream().device_index,
    "torch.cuda.Stream.device_type": lambda: torch.cuda.Stream().device_type,
    "torch.cuda.Stream.stream_id": lambda: torch.cuda.Stream().stream_id,
    "torch.cuda.Stream.priority": lambda: torch.cuda.Stream().priority,
    "torch.cuda.Stream.priority_range": lambda: torch.cuda.Stream.priority_range(),
    "torch.cuda.Stream.cuda_stream": lambda: torch.cuda.Stream().cuda_stream,
    "torch.cuda.Stream.native_handle": lambda: torch.cuda.Stream().native_handle,
    "torch.cuda.Stream.__cuda_stream__": lambda: torch.cuda.Stream().__cuda_stream__(),
    "torch.cuda.Event": lambda: torch.cuda.Event(enable_timing=True, blocking=True, external=True),
    "torch.cuda.Event.record": lambda: torch.cuda.Event().record(),
    "torch.cuda.Event.wait": lambda: torch.cuda.Event().wait(),
    "torch.cuda.Event.query": lambda: torch.cuda.Event().query(),
    "torch.cuda.Event.synchronize": lambda: torch.cuda.Event().synchronize(),
    "torch.cuda.Event.elapsed_time": lambda: (lambda a, b: (a.record(), b.record(), b.synchronize(), a.elapsed_time(b)))(
        torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)),
    "torch.cuda.Event.device": lambda: torch.cuda.Event().device,
    "torch.cuda.Event.cuda_event": lambda: torch.cuda.Event().cuda_event,
    "torch.cuda.Event.event_id": lambda: torch.cuda.Event().event_id,
    "torch.cuda.CUDAGraph": lambda: torch.cuda.CUDAGraph(keep_graph=True),
    "torch.cuda.graph": _graph_kept, "torch.cuda.CUDAGraph.capture_begin": _graph_kept,
    "torch.cuda.CUDAGraph.capture_end": _graph_kept, "torch.cuda.CUDAGraph.replay": _graph_kept,
    "torch.cuda.CUDAGraph.instantiate": _graph_kept,
    "torch.cuda.graph_pool_handle": lambda: torch.cuda.graph_pool_handle(),
    "torch.cuda.is_current_stream_capturing": lambda: torch.cuda.is_current_stream_capturing(),
    "torch.cuda.CUDAGraph.reset": lambda: torch.cuda.CUDAGraph().reset(),
    "torch.cuda.CUDAGraph.pool": lambda: torch.cuda.CUDAGraph().pool(),
    "torch.cuda.CUDAGraph.enable_debug_mode": lambda: torch.cuda.CUDAGraph().enable_debug_mode(),
    "torch.cuda.graphs": lambda: torch.cuda.graphs.graph_pool_handle(),
    "torch.cuda.streams": lambda: torch.cuda.streams.Stream(),
    "torch.cuda.random": lambda: torch.cuda.random.get_rng_state_all(),
    "torch.cuda.memory": lambda: torch.cuda.memory.memory_allocated(),
    "torch.cuda.manual_seed": lambda: torch.cuda.manual_seed(1),
    "torch.cuda.manual_seed_all": lambda: torch.cuda.manual_seed_all(1),
    "torch.cuda.seed": lambda: torch.cuda.seed(), "torch.cuda.seed_all": lambda: torch.cuda.seed_all(),
    "torch.cuda.initial_seed": lambda: torch.cuda.initial_seed(),
    "torch.cuda.get_rng_state": lambda: torch.cuda.get_rng_state(),
    "torch.cuda.set_rng_state": lambda: torch.cuda.set_rng_state(torch.cuda.get_rng_state()),
    "torch.cuda.get_rng_state_all": lambda: torch.cuda.get_rng_state_all(),
    "torch.cuda.set_rng_state_all": lambda: torch.cuda.set_rng_state_all(torch.cuda.get_rng_state_all()),
    "torch.cuda.default_generators": lambda: torch.cuda.default_generators[0].initial_seed(),
    "torch.cuda.memory_allocated": lambda: torch.cuda.memory_allocated(),
    "torch.cuda.max_memory_allocated": lambda: torch.cuda.max_memory_allocated(0),
    "torch.cuda.memory_reserved": lambda: torch.cuda.memory_reserved(),
    "torch.cuda.max_memory_reserved": lambda: torch.cuda.max_memory_reserved(),
    "torch.cuda.memory_cached": lambda: torch.cuda.memory_cached(),
    "torch.cuda.max_memory_cached": lambda: torch.cuda.max_memory_cached(),
    "torch.cuda.memory_stats": lambda: torch.cuda.memory_stats(),
    "torch.cuda.memory_stats_as_nested_dict": lambda: torch.cuda.memory_stats_as_nested_dict(),
    "torch.cuda.caching_allocator_alloc": lambda: torch.cuda.caching_allocator_delete(
        torch.cuda.caching_allocator_alloc(1024)),
    "torch.cuda.caching_allocator_delete": lambda: torch.cuda.caching_allocator_delete(
        torch.cuda.caching_allocator_alloc(512)),
    "torch.cuda.memory_summary": lambda: torch.cuda.memory_summary(),
    "torch.cuda.reset_peak_memory_stats": lambda: torch.cuda.reset_peak_memory_stats(),
    "torch.cuda.reset_max_memory_allocated": lambda: torch.cuda.reset_max_memory_allocated(),
    "torch.cuda.reset_max_memory_cached": lambda: torch.cuda.reset_max_memory_cached(),
    "torch.cuda.reset_accumulated_memory_stats": lambda: torch.cuda.reset_accumulated_memory_stats(),
    "torch.cuda.mem_get_info": lambda: torch.cuda.mem_get_info(),
    "torch.cuda.empty_cache": lambda: torch.cuda.empty_cache(),
    "torch.cuda.ipc_collect": lambda: torch.cuda.ipc_collect(),
    "torch.cuda.set_per_process_memory_fraction": lambda: torch.cuda.set_per_process_memory_fraction(0.5),
    "torch.cuda.get_per_process_memory_fraction": lambda: torch.cuda.get_per_process_memory_fraction(),
    "torch.cuda.get_allocator_backend": lambda: torch.cuda.get_allocator_backend(),
    **{f"torch.cuda.{n}": (lambda n=n: getattr(torch.cuda, n)(2)) for n in (
        "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
        "CharTensor", "ByteTensor", "BoolTensor")},
    "torch.cuda.get_sync_debug_mode": lambda: torch.cuda.get_sync_debug_mode(),
    "torch.cuda.set_sync_debug_mode": lambda: torch.cuda.set_sync_debug_mode("default"),
    "torch.cuda.cudart": lambda: torch.cuda.cudart().cudaProfilerStart(),
    "torch.cuda.check_error": lambda: torch.cuda.check_error(0),
    "torch.cuda.profiler": lambda: torch.cuda.profiler.profile().__enter__(),
    "torch.cuda.nvtx": lambda: (torch.cuda.nvtx.range_push("x"), torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.mark("m"),
                                torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("r"))),
    "torch.cuda.amp": lambda: torch.cuda.amp.GradScaler().scale(torch.ones(1, device="cuda")),
    "torch.Stream.query": lambda: torch.Stream(device="cuda").query(),
    "torch.Stream.synchronize": lambda: torch.Stream(device="cuda").synchronize(),
    "torch.Stream.wait_event": lambda: torch.Stream(device="cuda").wait_event(torch.Event(device="cuda")),
    "torch.Stream.wait_stream": lambda: torch.Stream(device="cuda").wait_stream(torch.accelerator.current_stream()),
    "torch.Stream.record_event": lambda: torch.Stream(device="cuda").record_event(),
    "torch.Stream.is_capturing": lambda: torch.Stream(device="cuda").is_capturing(),
    "torch.Stream.__enter__": lambda: torch.Stream(device="cuda").__enter__(),
    "torch.Stream.__exit__": lambda: (lambda s: (s.__enter__(), s.__exit__(None, None, None)))(torch.Stream()),
    "torch.Stream.device": lambda: torch.Stream(device="cuda").device,
    "torch.Stream.device_index": lambda: torch.Stream(device="cuda").device_index,
    "torch.Stream.device_type": lambda: torch.Stream(device="cuda").device_type,
    "torch.Stream.stream_id": lambda: torch.Stream(device="cuda").stream_id,
    "torch.Stream.native_handle": lambda: torch.Stream(device="cuda").native_handle,
    "torch.Event.record": lambda: torch.Event(device="cuda").record(),
    "torch.Event.wait": lambda: torch.Event(device="cuda").wait(),
    "torch.Event.query": lambda: torch.Event(device="cuda").query(),
    "torch.Event.synchronize": lambda: torch.Event(device="cuda").synchronize(),
    "torch.Event.elapsed_time": lambda: (lambda a, b: (a.record(), b.record(), b.synchronize(), a.elapsed_time(b)))(
        torch.Event(device="cuda", enable_timing=True), torch.Event(enable_timing=True)),
    "torch.Event.device": lambda: torch.Event(device="cuda").device,
    "torch.Event.event_id": lambda: torch.Event(device="cuda").event_id,
    "torch.accelerator.is_available": lambda: torch.accelerator.is_available(),
    "torch.accelerator.device_count": lambda: torch.accelerator.device_count(),
    "torch.accelerator.current_accelerator": lambda: torch.accelerator.current_accelerator(check_available=True),
    "torch.accelerator.current_device_index": lambda: torch.accelerator.current_device_index(),
    "torch.accelerator.current_device_idx": lambda: torch.accelerator.current_device_idx(),
    "torch.accelerator.set_device_index": lambda: torch.accelerator.set_device_index(0),
    "torch.accelerator.set_device_idx": lambda: torch.accelerator.set_device_idx(0),
    "torch.accelerator.device_index": lambda: torch.accelerator.device_index(0).__enter__(),
    "torch.accelerator.get_device_capability": lambda: torch.accelerator.get_device_capability(),
    "torch.accelerator.current_stream": lambda: torch.accelerator.current_stream(),
    "torch.accelerator.set_stream": lambda: torch.accelerator.set_stream(torch.Stream()),
    "torch.accelerator.synchronize": lambda: torch.accelerator.synchronize(),
    "torch.accelerator.Graph": _accelerator_graph, "torch.accelerator.graphs": lambda: torch.accelerator.graphs.Graph(),
    "torch.accelerator.empty_cache": lambda: torch.accelerator.empty_cache(),
    "torch.accelerator.empty_host_cache": lambda: torch.accelerator.empty_host_cache(),
    "torch.accelerator.memory_stats": lambda: torch.accelerator.memory_stats(),
    "torch.accelerator.memory_allocated": lambda: torch.accelerator.memory_allocated(),
    "torch.accelerator.max_memory_allocated": lambda: torch.accelerator.max_memory_allocated(),
    "torch.accelerator.memory_reserved": lambda: torch.accelerator.memory_reserved(),
    "torch.accelerator.max_memory_reserved": lambda: torch.accelerator.max_memory_reserved(),
    "torch.accelerator.reset_accumulated_memory_stats": lambda: torch.accelerator.reset_accumulated_memory_stats(),
    "torch.accelerator.reset_peak_memory_stats": lambda: torch.accelerator.reset_peak_memory_stats(),
    "torch.accelerator.get_memory_info": lambda: torch.accelerator.get_memory_info(),
    "torch.accelerator.memory": lambda: torch.accelerator.memory.memory_allocated(),
    "torch.backends.cuda.cufft_plan_cache": lambda: (torch.backends.cuda.cufft_plan_cache.size,
                                                     torch.backends.cuda.cufft_plan_cache[0].max_size),
}

def test_every_emulated_name_has_a_typical_call():
    emulated = {n for n, (kind, _) in TABLE.items() if kind == "emulated"}
    assert not sorted(emulated - set(TYPICAL)), sorted(emulated - set(TYPICAL))
    assert not sorted(set(TYPICAL) - emulated), sorted(set(TYPICAL) - emulated)


def _typical_failures(names) -> list:
    def program():
        problems = []
        for name in sorted(names):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    TYPICAL[name]()
            except Exception as exc:  # noqa: BLE001 (any error is the finding)
                problems.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        return problems

    return emulate(program)[1]


def test_every_emulated_name_runs_with_typical_arguments():
    failures = _typical_failures(set(TYPICAL))
    assert not failures, "\n".join(failures)


def test_unchanged_names_resolve_and_reexports_are_the_emulations_in_both_places():
    def program():
        problems = [n for n, (kind, _) in TABLE.items() if kind == "unchanged" and _resolve(n) is None]
        for sub in ("memory", "random", "graphs", "streams"):
            module = getattr(torch.cuda, sub)
            for name in getattr(module, "__all__", None) or []:
                if hasattr(torch.cuda, name) and getattr(module, name) is not getattr(torch.cuda, name):
                    problems.append(f"torch.cuda.{sub}.{name} is not torch.cuda.{name} under the emulation")
        return problems

    _, problems, _ = emulate(program)
    assert not problems, problems


# --- what each emulated name does, as a GPU does it ---------------------------------------------------------

def test_legacy_constructors_make_emulated_tensors_of_their_dtype():
    def program():
        sizes = torch.cuda.FloatTensor(2, 3)
        values = torch.cuda.LongTensor([1, 2])
        empty = torch.cuda.HalfTensor()
        with pytest.raises(TypeError):
            torch.cuda.FloatTensor(torch.ones(2))  # a host tensor is not a torch.cuda.FloatTensor
        return ((sizes.shape, sizes.dtype, sizes.device.type), values.tolist(), values.dtype, empty.shape,
                isinstance(values, torch.cuda.LongTensor), isinstance(values, torch.cuda.FloatTensor),
                torch.cuda.FloatTensor(sizes) is not None)

    _, got, _ = emulate(program)
    assert got == ((torch.Size([2, 3]), torch.float32, "cuda"), [1, 2], torch.int64, torch.Size([0]), True, False,
                   True)


def test_deepcopy_is_a_clone_on_the_current_stream_so_an_unjoined_producer_races_with_it():
    def program(wait):
        side = torch.cuda.Stream()
        x = torch.zeros(256, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(5)  # produce
        if wait:
            torch.cuda.current_stream().wait_stream(side)
        copied = copy.deepcopy(x)  # deepcopy
        return copied.device.type, copied.data_ptr() != x.data_ptr(), copied.sum().item(), x

    dev, (kind, fresh, total, _), _ = emulate(lambda: program(False), policy="delay", streams=["s1"], steps=8)
    assert kind == "cuda" and fresh
    found = {(r.kind, r.first.site.line, r.second.site.line) for r in dev.races}
    assert ("RAW", _line("# produce"), _line("# deepcopy")) in found
    assert total == 0.0  # the copy ran before the producer: stale bytes, as on a GPU
    dev, (_, _, total, _), _ = emulate(lambda: program(True), policy="delay", streams=["s1"], steps=8)
    assert not dev.races and total == 5.0 * 256


def test_deepcopy_of_a_module_and_of_pinned_memory_keeps_values_parameters_and_pinnedness_as_torch_does():
    def program():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2).cuda()
        twin = copy.deepcopy(model)
        pinned = torch.arange(4.0).pin_memory()
        host = copy.deepcopy(pinned)
        return ([torch.equal(a.cpu(), b.cpu()) for a, b in zip(model.parameters(), twin.parameters())],
                [isinstance(p, torch.nn.Parameter) and p.device.type == "cuda" for p in twin.parameters()],
                twin.weight.data_ptr() != model.weight.data_ptr(), host.tolist(), host.is_pinned())

    _, (equal, params, fresh, host, pinned), _ = emulate(program)
    assert all(equal) and all(params) and fresh
    assert host == [0.0, 1.0, 2.0, 3.0] and not pinned  # torch's storage clone is pageable


def test_storage_of_emulated_and_pinned_tensors_describes_their_bytes():
    def program():
        t = torch.ones(2, 3, device="cuda")
        p = torch.ones(5, dtype=torch.float64, pin_memory=True)
        s, ps = t.storage(), p.storage()
        return (s.size(), s.dtype, s.device.type, s.is_cuda, s.data_ptr() == t.data_ptr(), ps.size(),
                ps.is_pinned(), p.untyped_storage().is_pinned(), t.untyped_storage().is_pinned())

    _, got, _ = emulate(program)
    # Whole 512-byte blocks back both (the allocator rounds), counted in elements of the dtype.
    assert got == (128, torch.float32, "cuda", True, True, 64, True, True, False)


def test_stream_and_event_handles_and_capture_state_read_as_on_a_gpu():
    def program():
        side, legacy = torch.cuda.Stream(), torch.cuda.default_stream()
        event = torch.cuda.Event(external=True)
        before = event.cuda_event
        event.record(side)
        g = torch.cuda.CUDAGraph()
        x = torch.ones(2, device="cuda")
        with torch.cuda.graph(g):
            capturing = torch.cuda.current_stream().is_capturing()
            x.mul_(2)
        return (legacy.cuda_stream, side.cuda_stream != 0, side.__cuda_stream__() == (0, side.cuda_stream),
                before, event.cuda_event != 0, event.device, capturing, side.is_capturing(),
                isinstance(side, torch.cuda.Stream), isinstance(side, torch.Stream), torch.cuda.Stream.priority_range())

    _, got, _ = emulate(program)
    assert got == (0, True, True, 0, True, torch.device("cuda", 0), True, False, True, True, (0, -3))


def test_instantiate_needs_a_capture_and_keep_graph_and_then_replays():
    def program():
        with pytest.raises(RuntimeError, match="capture_end"):
            torch.cuda.CUDAGraph(keep_graph=True).instantiate()
        plain = torch.cuda.CUDAGraph()
        x = torch.ones(2, device="cuda")
        with torch.cuda.graph(plain):
            x.add_(1)
        with pytest.raises(RuntimeError, match="keep_graph=true"):
            plain.instantiate()
        return _graph_kept()

    _, values, _ = emulate(program)
    assert values == [2.0, 2.0]


def test_sync_debug_mode_warns_or_raises_at_implicit_syncs_never_at_synchronize():
    def program():
        x = torch.ones(3, device="cuda")
        torch.cuda.set_sync_debug_mode("warn")
        with pytest.warns(UserWarning, match="called a synchronizing CUDA operation"):
            x.sum().item()
        torch.cuda.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match="called a synchronizing CUDA operation"):
            x.cpu()
        torch.cuda.synchronize()  # explicit: allowed
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        return mode, x.sum().item()

    _, got, _ = emulate(program)
    assert got == (2, 3.0)


def test_torch_stream_and_event_on_cuda_are_emulated_and_their_missing_wait_is_a_race():
    def program(wait):
        x = torch.zeros(256, device="cuda")
        side = torch.Stream(device="cuda")
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            x.add_(1)  # generic-produce
        if wait:
            done = torch.Event(device="cuda")
            done.record(side)
            done.wait(torch.accelerator.current_stream())
        return (x * 2).sum().item()  # generic-consume

    dev, total, _ = emulate(lambda: program(False), policy="delay", streams=["s1"], steps=8)
    assert ("RAW", _line("# generic-produce"), _line("# generic-consume")) in {
        (r.kind, r.first.site.line, r.second.site.line) for r in dev.races}
    dev, total, _ = emulate(lambda: program(True), policy="delay", streams=["s1"], steps=8)
    assert not dev.races and total == 512.0


def test_accelerator_answers_for_the_emulated_cuda_device():
    def program():
        side = torch.cuda.Stream(device=1)
        torch.accelerator.set_stream(side)
        return (torch.accelerator.current_accelerator(), torch.accelerator.device_count(),
                torch.accelerator.current_device_index(), torch.accelerator.current_stream() == side)

    _, got, _ = emulate(program, devices=2)
    assert got == (torch.device("cuda"), 2, 1, True)


def test_autocast_on_cuda_applies_cudas_rules_to_emulated_tensors():
    def program():
        a = torch.ones(2, 2, device="cuda")
        with torch.autocast("cuda"):
            return (a @ a).dtype, (a + a).dtype, (a @ a).float().softmax(0).dtype

    _, got, _ = emulate(program)
    assert got == (torch.float16, torch.float32, torch.float32)  # as an H100 gives them


def test_cudart_error_codes_read_as_cudas_and_the_profiler_markers_run():
    def program():
        torch.cuda.check_error(0)
        with torch.cuda.profiler.profile():
            pass
        with pytest.raises(torch.cuda.CudaError, match=r"out of memory \(2\)"):
            torch.cuda.check_error(2)
        torch.cuda.manual_seed(3)
        a = torch.randn(4, device="cuda").tolist()
        torch.cuda.default_generators[0].manual_seed(3)
        return a == torch.randn(4, device="cuda").tolist()

    _, same, _ = emulate(program)
    assert same
