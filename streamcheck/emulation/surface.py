"""The torch.cuda names the emulation stands in for while it runs, and the refusals (CuPy, Triton,
`ExternalStream`, `make_graphed_callables`, autograd): each one line that names it and the user's line.
"""
from __future__ import annotations

import contextlib
import sys

import torch

from ..device.objects import caller_site
from .device_properties import TOTAL_MEMORY, DeviceProperties
from .generators import Generator
from .graphs import EmulatedGraph, graph
from .running import EmulationError
from .streams import EmulatedEvent, device, stream
from .tensors import is_emulated


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

    def stream_factory(device=None, priority=0, **kwargs):
        if kwargs.get("stream_ptr") is not None or kwargs.get("stream_id") is not None:
            raise EmulationError(f"torch.cuda.Stream(stream_id=...) at {caller_site()}: the sim makes its own "
                                 "streams; create one with torch.cuda.Stream()")
        return emu.new_stream(device, priority)

    def external_stream(stream_ptr, device=None):
        raise EmulationError(f"torch.cuda.ExternalStream at {caller_site()}: a stream another library made "
                             "(CuPy, a CUDA extension) does not exist on the sim; check this program on a GPU "
                             "(streamcheck run --backend gpu)")

    def make_graphed_callables(*args, **kwargs):
        raise EmulationError(f"torch.cuda.make_graphed_callables at {caller_site()} is not emulated; use "
                             "torch.cuda.graph / CUDAGraph (emulated), or check this program on a GPU "
                             "(streamcheck run --backend gpu)")

    # The allocator is looked up at each call: reset() gives the emulation a new one for each test.
    def memory_stat(table: str):
        def read(device=None):
            emu.enter()
            return getattr(emu.allocator, table).get(0 if device is None else emu.device_index(device), 0)
        return read

    def memory_stats(device=None):
        index = 0 if device is None else emu.device_index(device)
        emu.enter()
        alloc = emu.allocator
        return {"allocated_bytes.all.current": alloc.allocated.get(index, 0),
                "allocated_bytes.all.peak": alloc.peak_allocated.get(index, 0),
                "reserved_bytes.all.current": alloc.reserved.get(index, 0),
                "reserved_bytes.all.peak": alloc.peak_reserved.get(index, 0)}

    def reset_peaks(device=None):
        index = 0 if device is None else emu.device_index(device)
        alloc = emu.allocator
        alloc.peak_allocated[index] = alloc.allocated.get(index, 0)
        alloc.peak_reserved[index] = alloc.reserved.get(index, 0)

    def mem_get_info(device=None):
        index = 0 if device is None else emu.device_index(device)
        return TOTAL_MEMORY - emu.allocator.reserved.get(index, 0), TOTAL_MEMORY

    def manual_seed(seed, device=None):
        emu.generators[emu.current_device() if device is None else emu.device_index(device)].manual_seed(int(seed))

    def manual_seed_all(seed):
        for g in emu.generators:
            g.manual_seed(int(seed))

    def get_rng_state(device="cuda"):
        return emu.generators[emu.device_index(device)].get_state()

    def set_rng_state(state, device="cuda"):
        emu.generators[emu.device_index(device)].set_state(state)

    def is_current_stream_capturing():
        tracker = emu.device.capture_tracker
        return bool(tracker.active and tracker.capturing(emu.current_stream().device_stream.id) is not None)

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

    def refuse_backward(what: str = "backward()"):
        raise EmulationError(f"{what} at {caller_site()}: autograd is not emulated on the sim (torch's "
                             "engine asks a CPU-only build for a CUDA device guard and would abort the process); "
                             "check the forward pass here, or the backward pass on a GPU "
                             "(streamcheck run --backend gpu)")

    surface = {
        "is_available": lambda: True, "is_initialized": lambda: True, "init": lambda: None,
        "_lazy_init": lambda: None, "device_count": lambda: emu.device.devices,
        "current_device": emu.current_device, "set_device": emu.set_current_device, "device": device,
        "get_device_name": lambda device=None: DeviceProperties(0).name,
        "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": lambda device=None: DeviceProperties(
            emu.current_device() if device is None else emu.device_index(device)),
        "get_arch_list": lambda: ["sm_90"], "is_bf16_supported": lambda including_emulation=True: True,
        "Stream": stream_factory, "ExternalStream": external_stream, "Event": EmulatedEvent,
        "current_stream": lambda device=None: emu.current_stream(device),
        "default_stream": lambda device=None: emu.default_stream(device),
        "set_stream": emu.set_current_stream, "stream": stream, "StreamContext": stream,
        "synchronize": emu.synchronize, "_sleep": emu.sleep,
        "CUDAGraph": EmulatedGraph, "graph": graph, "graph_pool_handle": emu.new_pool,
        "make_graphed_callables": make_graphed_callables,
        "is_current_stream_capturing": is_current_stream_capturing,
        "memory_allocated": memory_stat("allocated"), "max_memory_allocated": memory_stat("peak_allocated"),
        "memory_reserved": memory_stat("reserved"), "max_memory_reserved": memory_stat("peak_reserved"),
        "memory_stats": memory_stats, "reset_peak_memory_stats": reset_peaks,
        "reset_max_memory_allocated": reset_peaks, "mem_get_info": mem_get_info,
        "empty_cache": lambda: emu.allocator.empty_cache(), "ipc_collect": lambda: None,
        "manual_seed": manual_seed, "manual_seed_all": manual_seed_all,
        "seed": lambda: emu.generators[emu.current_device()].seed(),
        "seed_all": lambda: [g.seed() for g in emu.generators] and None,
        "initial_seed": lambda: emu.generators[emu.current_device()].initial_seed(),
        "get_rng_state": get_rng_state, "set_rng_state": set_rng_state,
    }
    for name, value in surface.items():
        put(cuda, name, value)
    put(cuda.graphs, "graph", graph)
    put(cuda.graphs, "CUDAGraph", EmulatedGraph)
    def record_stream(tensor, s):
        emu.enter()
        emu.record_stream(tensor, s)

    # torch's binding parses its argument as a C++ stream before any mode sees it.
    put(torch.Tensor, "record_stream", record_stream)
    put(torch, "Generator", Generator)
    put(torch, "compile", compile_)
    # One function object per name: Dynamo's trace rules refuse one object under two names.
    put(torch.Tensor, "backward", lambda *a, **k: refuse_backward("backward()"))
    put(torch.autograd, "backward", lambda *a, **k: refuse_backward("torch.autograd.backward"))
    put(torch.autograd, "grad", lambda *a, **k: refuse_backward("torch.autograd.grad"))
    # Module.cuda()/.to("cuda") must make new Parameters around emulated tensors: `param.data =` an
    # emulated tensor would leave a plain Parameter that says cuda with no data behind it.
    shallow = torch._has_compatible_shallow_copy_type
    put(torch, "_has_compatible_shallow_copy_type",
        lambda a, b: False if is_emulated(a) or is_emulated(b) else shallow(a, b))
    put(cuda, "nvtx", _Nvtx())
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



class _Nvtx:
    """torch.cuda.nvtx: markers are no-ops on the sim."""

    def range_push(self, msg):
        return 0

    def range_pop(self):
        return 0

    def mark(self, msg):
        return None

    @contextlib.contextmanager
    def range(self, msg, *args, **kwargs):
        yield


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


