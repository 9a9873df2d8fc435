"""The torch.cuda names the emulation stands in for while it runs, and the refusals (CuPy, Triton,
`ExternalStream`, `make_graphed_callables`, autograd, NVML, NCCL, ...): each one line that names it and the
user's line. docs/emulation.md's table "Every torch.cuda name" classifies every public name; the API walk
test (tests/streamcheck/emulation/test_api_surface.py) holds the two together.
"""
from __future__ import annotations

import sys

import torch

from ..device.objects import caller_site
from .accelerator import patch_accelerator
from .generators import Generator
from .graphs import EmulatedGraph, graph
from .legacy_types import (SPARSE_REFUSAL, STORAGE_REFUSAL, STORAGE_TYPES, TENSOR_TYPES, legacy_tensor_type,
                           refused_type)
from .memory_stats import memory_functions
from .running import ON_A_GPU, EmulationError, refused
from .streams import EmulatedEvent, Stream, device, stream
from .tensors import is_emulated

_NVML = "the sim has no NVML sensors (a GPU's utilization, memory use, temperature, power, clocks and processes); " \
    + ON_A_GPU
_ONE_ALLOCATOR = "pluggable allocators and memory pools are not emulated: the sim has one caching allocator, " \
    "whose reuse rule is what it checks; " + ON_A_GPU
_RAW_HANDLE = "a raw handle for a CUDA library (cuBLAS, cuSOLVER) does not exist on the sim; " + ON_A_GPU
_OTHER_STREAM = "a stream another library made (CuPy, a CUDA extension) does not exist on the sim; " + ON_A_GPU

# torch.cuda names refused in one line: name -> why.
REFUSED = {
    "caching_allocator_alloc": "raw allocations from the caching allocator (pointers for CUDA code) are not "
                               "emulated; allocate a tensor instead, or " + ON_A_GPU,
    "caching_allocator_delete": "raw allocations from the caching allocator (pointers for CUDA code) are not "
                                "emulated; allocate a tensor instead, or " + ON_A_GPU,
    "caching_allocator_enable": "turning the caching allocator off is not emulated: the sim's allocator is the "
                                "caching one, whose reuse rule is what it checks; " + ON_A_GPU,
    "caching_allocator_disabled": "turning the caching allocator off is not emulated: the sim's allocator is the "
                                  "caching one, whose reuse rule is what it checks; " + ON_A_GPU,
    "change_current_allocator": _ONE_ALLOCATOR, "use_mem_pool": _ONE_ALLOCATOR,
    "current_blas_handle": _RAW_HANDLE, "current_solver_handle": _RAW_HANDLE,
    "get_stream_from_external": _OTHER_STREAM,
    "clock_rate": _NVML, "power_draw": _NVML, "temperature": _NVML, "utilization": _NVML, "memory_usage": _NVML,
    "device_memory_used": _NVML, "list_gpu_processes": _NVML,
    "memory_snapshot": "the caching allocator's segment snapshot is not emulated yet; read "
                       "torch.cuda.memory_stats(), or " + ON_A_GPU,
    **{name: "pinned (host) memory statistics are not emulated yet; " + ON_A_GPU
       for name in ("host_memory_stats", "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
                    "reset_peak_host_memory_stats")},
}
REFUSED_TYPES = {"CUDAPluggableAllocator": _ONE_ALLOCATOR, "MemPool": _ONE_ALLOCATOR,
                 "GreenContext": "green contexts (a share of the GPU's SMs) are not emulated; " + ON_A_GPU}
# torch.cuda's submodules refused as a whole: every public function (and listed private ones) -> why.
REFUSED_MODULES = {
    "nccl": ("NCCL collectives are not emulated on the sim; " + ON_A_GPU, ()),
    "comm": ("torch.cuda.comm's multi-GPU collectives are not emulated on the sim; copy with .to('cuda:N'), or "
             + ON_A_GPU, ()),
    "jiterator": ("jiterator compiles CUDA C++ at run time, which the sim cannot run; " + ON_A_GPU,
                  ("_create_jit_fn", "_create_multi_output_jit_fn")),
    "tunable": ("TunableOp tunes cuBLAS / hipBLASLt GEMMs, which the sim does not run; " + ON_A_GPU, ()),
    "gds": ("GPUDirect Storage (files read into GPU memory) is not emulated on the sim; " + ON_A_GPU, ()),
}
# What each submodule keeps working (the rest of its public functions is refused).
_KEPT = {"nccl": ("is_available",)}

