"""torch's device-generic surfaces on the sim: `torch.accelerator` (the current accelerator is the emulated
CUDA device), `torch.Stream(device="cuda")` / `torch.Event(device="cuda")`, and `torch.backends.cuda`'s cuFFT
plan cache (a CPU-only build refuses to read it).
"""
from __future__ import annotations

import torch

from .graphs import EmulatedGraph
from .running import active
from .streams import EmulatedEvent, EmulatedStream

_REAL_STREAM = torch.Stream
_REAL_EVENT = torch.Event

# The dtypes a CUDA device allocates and converts between (torch.accelerator.get_device_capability).
_CUDA_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
    torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})


def _is_cuda(device) -> bool:
    """Whether a torch.Stream / torch.Event for `device` is the emulation's: the current accelerator
    (None) is CUDA here."""
    if device is None:
        return True
    if isinstance(device, int):
        return True  # an index of the current accelerator
    return torch.device(device).type == "cuda"


class _GenericStreamType(type):
    def __call__(cls, device=None, *, priority: int = 0, **kwargs):
        if not kwargs and _is_cuda(device):
            return active().new_stream(device, priority)
        return _REAL_STREAM(device, priority=priority, **kwargs)

    def __instancecheck__(cls, obj):
        return isinstance(obj, (_REAL_STREAM, EmulatedStream))

    def __subclasscheck__(cls, sub):
        return issubclass(sub, (_REAL_STREAM, EmulatedStream))


class Stream(metaclass=_GenericStreamType):
    """torch.Stream while emulating: on "cuda" (or the current accelerator) an emulated stream."""


class _GenericEventType(type):
    def __call__(cls, device=None, *, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        if _is_cuda(device):
            event = EmulatedEvent(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
            if device is not None:
                event._device_index = active().device_index(device)
            return event
        return _REAL_EVENT(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    def __instancecheck__(cls, obj):
        return isinstance(obj, (_REAL_EVENT, EmulatedEvent))

    def __subclasscheck__(cls, sub):
        return issubclass(sub, (_REAL_EVENT, EmulatedEvent))


class Event(metaclass=_GenericEventType):
    """torch.Event while emulating: on "cuda" (or the current accelerator) an emulated event."""


class device_index:
    """torch.accelerator.device_index(i): cuda:i is the current device inside (None: no change)."""

    def __init__(self, device, /):
        self.index = device

    def __enter__(self):
        emulation = active()
        self._previous = emulation.current_device()
        if self.index is not None:
            emulation.set_current_device(self.index)

    def __exit__(self, *exc):
        if self.index is not None:
            active().set_current_device(self._previous)


class Graph(EmulatedGraph):
    """torch.accelerator.Graph on the sim's capture: the pool and the capture error mode given at
    construction; as a context, a synchronize and a capture on the current stream."""

    def __init__(self, keep_graph: bool = False, *, pool=None, capture_error_mode: str = "default"):
        super().__init__(keep_graph)
        self.graph_pool = pool
        # "default" is torch's word for CUDA's global mode.
        self.capture_error_mode = "global" if capture_error_mode == "default" else capture_error_mode

    def capture_begin(self, pool=None, capture_error_mode=None) -> None:
        super().capture_begin(self.graph_pool if pool is None else pool,
                              capture_error_mode=capture_error_mode or self.capture_error_mode)

    def __enter__(self):
        active().synchronize()  # torch synchronizes the device before a capture
        self.capture_begin()

    def __exit__(self, *exc):
        self.capture_end()


class _CufftPlanCache:
    """torch.backends.cuda.cufft_plan_cache (and `[device]`): the sim's FFTs are torch's CPU kernels,
    which plan nothing, so the cache stays empty; its limit is kept."""

    def __init__(self):
        self.max_size = 4096  # torch's default limit of a CUDA 10+ build
        self.size = 0

    def clear(self) -> None:
        self.size = 0

    def __getitem__(self, device):
        active().device_index(device)
        return self


def patch_accelerator(emu, put) -> None:
    """torch.accelerator, torch.Stream / torch.Event and torch.backends.cuda's build answers, through
    `put(owner, name, value)` (surface.patch_torch's, which keeps each undo)."""
    cuda = torch.cuda

    def set_stream(stream):
        emu.set_current_device(stream.device_index)  # torch: the stream's device becomes the current one
        emu.set_current_stream(stream)

    def set_device_index(device, /):
        if not (isinstance(device, int) and device < 0):  # torch's: a negative index is a no-op (DataLoader's pin thread)
            emu.set_current_device(device)

    def current_device_index():
        return emu.current_device()

    def index_or_current(device):
        return emu.current_device() if device is None else emu.device_index(device)

    accelerator = torch.accelerator
    functions = {
        "is_available": lambda: True,
        "device_count": lambda: emu.device.devices,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": current_device_index,
        "current_device_idx": lambda: emu.current_device(),  # the deprecated name
        "set_device_index": set_device_index,
        "set_device_idx": lambda device, /: emu.set_current_device(device),  # the deprecated name
        "get_device_capability": lambda device=None, /: {"supported_dtypes": set(_CUDA_DTYPES)},
        "current_stream": lambda device=None, /: emu.current_stream(index_or_current(device)),
        "set_stream": set_stream,
        "synchronize": lambda device=None, /: emu.synchronize(device),
        "device_index": device_index,
        "Graph": Graph,
        # Memory: torch.cuda's (emulated) functions, looked up at each call.
        "empty_cache": lambda: cuda.empty_cache(),
        "empty_host_cache": lambda: None,  # the sim caches no pinned blocks: nothing to give back
        "memory_stats": lambda device_index=None, /: cuda.memory_stats(index_or_current(device_index)),
        "memory_allocated": lambda device_index=None, /: cuda.memory_allocated(index_or_current(device_index)),
        "max_memory_allocated": lambda device_index=None, /: cuda.max_memory_allocated(
            index_or_current(device_index)),
        "memory_reserved": lambda device_index=None, /: cuda.memory_reserved(index_or_current(device_index)),
        "max_memory_reserved": lambda device_index=None, /: cuda.max_memory_reserved(
            index_or_current(device_index)),
        "reset_accumulated_memory_stats": lambda device_index=None, /: cuda.reset_accumulated_memory_stats(
            index_or_current(device_index)),
        "reset_peak_memory_stats": lambda device_index=None, /: cuda.reset_peak_memory_stats(
            index_or_current(device_index)),
        "get_memory_info": lambda device_index=None, /: cuda.mem_get_info(index_or_current(device_index)),
    }
    # The submodules that re-export them, those this torch has (torch 2.11 has no accelerator.graphs).
    homes = [module for module in (accelerator, getattr(accelerator, "memory", None),
                                   getattr(accelerator, "graphs", None)) if module is not None]
    for name, value in functions.items():
        original = accelerator.__dict__.get(name)
        for module in homes:
            if module is accelerator or (original is not None and module.__dict__.get(name) is original):
                put(module, name, value)
    put(torch, "Stream", Stream)
    put(torch, "Event", Event)
    # torch.backends.cuda.is_built() stays False: torch's own code reads it as "this library has CUDA's C
    # symbols" (torch._inductor's cudagraph_trees imports CUDA-only names when it is True).
    put(torch.backends.cuda, "cufft_plan_cache", _CufftPlanCache())