_SUBMODULES = ("memory", "random", "graphs", "streams")  # where torch.cuda's re-exported names live


class SimRuntime:
    """torch.cuda.cudart() on the sim: the CUDA runtime calls torch's helpers make (profiler start/stop,
    `check_error`'s codes and strings); any other runtime call is refused in one line."""

    _ERRORS = {0: "no error", 1: "invalid argument", 2: "out of memory", 3: "initialization error",
               400: "invalid resource handle", 600: "device not ready", 700: "an illegal memory access was "
               "encountered", 900: "operation not permitted when stream is capturing"}

    class cudaError(int):
        success = 0

    def cudaGetErrorString(self, code) -> str:
        return self._ERRORS.get(int(code), "unknown error")

    def cudaProfilerStart(self) -> int:
        return 0  # a profiler marker: nothing to profile on the sim

    def cudaProfilerStop(self) -> int:
        return 0

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return refused(f"torch.cuda.cudart().{name}", "the sim emulates torch's CUDA calls, not the CUDA runtime's; "
                       + ON_A_GPU)


def patch_torch(emu) -> list:
    """Put the emulation's torch.cuda names in place; returns the undo of each, in order."""
    cuda = torch.cuda
    undos: list = []

    def put(owner, name, value):
        missing = object()
        old = owner.__dict__.get(name, missing)
        setattr(owner, name, value)

        def undo():
            if old is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        undos.append(undo)

    def put_cuda(name, value):
        """`name` in torch.cuda and in each submodule that holds torch.cuda's same object (its home,
        or an import of it), so torch's own helpers there (memory_summary, get_rng_state_all) call it."""
        missing = object()
        original = cuda.__dict__.get(name, missing)
        if original is not missing:
            for sub in _SUBMODULES:
                module = getattr(cuda, sub)
                if module.__dict__.get(name, missing) is original:
                    put(module, name, value)
        put(cuda, name, value)

    def make_graphed_callables(*args, **kwargs):
        raise EmulationError(f"torch.cuda.make_graphed_callables at {caller_site()} is not emulated; use "
                             "torch.cuda.graph / CUDAGraph (emulated), or check this program on a GPU "
                             "(streamcheck run --backend gpu)")

    def manual_seed(seed, device=None):
        emu.reseed(emu.generators[emu.current_device() if device is None else emu.device_index(device)], int(seed))

    def manual_seed_all(seed):
        for g in emu.generators:
            emu.reseed(g, int(seed))

    def get_rng_state(device="cuda"):
        return emu.generators[emu.device_index(device)].get_state()

    def set_rng_state(state, device="cuda"):
        emu.generators[emu.device_index(device)].set_state(state)

    def device_properties(device=None):
        return emu.properties[emu.current_device() if device is None else emu.device_index(device)]

    def is_current_stream_capturing():
        tracker = emu.device.capture_tracker
        return bool(tracker.active and tracker.capturing(emu.current_stream().device_stream.id) is not None)

    def set_sync_debug_mode(debug_mode):
        if isinstance(debug_mode, str):
            modes = {"default": 0, "warn": 1, "error": 2}
            if debug_mode not in modes:
                raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
            debug_mode = modes[debug_mode]
        emu.sync_debug_mode = int(debug_mode)

    def can_device_access_peer(device, peer_device):
        # The sim copies between any two of its devices; a device is not its own peer (CUDA says 0).
        return emu.device_index(device) != emu.device_index(peer_device)

    def device_of(obj):
        return device(obj.get_device() if obj.is_cuda else None)

    def compile_(model=None, **kwargs):
        mode = kwargs.get("mode")
        emu.notice("torch.compile under the sim: compiled functions run as eager operators (each ATen operator "
                   "one sim launch, its reads and writes exact); Inductor's fused kernels are not emulated")
        if mode in ("reduce-overhead", "max-autotune") or (kwargs.get("options") or {}).get("triton.cudagraphs"):
            emu.notice(f"torch.compile(mode={mode!r}) under the sim: CUDA graph trees are not emulated, so "
                       "their replays (and races between them) are not checked; run on a GPU for those")
        if model is None:
            return lambda fn: fn
        return model

    surface = {
        "is_available": lambda: True, "is_initialized": lambda: True, "init": lambda: None,
        "_lazy_init": lambda: None, "device_count": lambda: emu.device.devices,
        "current_device": emu.current_device, "set_device": emu.set_current_device, "device": device,
        "get_device_name": lambda device=None: device_properties(device).name,
        "get_device_capability": lambda device=None: (device_properties(device).major,
                                                      device_properties(device).minor),
        "get_device_properties": device_properties,
        "get_arch_list": lambda: ["sm_90"], "is_bf16_supported": lambda including_emulation=True: True,
        "Stream": Stream, "ExternalStream": refused("torch.cuda.ExternalStream", _OTHER_STREAM), "Event": EmulatedEvent,
        "current_stream": lambda device=None: emu.current_stream(device),
        "default_stream": lambda device=None: emu.default_stream(device),
        "set_stream": emu.set_current_stream, "stream": stream, "StreamContext": stream,
        "synchronize": emu.synchronize, "_sleep": emu.sleep,
        "CUDAGraph": EmulatedGraph, "graph": graph, "graph_pool_handle": emu.new_pool,
        "make_graphed_callables": make_graphed_callables,
        "is_current_stream_capturing": is_current_stream_capturing,
        "ipc_collect": lambda: None,
        "manual_seed": manual_seed, "manual_seed_all": manual_seed_all,
        "seed": lambda: emu.generators[emu.current_device()].seed(),
        "seed_all": lambda: [g.seed() for g in emu.generators] and None,
        "initial_seed": lambda: emu.generators[emu.current_device()].initial_seed(),
        "get_rng_state": get_rng_state, "set_rng_state": set_rng_state,
        "default_generators": tuple(emu.generators),
        "device_of": device_of, "can_device_access_peer": can_device_access_peer,
        "get_gencode_flags": lambda: "-gencode compute=compute_90,code=sm_90",
        "get_allocator_backend": lambda: "native",  # torch's own caching allocator: the one the sim emulates
        "has_half": True, "has_magma": True,  # as a GPU build of torch says
        "set_sync_debug_mode": set_sync_debug_mode, "get_sync_debug_mode": lambda: emu.sync_debug_mode,
        # cudart(), check_error and CudaError read torch.cuda's runtime module: the sim's stands in.
        "_cudart": SimRuntime(),
    }
    for name, value in surface.items():
        put_cuda(name, value)
    for name, why in REFUSED.items():
        put_cuda(name, refused(f"torch.cuda.{name}", why))
    for name, why in REFUSED_TYPES.items():
        put_cuda(name, refused_type("torch.cuda", name, why))
    put(cuda.green_contexts, "GreenContext", cuda.GreenContext)
    for name in TENSOR_TYPES:
        put(cuda, name, legacy_tensor_type(name))
    for name in STORAGE_TYPES:
        put(cuda, name, refused_type("torch.cuda", name, STORAGE_REFUSAL))
    for name in TENSOR_TYPES:
        if hasattr(cuda.sparse, name):
            put(cuda.sparse, name, refused_type("torch.cuda.sparse", name, SPARSE_REFUSAL))
    _refuse_modules(put)
    _nvtx_markers(put)
    patch_accelerator(emu, put)
    # Memory statistics (memory_stats.py): torch's own memory_stats, memory_allocated, memory_summary, ...
    # read these; set_per_process_memory_fraction lowers the capacity the allocator enforces.
    cuda_memory, accelerator_memory = memory_functions(emu)
    for name, value in cuda_memory.items():
        put_cuda(name, value)
    for name, value in accelerator_memory.items():
        put(torch.accelerator, name, value)
        put(torch.accelerator.memory, name, value)

    def record_stream(tensor, s):
        emu.enter()
        emu.record_stream(tensor, s)

    # torch's binding parses its argument as a C++ stream before any mode sees it.
    put(torch.Tensor, "record_stream", record_stream)
    put(torch, "Generator", Generator)
    put(torch, "compile", compile_)
    emu.autograd.patch(put)  # torch's engine through the native guard, or its refusals
    # Module.cuda()/.to("cuda") must make new Parameters around emulated tensors: `param.data =` an
    # emulated tensor would leave a plain Parameter that says cuda with no data behind it.
    shallow = torch._has_compatible_shallow_copy_type
    put(torch, "_has_compatible_shallow_copy_type",
        lambda a, b: False if is_emulated(a) or is_emulated(b) else shallow(a, b))
    sys.meta_path.insert(0, refuse_cupy)
    undos.append(lambda: sys.meta_path.remove(refuse_cupy))
    _refuse_triton(put, undos)
    return undos

def _refuse_triton(put, undos: list) -> None:
    """A Triton kernel needs a GPU: its launch is refused in one line (now, or once the program
    imports Triton's JIT)."""
    from ..record.adapters.patching import ImportWatcher

    def refuse(jit_module):
        original = jit_module.JITFunction.run

        def run(self_, *args, **kwargs):
            name = getattr(getattr(self_, "fn", None), "__name__", "kernel")
            raise EmulationError(f"Triton kernel `{name}` launched at {caller_site()}: Triton kernels need a GPU "
                                 "and are not emulated on the sim; check this program on a GPU (streamcheck run "
                                 "--backend gpu)")
        run.__wrapped__ = original
        put(jit_module.JITFunction, "run", run)

    loaded = sys.modules.get("triton.runtime.jit")
    if loaded is not None:
        refuse(loaded)
    else:
        watcher = ImportWatcher({"triton.runtime.jit": refuse})
        undos.append(watcher.remove)



def _refuse_modules(put) -> None:
    """Each public function of REFUSED_MODULES' modules (and their listed private ones): refused in one line."""
    import importlib
    for short, (why, private) in REFUSED_MODULES.items():
        module = importlib.import_module(f"torch.cuda.{short}")
        for name in public_functions(module) + list(private):
            if name not in _KEPT.get(short, ()):
                put(module, name, refused(f"torch.cuda.{short}.{name}", why))
        for name, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__ and not name.startswith("_"):
                put(module, name, refused_type(module.__name__, name, why))
    nccl = importlib.import_module("torch.cuda.nccl")
    put(nccl, "is_available", lambda tensors=None: False)  # no NCCL here: programs that ask take their other path


def public_functions(module) -> list:
    """The public functions of `module`: its __all__'s, or else those it defines."""
    listed = getattr(module, "__all__", None)
    names = listed if listed is not None else [
        n for n in vars(module) if not n.startswith("_")
        and getattr(getattr(module, n), "__module__", None) == module.__name__]
    return [n for n in names if callable(getattr(module, n, None)) and not isinstance(getattr(module, n), type)]


def _nvtx_markers(put) -> None:
    """torch.cuda.nvtx: markers for a profiler's timeline, no-ops on the sim (its `range` context uses them)."""
    nvtx = torch.cuda.nvtx
    put(nvtx, "range_push", lambda msg: 0)
    put(nvtx, "range_pop", lambda: 0)
    put(nvtx, "range_start", lambda msg: 0)
    put(nvtx, "range_end", lambda range_id: None)
    put(nvtx, "mark", lambda msg: None)


class CupyUnderSim(EmulationError, ImportError):
    """`import cupy` under the sim. An ImportError too, so a program that uses CuPy only when it
    is installed (`try: import cupy / except ImportError`) takes its other path."""


class _RefuseCupy:
    """CuPy cannot run on the sim: its kernels need a GPU. One line at the import."""

    def find_spec(self, name, path=None, target=None):
        if name == "cupy" or name.startswith("cupy.") or name == "cupyx" or name.startswith("cupyx."):
            raise CupyUnderSim(f"import {name} at {caller_site()} under the sim: CuPy's kernels need a GPU and are not emulated; "
                                 "check this program on a GPU (streamcheck run --backend gpu), or keep its torch "
                                 "part apart")
        return None


refuse_cupy = _RefuseCupy()


