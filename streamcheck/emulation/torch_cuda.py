"""CUDA for torch programs, emulated on the sim: a CPU-only torch runs `device="cuda"` code
unmodified, every kernel executing on CPU tensors in an order the sim's scheduler picks within
CUDA's rules. It lies about the device and nothing else.

What it stands in for (each row is one place below):
- tensors: `CudaTensor` reports `cuda:N` and `is_cuda`; its data is a CPU view of a caching-
  allocator block's bytes (a sim buffer). `PinnedTensor` is pinned host memory: a CPU tensor
  whose bytes the streams read and write too.
- operators: every ATen operator on emulated tensors is one sim launch on torch's current
  stream, reading and writing the byte ranges the torch adapter derives from the schema
  (`record.adapters.torch_ops.operator_accesses`: the same rules as on a GPU). It executes
  when the scheduler runs it, so a consumer nothing orders after its producer reads stale
  bytes. A view is metadata: it shares its base's block.
- factories (`torch.zeros(..., device="cuda")`, `.cuda()`, `.to("cuda")`, `pin_memory=True`):
  a torch function mode, since a CPU-only torch refuses them before any dispatch.
- host reads (`.item()`, `.tolist()`, `.cpu()`, `float()`, printing, `bool()`, `nonzero`): a copy
  into staging host memory on the current stream, then the host's wait for that stream, then its
  read, as CUDA does. Copies from or to pinned memory with `non_blocking=True` stay pending; any
  other copy between host and device waits.
- composite functions whose C++ makes a tensor like a CUDA input (SDPA's causal mask): one kernel.
- `torch.cuda`: streams (a pool of non-blocking streams named s1, s2, ... in creation order; the
  default stream is the legacy stream), events, synchronizes, queries, `_sleep` (a hold on its
  stream), graphs (the sim's capture), generators (a CUDA generator is a CPU one forked when a
  random operator is issued, so values do not depend on the schedule), memory statistics and
  device properties of an emulated device; several devices with peer copies between them.

What it refuses, with one line that names it and the user's line (EmulationError): CuPy,
operators with no CPU implementation (custom CUDA extensions), Triton kernels, `ExternalStream`,
`make_graphed_callables`, `backward()` and `torch.autograd.backward/grad` (torch's autograd engine
asks for a real CUDA device guard and would abort the process; forward operators on tensors that
require grad run as under no_grad, with a notice). `torch.compile` runs its function as eager
operators, with a notice (and one more for CUDA graph trees, which are not emulated).
docs/emulation.md has the table.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import sys
import threading
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

from ..core.capture import CaptureError
from ..core.trace import skip_wrapper_frames
from ..device.objects import Region, caller_site
from ..record.adapters.torch_ops import operator_accesses, operator_schema
from .allocator import CachingAllocator, rounded

CUDA_DEFAULT_SEED = 67280421310721  # torch's default seed of a CUDA generator
SLEEP_CYCLES_PER_STEP = 1_000_000  # torch.cuda._sleep: cycles per host step its stream is held
TOTAL_MEMORY = 80 * (1 << 30)  # the emulated device's memory (reported; never enforced)


# torch.ops.aten.X(...) calls go through OpOverload.__call__: a forwarding frame, not the user's library call.
skip_wrapper_frames(torch._ops.__file__, "__call__")


class EmulationError(RuntimeError):
    """A torch surface the emulation does not model: names it, the user's line, what to do."""


_active: Optional["Emulation"] = None


def active() -> "Emulation":
    if _active is None:
        raise EmulationError("an emulated CUDA tensor was used after its `streamcheck run --backend sim` run ended; "
                             "keep emulated tensors inside the run")
    return _active


# --- tensors -----------------------------------------------------------------------------

class _EmulatedTensor(torch.Tensor):
    """A wrapper tensor whose data is `_inner`, a CPU view of its block's bytes; every operator on it
    goes to the running emulation."""

    __slots__ = ()
    DEVICE = None  # the device a kind reports when none is given

    @staticmethod
    def __new__(cls, inner, block, device=None, requires_grad=False):
        t = torch.Tensor._make_wrapper_subclass(cls, inner.size(), strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=device or cls.DEVICE, requires_grad=requires_grad)
        t._inner = inner
        t._block = block
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return active().dispatch(func, args, kwargs or {})


class CudaTensor(_EmulatedTensor):
    """A tensor on an emulated CUDA device."""

    __slots__ = ()

    def __format__(self, spec):
        if self.dim() == 0 and not self.is_meta:
            return self.item().__format__(spec)  # a host read, as torch formats a CUDA scalar
        return object.__format__(self, spec)

    def __repr__(self, *, tensor_contents=None):
        with torch.no_grad():
            text = repr(self.detach().cpu())  # a host read: copy, then wait, as printing a CUDA tensor does
        device = f"device='{self.device}'"
        return _with_suffix(text, device)


class PinnedTensor(_EmulatedTensor):
    """Pinned host memory: the host reads and writes it now, the streams when they get there."""

    __slots__ = ()
    DEVICE = torch.device("cpu")

    def __repr__(self, *, tensor_contents=None):
        return repr(torch.Tensor.clone(self).detach())  # a host read, now


def _with_suffix(text: str, device: str) -> str:
    """torch's repr of a CPU tensor with `device=...` where torch puts it (before dtype)."""
    for marker in (", size=", ", dtype=", ", grad_fn=", ", requires_grad="):
        cut = text.find(marker)
        if cut >= 0:
            return f"{text[:cut]}, {device}{text[cut:]}"
    return f"{text[:-1]}, {device})"


def _flatten(args, kwargs) -> tuple:
    """The leaves of an operator call (tensors, scalars, None, ...; one level into the lists of
    `Tensor[]` and `int[]` arguments, the only nesting ATen schemas have), and how to rebuild it.
    A plain function rather than torch's pytree: it runs for every operator."""
    flat, shape = [], []
    keys = tuple(kwargs)
    for v in (*args, *kwargs.values()):
        if type(v) is list or type(v) is tuple:
            flat.extend(v)
            shape.append((type(v), len(v)))
        else:
            flat.append(v)
            shape.append(None)
    return flat, (tuple(shape), keys)


def _unflatten(flat, spec) -> tuple:
    """(args, kwargs) from _flatten's leaves (or leaves in their place) and its spec."""
    shape, keys = spec
    values, i = [], 0
    for item in shape:
        if item is None:
            values.append(flat[i])
            i += 1
        else:
            kind, n = item
            values.append(kind(flat[i:i + n]))
            i += n
    cut = len(shape) - len(keys)
    return tuple(values[:cut]), dict(zip(keys, values[cut:]))


def _leaves(out) -> tuple:
    """An operator's result as (leaves, rebuild kind): a tensor or value alone, or a tuple/list."""
    if type(out) is tuple or type(out) is list:
        return list(out), type(out)
    return [out], None


def _rebuilt(leaves, kind):
    return leaves[0] if kind is None else kind(leaves)


def _emulated(value) -> bool:
    return type(value) is CudaTensor or type(value) is PinnedTensor


def _inner(value):
    return value._inner if type(value) is CudaTensor or type(value) is PinnedTensor else value


def _span(t) -> Optional[tuple]:
    """(start, stop) bytes of `t` within its block; None if it is empty."""
    if t.numel() == 0:
        return None
    item = t.element_size()
    lo = hi = t.storage_offset()
    for n, st in zip(t.shape, t.stride()):
        if n > 1:
            if st >= 0:
                hi += (n - 1) * st
            else:
                lo += (n - 1) * st
    return lo * item, (hi + 1) * item


def _region(t) -> Optional[Region]:
    span = _span(t)
    return None if span is None else Region(t._block.buffer, span[0], span[1])


def _elements(shape, stride) -> int:
    """How many elements a strided tensor's storage must hold from its offset."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride) if n > 1)


def _typed(block, dtype, shape, stride, offset: int = 0):
    """A CPU tensor over the block's bytes."""
    base = block.views.get(dtype)
    if base is None:
        base = block.views[dtype] = torch.from_numpy(block.bytes).view(dtype)
    return base.as_strided(shape, stride, offset)


# --- the torch.cuda objects ---------------------------------------------------------------

class EmulatedStream:
    """torch.cuda.Stream on the sim: one device stream."""

    def __init__(self, emulation, device_stream, priority: int = 0):
        self._emulation = emulation
        self.device_stream = device_stream
        self.device_index = device_stream.device_index
        self.device = torch.device("cuda", self.device_index)
        self.priority = priority
        self.stream_id = device_stream.id
        self.device_type = 1  # CUDA's DeviceType
        self.cuda_stream = 0 if device_stream.id == 0 else 0x5C0000 + device_stream.id

    def wait_event(self, event) -> None:
        self._emulation.enter()
        event._wait(self)

    def wait_stream(self, stream) -> None:
        # torch: record an event on `stream` now, then wait for it (covers work issued so far).
        self._emulation.enter()
        with caller_site.held(caller_site()):  # one user call, three device calls: one site
            marker = self._emulation.device.event(name="wait_stream")
            marker.record(stream.device_stream)
            self.device_stream.wait_event(marker)

    def record_event(self, event=None):
        event = event if event is not None else EmulatedEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        self._emulation.enter()
        return self.device_stream.query()

    def synchronize(self) -> None:
        self._emulation.enter()
        self.device_stream.synchronize()

    def __enter__(self):
        self._context = stream(self)
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def __eq__(self, other) -> bool:
        return isinstance(other, EmulatedStream) and other.device_stream is self.device_stream

    def __hash__(self) -> int:
        return hash(self.device_stream.id)

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x} (sim: " \
               f"{self.device_stream.name})>"


class EmulatedEvent:
    """torch.cuda.Event on the sim."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self._emulation = active()
        self._event = None  # created at the first record, as torch creates cudaEvent_t lazily
        self._record_index = None  # the trace index of its last record
        self.enable_timing = enable_timing

    def _device_event(self):
        if self._event is None:
            self._event = self._emulation.device.event()
        return self._event

    def record(self, stream=None) -> None:
        emulation = self._emulation
        emulation.enter()
        stream = stream if stream is not None else emulation.current_stream()
        self._device_event().record(stream.device_stream)
        self._record_index = len(emulation.device.trace) - 1  # its EventRecord: the sim times it by index

    def _wait(self, stream) -> None:
        if self._event is not None:  # waiting on a never-recorded event is a no-op (CUDA)
            stream.device_stream.wait_event(self._event)

    def wait(self, stream=None) -> None:
        self._emulation.enter()
        self._wait(stream if stream is not None else self._emulation.current_stream())

    def query(self) -> bool:
        self._emulation.enter()
        return True if self._event is None else self._event.query()

    def synchronize(self) -> None:
        self._emulation.enter()
        if self._event is not None:
            self._event.synchronize()

    def elapsed_time(self, end) -> float:
        """Sim time between the two records, in milliseconds of 1 µs per scheduler step."""
        emulation = self._emulation
        emulation.enter()
        if not self.enable_timing or not end.enable_timing:
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._event is None or end._event is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        start, stop = emulation.record_time(self._record_index), emulation.record_time(end._record_index)
        if start is None or stop is None:
            raise RuntimeError("CUDA error: device not ready (an event has not completed; synchronize it first)")
        return (stop - start) / 1000.0

    def __repr__(self) -> str:
        return "<torch.cuda.Event (sim)>" if self._event is None else f"<torch.cuda.Event (sim: {self._event.name})>"


_REAL_GENERATOR = torch.Generator


class EmulatedGenerator(_REAL_GENERATOR):
    """torch.Generator(device="cuda") on the sim: a CPU generator (so torch's argument parser takes
    it) that says it is on cuda:N. Each random operator issued with it gets a generator forked
    from its state when the operator is *issued*, and the state moves on one draw: values depend
    on issue order only, never on the schedule, as CUDA's Philox offsets are taken at launch."""

    def __new__(cls, device_index: int = 0, seed: int = CUDA_DEFAULT_SEED):
        return super().__new__(cls)  # a CPU generator underneath

    def __init__(self, device_index: int = 0, seed: int = CUDA_DEFAULT_SEED):
        super().__init__()
        self._index = device_index
        self.manual_seed(seed)

    @property
    def device(self):
        return torch.device("cuda", self._index)

    def graphsafe_get_state(self):
        return self.get_state()

    def next_cpu_generator(self):
        """The generator one random operator runs with, taken now."""
        child = _REAL_GENERATOR()
        child.set_state(self.get_state())
        torch.randint(1 << 62, (1,), generator=self)  # the next operator gets the next state
        return child


class _GeneratorType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL_GENERATOR)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _REAL_GENERATOR)


class Generator(metaclass=_GeneratorType):
    """torch.Generator while emulating: `device="cuda"` makes an EmulatedGenerator."""

    def __new__(cls, device="cpu"):
        device = torch.device(device)
        if device.type == "cuda":
            emulation = active()
            return EmulatedGenerator(emulation.device_index(device))
        return _REAL_GENERATOR(device)


class DeviceProperties:
    """torch.cuda.get_device_properties on the sim: an H100-like device that says it is emulated."""

    def __init__(self, index: int):
        self.name = "streamcheck sim (emulated CUDA device)"
        self.major, self.minor = 9, 0
        self.total_memory = TOTAL_MEMORY
        self.multi_processor_count = 132
        self.is_integrated = 0
        self.is_multi_gpu_board = 0
        self.L2_cache_size = 50 * (1 << 20)
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.regs_per_multiprocessor = 65536
        self.uuid = f"sim-{index}"
        self.index = index

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count="
                f"{self.multi_processor_count})")


class EmulatedGraph:
    """torch.cuda.CUDAGraph on the sim's capture."""

    def __init__(self, keep_graph: bool = False):
        self._emulation = active()
        self._graph = None
        self._stream = None
        self._pool = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        emulation = self._emulation
        emulation.enter()
        self._stream = emulation.current_stream()
        self._pool = pool if pool is not None else emulation.new_pool()
        try:
            self._stream.device_stream.begin_capture(capture_error_mode)
        except CaptureError as exc:
            emulation.capture_errors.append(exc)
            raise
        emulation.capture_pools[self._stream.device_stream.id] = self._pool

    def capture_end(self) -> None:
        emulation = self._emulation
        emulation.enter()
        try:
            self._graph = self._stream.device_stream.end_capture()
        except CaptureError as exc:  # the program gets it, as torch raises CUDA's error; the run names it
            emulation.capture_errors.append(exc)
            raise
        finally:
            emulation.capture_pools.pop(self._stream.device_stream.id, None)

    def replay(self) -> None:
        emulation = self._emulation
        emulation.enter()
        if self._graph is None:
            raise RuntimeError("CUDAGraph::replay: called before a successful capture")
        self._graph.launch(emulation.current_stream().device_stream)

    def reset(self) -> None:
        self._graph = None

    def pool(self):
        return self._pool

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, path) -> None:
        raise EmulationError(f"CUDAGraph.debug_dump at {caller_site()}: the sim has no CUDA graph to dump")


class graph:
    """torch.cuda.graph on the sim: synchronize, capture on the capture stream, end the capture."""

    default_capture_stream = None

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode: str = "global"):
        emulation = active()
        if stream is None:
            if graph.default_capture_stream is None or graph.default_capture_stream._emulation is not emulation:
                graph.default_capture_stream = emulation.new_stream()
            stream = graph.default_capture_stream
        self.cuda_graph, self.pool, self.capture_stream, self.mode = cuda_graph, pool, stream, capture_error_mode

    def __enter__(self):
        emulation = active()
        emulation.synchronize()  # torch synchronizes the device before a capture
        self._context = stream(self.capture_stream)
        self._context.__enter__()
        self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.mode)

    def __exit__(self, *exc):
        try:
            self.cuda_graph.capture_end()
        finally:
            self._context.__exit__(*exc)


class stream:
    """torch.cuda.stream(s) on the sim: `s` is the current stream (of its device) inside."""

    def __init__(self, s):
        self.s = s

    def __enter__(self):
        if self.s is None:
            return None
        emulation = active()
        self._previous = emulation.current_stream(self.s.device_index)
        self._device = emulation.current_device()
        emulation.set_current_device(self.s.device_index)
        emulation.set_current_stream(self.s)
        return self.s

    def __exit__(self, *exc):
        if self.s is None:
            return
        emulation = active()
        emulation.set_current_stream(self._previous)
        emulation.set_current_device(self._device)


class device:
    """torch.cuda.device(i) on the sim."""

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        emulation = active()
        self._previous = emulation.current_device()
        if self.index is not None:
            emulation.set_current_device(emulation.device_index(self.index))

    def __exit__(self, *exc):
        active().set_current_device(self._previous)


# --- the emulation ------------------------------------------------------------------------

class Emulation:
    """One emulated run: the sim Device, torch's streams over its streams, the allocator, the
    generators, what was refused. Enter it with `with Emulation(device):`."""

    def __init__(self, device):
        self.device = device
        self.allocator = CachingAllocator(device)
        self.notices: list = []
        self.capture_errors: list = []  # core.capture.CaptureError the program got from a capture
        self.capture_pools: dict = {}  # capturing device stream id -> graph pool
        self._pools = 0
        self._streams = 0
        self._legacies = [EmulatedStream(self, legacy) for legacy in device.legacies]
        self._current: dict = {}  # (thread ident, device index) -> EmulatedStream
        self._current_device: dict = {}  # thread ident -> device index
        self.generators = [EmulatedGenerator(k) for k in range(device.devices)]
        self._meta: dict = {}  # operator signature -> output layout, or None if it has none
        self._undo: list = []
        self._mode = None
        self._froze = False

    # --- entering and leaving ------------------------------------------------------------
    def __enter__(self):
        global _active
        if _active is not None:
            raise EmulationError("an emulation is already running in this process")
        _active = self
        # torch._dynamo loaded before the patches: meta kernels import it, and its trace rules index
        # torch.cuda's functions by name.
        importlib.import_module("torch._dynamo")
        self._patch_torch()
        self._mode = _FactoryMode(self)
        self._mode.__enter__()
        # Python's full collections walk every object alive, some 300,000 after torch's import: a
        # fifth of an emulated operator's time. What exists now is frozen for the run (gc.freeze, where
        # nothing froze it already), so they walk what the run made; the program's garbage is
        # collected as before, and the frozen objects are ordinary again afterwards.
        self._froze = gc.get_freeze_count() == 0
        if self._froze:
            gc.freeze()
        return self

    def __exit__(self, *exc):
        global _active
        try:
            self._mode.__exit__(*exc)
        finally:
            for undo in reversed(self._undo):
                undo()
            self._undo.clear()
            _active = None
            graph.default_capture_stream = None
            if self._froze:
                gc.unfreeze()

    def enter(self) -> None:
        """Every entry point: record the frees of tensors that died since the last one."""
        self.allocator.collect()

    def notice(self, text: str) -> None:
        if text not in self.notices:
            self.notices.append(text)

    # --- devices and streams -------------------------------------------------------------
    def device_index(self, where) -> int:
        if isinstance(where, int):
            index = where
        else:
            where = torch.device(where) if not isinstance(where, torch.device) else where
            if where.type != "cuda":
                raise EmulationError(f"{where} is not a CUDA device")
            index = where.index if where.index is not None else self.current_device()
        if not 0 <= index < self.device.devices:
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{index}; the sim emulates "
                               f"{self.device.devices} device(s): streamcheck run --devices N for more)")
        return index

    def current_device(self) -> int:
        return self._current_device.get(threading.get_ident(), 0)

    def set_current_device(self, index) -> None:
        self._current_device[threading.get_ident()] = self.device_index(index)

    def current_stream(self, index=None) -> EmulatedStream:
        index = self.current_device() if index is None else self.device_index(index)
        found = self._current.get((threading.get_ident(), index))
        return found if found is not None else self._legacies[index]

    def default_stream(self, index=None) -> EmulatedStream:
        return self._legacies[self.current_device() if index is None else self.device_index(index)]

    def set_current_stream(self, s) -> None:
        if s is not None:
            self._current[(threading.get_ident(), s.device_index)] = s

    def new_stream(self, device=None, priority: int = 0) -> EmulatedStream:
        self.enter()
        index = self.current_device() if device is None else self.device_index(device)
        self._streams += 1
        # torch's pool streams are non-blocking (cudaStreamNonBlocking): no join with the legacy stream.
        return EmulatedStream(self, self.device.stream(name=f"s{self._streams}", kind="non_blocking",
                                                       priority=int(priority), device=index), priority)

    def new_pool(self) -> tuple:
        self._pools += 1
        return (0, self._pools)

    def synchronize(self, device=None) -> None:
        self.enter()
        self.device.synchronize(None if device is None else self.device_index(device))

    def record_time(self, index: int) -> Optional[int]:
        """The scheduler step at which the operation at trace `index` executed, or None."""
        span = self.device.backend.op_times.get(index)
        return None if span is None else span[1]

    def sleep(self, cycles: int) -> None:
        """torch.cuda._sleep: the current stream spins; on the sim, held for host steps."""
        self.enter()
        steps = max(1, min(64, int(cycles) // SLEEP_CYCLES_PER_STEP))
        self.device.sleep(steps, self.current_stream().device_stream, name="torch.cuda._sleep")

    # --- allocation ----------------------------------------------------------------------
    def empty(self, shape, stride, dtype, index: int, stream=None) -> CudaTensor:
        """A fresh tensor on cuda:index from the caching allocator, filed under `stream`."""
        s = stream if stream is not None else self.current_stream(index)
        nbytes = _elements(shape, stride) * dtype.itemsize
        pool = self.capture_pools.get(self._capturing_root(s.device_stream)) if self.capture_pools else None
        block = self.allocator.allocate(nbytes, s.device_stream, pool=pool)
        return CudaTensor(_typed(block, dtype, shape, stride), block, torch.device("cuda", index))

    def _capturing_root(self, device_stream):
        """The id of the stream whose capture `device_stream` takes part in (its graph's origin)."""
        tracker = self.device.capture_tracker
        if not tracker.active:
            return None
        graph_id = tracker.capturing(device_stream.id)
        if graph_id is None:
            return None
        for sid in self.capture_pools:
            if tracker.capturing(sid) == graph_id:
                return sid
        return None

    def pinned(self, shape, stride, dtype, device_index: Optional[int] = None) -> PinnedTensor:
        """Pinned host memory. The sim files it under a device (the current one unless given):
        the streams of another device reach it as peer memory (not emulated as host memory)."""
        self.enter()
        nbytes = _elements(shape, stride) * dtype.itemsize
        index = self.current_device() if device_index is None else device_index
        buffer = self.device.alloc((rounded(nbytes),), "uint8", name="pinned host tensor", fill=0, device=index)
        block = _HostBlock(buffer)
        return PinnedTensor(_typed(block, dtype, shape, stride), block)

    # --- operators -----------------------------------------------------------------------
    def dispatch(self, func, args, kwargs):
        with caller_site.held(caller_site()):  # one user call: its allocations, launch and frees share the site
            return self._dispatch(func, args, kwargs)

    def _dispatch(self, func, args, kwargs):
        self.enter()
        schema = operator_schema(func)
        if schema.view:
            return self._view(func, args, kwargs)
        name = schema.name
        if name == "aten.record_stream.default":
            return self.record_stream(args[0], args[1])
        flat, spec = _flatten(args, kwargs)
        cuda = next((v for v in flat if type(v) is CudaTensor), None)
        target = _target_device(kwargs)
        if cuda is None and (target is None or target.type != "cuda"):
            return self._host_op(func, name, args, kwargs, flat, spec)
        index = cuda.device.index if cuda is not None else self.device_index(target)
        return self._device_op(func, name, flat, spec, index, args, kwargs, target)

    def _view(self, func, args, kwargs):
        """A view shares its base's block: metadata only, no kernel."""
        base = args[0] if args else next(v for v in kwargs.values() if _emulated(v))
        flat, spec = _flatten(args, kwargs)
        inner_args, inner_kwargs = _unflatten([_inner(v) for v in flat], spec)
        out = func(*inner_args, **inner_kwargs)
        cls, block, dev = type(base), base._block, base.device
        leaves, kind = _leaves(out)
        return _rebuilt([cls(v, block, dev) if isinstance(v, torch.Tensor) else v for v in leaves], kind)

    def record_stream(self, tensor, s) -> None:
        """`tensor.record_stream(s)`: the block's free waits for `s` (torch's allocator rule)."""
        if type(tensor) is not CudaTensor:
            return
        used_on = tensor._block.used_on
        if all(existing is not s.device_stream for existing in used_on):
            used_on.append(s.device_stream)

    def _host_op(self, func, name, args, kwargs, flat, spec):
        """Only host tensors (pinned ones among them): the host does it now."""
        reads, writes = [], []
        accesses = list(operator_accesses(func, args, kwargs))
        for t, written in accesses:
            if type(t) is PinnedTensor:
                region = _region(t)
                if region is not None:
                    (writes if written else reads).append(region)
        if reads or writes:
            self.device.host_access(reads=reads, writes=writes, name=name)
        inner_args, inner_kwargs = _unflatten([_inner(v) for v in flat], spec)
        out = func(*inner_args, **inner_kwargs)
        return self._returned(out, accesses)

    def _returned(self, out, accesses):
        """The inner result of an in-place/out= operator as the emulated argument it wrote."""
        written = [t for t, w in accesses if w and _emulated(t)]
        if not written:
            return out
        leaves, kind = _leaves(out)
        mapped = []
        for v in leaves:
            if isinstance(v, torch.Tensor):
                same = next((w for w in written if w._inner is v or _same_view(w._inner, v)), None)
                mapped.append(same if same is not None else v)
            else:
                mapped.append(v)
        return _rebuilt(mapped, kind)

    def _device_op(self, func, name, flat, spec, index, args, kwargs, target):
        if name == "aten._to_copy.default" and target is not None and target.type == "cuda":
            there = self.device_index(target)
            if there != index:  # to another GPU: a peer copy, ordered on both devices' current streams
                return self._to_other_device(args[0], there, kwargs.get("dtype"))
        if name == "aten.copy_.default" and type(args[0]) is CudaTensor and type(args[1]) is CudaTensor and \
                args[0].device != args[1].device:
            return self._copy_between_devices(args[0], args[1])
        s = self.current_stream(index)
        non_blocking = bool(kwargs.get("non_blocking", False)) or (
            name == "aten.copy_.default" and len(args) > 2 and bool(args[2]))
        reads, writes, host_sides, written_host = [], [], [], set()
        accesses = list(operator_accesses(func, args, kwargs))
        for t, written in accesses:
            kind = type(t)
            if kind is CudaTensor or kind is PinnedTensor:
                region = _region(t)
                if region is not None:
                    (writes if written else reads).append(region)
                if kind is PinnedTensor:
                    host_sides.append("pinned")
            elif t.device.type == "cpu" and t.dim() > 0:
                if name not in _HOST_TENSORS_ALLOWED:
                    _check_same_device(name, flat)  # raises, as torch does
                host_sides.append("pageable")
                if written:
                    written_host.add(id(t))
        to_host = name == "aten._to_copy.default" and target is not None and target.type == "cpu"
        if to_host:
            host_sides.append("pinned" if non_blocking else "pageable")
        layout = self._layout(func, flat, spec)
        # What the kernel gets: the CPU views; a pageable source staged now, a pageable destination itself.
        inner_flat = [v if written_host and id(v) in written_host else self._staged(v) for v in flat]
        inner_args, inner_kwargs = _unflatten(inner_flat, spec)
        if target is not None:
            inner_kwargs = dict(inner_kwargs, device=torch.device("cpu"))
            inner_kwargs.pop("pin_memory", None)
        pageable_destination = (to_host and not non_blocking) or (name == "aten.copy_.default" and written_host)
        if layout is None or pageable_destination:
            if target is not None:
                inner_flat = [torch.device("cpu") if isinstance(v, torch.device) else v for v in inner_flat]
            result = self._host_result(func, name, s, flat, inner_flat, spec)
            return args[0] if name == "aten.copy_.default" else result
        fresh, out_leaves = [], []
        for item in layout.leaves:
            if item is None or not isinstance(item, tuple):
                out_leaves.append(item)
                continue
            shape, stride, dtype = item
            if to_host:
                t = self.pinned(shape, stride, dtype, index) if non_blocking else torch.empty_strided(
                    shape, stride, dtype=dtype)
            else:
                t = self.empty(shape, stride, dtype, index, s)
            fresh.append(t)
            out_leaves.append(t)
            region = _region(t) if type(t) is not torch.Tensor else None
            if region is not None:
                writes.append(region)
        if reads and len(writes) > len(fresh):  # an argument both read and written (in place) counts as written
            written = {(r.buffer.id, r.start, r.stop) for r in writes}
            reads = [r for r in reads if (r.buffer.id, r.start, r.stop) not in written]
        generator = self._generator_for(func, inner_kwargs, index)
        targets = [_inner(t) for t in fresh]
        self.device.launch(_Kernel(func, inner_args, inner_kwargs, targets, generator), stream=s.device_stream,
                           reads=reads, writes=writes, name=name)
        if host_sides and not (non_blocking and all(side == "pinned" for side in host_sides)):
            self.device.host_access(name=name, sync=s.device_stream)  # pageable memory, or a blocking copy: the host waits
        if layout.in_place:
            return self._written_result(accesses, layout, out_leaves)
        return _rebuilt(out_leaves, layout.spec)

    def _to_other_device(self, source, index: int, dtype):
        if dtype is not None and dtype != source.dtype:
            source = torch.Tensor.to(source, dtype=dtype)  # converted on its own device first
        out = self.empty(tuple(source.shape), _contiguous_strides(source.shape), source.dtype, index)
        return self._copy_between_devices(out, source)

    def _copy_between_devices(self, dst, src):
        """torch's copy between two GPUs: on the destination's current stream, after the source's
        current stream reached the call, and the source's stream waits for the copy (both
        devices' streams stay in order)."""
        if not src.is_contiguous() or not dst.is_contiguous() or src.dtype != dst.dtype or src.shape != dst.shape:
            src = torch.Tensor.to(torch.Tensor.contiguous(src), dtype=dst.dtype).expand(dst.shape).contiguous()
        dst_stream, src_stream = self.current_stream(dst.device.index), self.current_stream(src.device.index)
        before = self.device.event(name="copy_peer")
        before.record(src_stream.device_stream)
        dst_stream.device_stream.wait_event(before)
        read, write = _region(src), _region(dst)
        if read is not None and write is not None:
            self.device.copy_peer(write, read, stream=dst_stream.device_stream)
        after = self.device.event(name="copy_peer")
        after.record(dst_stream.device_stream)
        src_stream.device_stream.wait_event(after)
        return dst

    def _written_result(self, accesses, layout, out_leaves):
        written = iter([t for t, w in accesses if w])
        leaves = [next(written) if item == "written" else leaf for item, leaf in zip(layout.leaves, out_leaves)]
        return _rebuilt(leaves, layout.spec)

    def _staged(self, value):
        """What a kernel gets for an argument: emulated tensors' CPU views; a pageable host
        tensor copied now (cudaMemcpyAsync stages pageable memory before it returns)."""
        if type(value) is CudaTensor or type(value) is PinnedTensor:
            return value._inner
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() > 0:
            return value.clone()
        return value

    def _generator_for(self, func, inner_kwargs, index):
        """The CPU generator a random operator runs with, taken now (issue order)."""
        given = inner_kwargs.get("generator")
        if isinstance(given, EmulatedGenerator):
            return given.next_cpu_generator()
        if given is not None:  # a CUDA generator's fork, taken when the call was made (_FactoryMode)
            return given
        if _seeded(func):
            return self.generators[index].next_cpu_generator()
        return None

    def _host_result(self, func, name, s, flat, inner_flat, spec):
        """An operator whose result the host needs now (`.item()`, `nonzero`, `equal`, a blocking
        copy into pageable memory), as CUDA does it: a copy of its device inputs to host staging
        memory on the current stream (in stream order), the host waiting for that stream, then the
        host reading the staging bytes and computing the result itself."""
        staged = list(inner_flat)
        positions = [i for i, v in enumerate(flat) if type(v) is CudaTensor]
        for i, host in zip(positions, self.stage_for_host(s, [flat[i] for i in positions], name)):
            staged[i] = host
        args, kwargs = _unflatten(staged, spec)
        result = func(*args, **kwargs)
        leaves, kind = _leaves(result)
        if not any(type(v) is torch.Tensor for v in leaves) or name in ("aten._to_copy.default", "aten.copy_.default"):
            return result
        # A data-dependent shape (nonzero, masked_select): the result lands in device memory.
        out = []
        for v in leaves:
            if isinstance(v, torch.Tensor):
                t = self.empty(tuple(v.shape), tuple(v.stride()), v.dtype, s.device_index, s)
                self.device.launch(_Kernel(torch.Tensor.copy_, (t._inner, v), {}, (), None), stream=s.device_stream,
                                   writes=[r for r in [_region(t)] if r is not None], name=name)
                out.append(t)
            else:
                out.append(v)
        return _rebuilt(out, kind)

    def stage_for_host(self, s, tensors, name: str) -> list:
        """CPU tensors holding what `tensors` hold once stream `s` reached this call: copies into
        staging host memory on `s`, then the host's wait for `s` and its read of the staging bytes."""
        staging = [self.pinned(tuple(t.shape), _contiguous_strides(t.shape), t.dtype, s.device_index) for t in tensors]
        reads = [r for r in (_region(t) for t in tensors) if r is not None]
        writes = [r for r in (_region(t) for t in staging) if r is not None]
        if reads:
            self.device.launch(_Copies([(h._inner, t._inner) for h, t in zip(staging, tensors)]),
                               stream=s.device_stream, reads=reads, writes=writes, name=name)
        self.device.host_access(reads=writes, name=name, sync=s.device_stream)
        return [h._inner for h in staging]

    def _layout(self, func, flat, spec):
        """What the operator returns, from its meta kernel: (shape, stride, dtype) per fresh tensor,
        "written" for an argument it returns, a plain value otherwise. None: the host needs the
        result (a scalar, a data-dependent shape). Cached per signature (meta is slow)."""
        key = _signature(func, flat, spec)
        found = self._meta.get(key, _MISSING) if key is not None else _MISSING
        if found is not _MISSING:
            return found
        layout = self._meta_layout(func, flat, spec)
        if key is not None:
            self._meta[key] = layout
        return layout

    def _meta_layout(self, func, flat, spec):
        meta_flat = []
        for v in flat:
            if _emulated(v):
                meta_flat.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta"))
            elif isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() > 0:
                meta_flat.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta"))
            elif isinstance(v, torch.device) and v.type in ("cuda", "cpu"):
                meta_flat.append(torch.device("meta"))
            elif isinstance(v, EmulatedGenerator):
                meta_flat.append(None)
            else:
                meta_flat.append(v)
        meta_args, meta_kwargs = _unflatten(meta_flat, spec)
        meta_kwargs = {k: v for k, v in meta_kwargs.items() if k != "pin_memory"}
        try:
            out = func(*meta_args, **meta_kwargs)
        except NotImplementedError:
            self._require_cpu_kernel(func)
            return None
        except RuntimeError as exc:
            if "data-dependent" in str(exc) or "meta" in str(exc).lower() or "item()" in str(exc):
                self._require_cpu_kernel(func)
                return None
            raise
        written_metas = [m for m in meta_flat if isinstance(m, torch.Tensor)]
        leaves, out_spec = _leaves(out)
        items, in_place = [], False
        schema = func._schema
        returns = list(schema.returns)
        for i, v in enumerate(leaves):
            if isinstance(v, torch.Tensor):
                ret = returns[i] if i < len(returns) else None
                aliased = ret is not None and ret.alias_info is not None and ret.alias_info.is_write
                if aliased or any(v is m for m in written_metas):
                    items.append("written")
                    in_place = True
                else:
                    items.append((tuple(v.shape), tuple(v.stride()), v.dtype))
            else:
                return None  # a value the host reads: the stream must have produced it
        return _Layout(items, out_spec, in_place)

    def _require_cpu_kernel(self, func) -> None:
        name = func.name()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU") or \
                torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd") or \
                torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
            return
        raise EmulationError(f"operator `{name}` at {caller_site()} has no CPU implementation, so the sim cannot "
                             "run it (a custom CUDA kernel or extension); register a CPU implementation of it "
                             "(torch.library's register_kernel(..., 'cpu')) or check this program on a GPU "
                             "(streamcheck run --backend gpu)")

    def whole_function(self, func, flat, spec, failure):
        """`func` as one kernel on the current stream: it reads its CUDA arguments and writes the fresh
        tensors it returns, computed on their CPU views when the scheduler runs it. For composite
        functions whose own C++ needs a CUDA kernel a CPU-only build lacks; one that returns one of its
        arguments (in place) is refused in one line."""
        cuda = [v for v in flat if type(v) is CudaTensor]
        s = self.current_stream(cuda[0].device.index)
        meta_flat = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") if type(v) is CudaTensor
                     else v for v in flat]
        meta_args, meta_kwargs = _unflatten(meta_flat, spec)
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", "function")
        try:
            shapes = func(*meta_args, **meta_kwargs)
        except Exception as exc:
            raise EmulationError(f"{name} at {caller_site()} has no CPU path under the emulation ({failure}; its meta "
                                 f"kernel: {type(exc).__name__}: {exc}); check this program on a GPU "
                                 "(streamcheck run --backend gpu)") from None
        leaves, kind = _leaves(shapes)
        if any(any(v is m for m in meta_flat) for v in leaves):
            raise EmulationError(f"{name} at {caller_site()} writes one of its arguments in C++ code a CPU-only build "
                                 "cannot run for CUDA tensors; check this program on a GPU")
        out = [self.empty(tuple(v.shape), tuple(v.stride()), v.dtype, s.device_index, s) if isinstance(v, torch.Tensor)
               else v for v in leaves]
        inner_args, inner_kwargs = _unflatten([self._staged(v) for v in flat], spec)
        targets = [t._inner for t in out if type(t) is CudaTensor]
        self.device.launch(_Kernel(func, inner_args, inner_kwargs, targets, None), stream=s.device_stream,
                           reads=[r for r in (_region(v) for v in cuda) if r is not None],
                           writes=[r for r in (_region(t) for t in out if type(t) is CudaTensor) if r is not None],
                           name=name)
        return _rebuilt(out, kind)

    # --- advanced indexing --------------------------------------------------------------
    def gather(self, source, index):
        """`x[tensor index]`: a gather kernel on the current stream. A boolean mask has a
        data-dependent shape: the host waits for the stream first, as CUDA's nonzero does."""
        s = self.current_stream(source.device.index)
        reads = [r for r in [_region(source)] + [_region(t) for t in _index_tensors(index) if _emulated(t)] if r]
        inner_index = _inner_index(index)
        if any(t.dtype == torch.bool for t in _index_tensors(index)):
            # A data-dependent shape: the host waits for the stream and reads (CUDA's nonzero does).
            masks = [t for t in _index_tensors(index) if type(t) is CudaTensor]
            host = self.stage_for_host(s, [source] + masks, "aten.index.Tensor")
            replaced = dict(zip(map(id, masks), host[1:]))
            items = index if isinstance(index, tuple) else (index,)
            host_index = tuple(replaced.get(id(v), _inner(v)) for v in items)
            value = host[0][host_index if isinstance(index, tuple) else host_index[0]]
            out = self.empty(tuple(value.shape), tuple(value.stride()), value.dtype, s.device_index, s)
            self.device.launch(_Kernel(torch.Tensor.copy_, (out._inner, value), {}, (), None),
                               stream=s.device_stream, writes=[r for r in [_region(out)] if r], name="aten.index.Tensor")
            return out
        meta = torch.empty_strided(source.shape, source.stride(), dtype=source.dtype, device="meta")
        shape = meta[_inner_index(index, to_meta=True)]
        out = self.empty(tuple(shape.shape), tuple(shape.stride()), shape.dtype, s.device_index, s)
        self.device.launch(_Kernel(torch.Tensor.__getitem__, (source._inner, inner_index), {}, [out._inner], None),
                           stream=s.device_stream, reads=reads, writes=[r for r in [_region(out)] if r],
                           name="aten.index.Tensor")
        return out

    def scatter(self, target, index, value):
        """`x[tensor index] = value`: an index_put_ kernel on the current stream."""
        s = self.current_stream(target.device.index)
        reads = [r for r in [_region(t) for t in _index_tensors(index) if _emulated(t)] if r]
        if _emulated(value):
            reads += [r for r in [_region(value)] if r]
        inner_value = self._staged(value) if isinstance(value, torch.Tensor) else value
        self.device.launch(_Kernel(torch.Tensor.__setitem__, (target._inner, _inner_index(index), inner_value), {},
                                   (), None), stream=s.device_stream, reads=reads,
                           writes=[r for r in [_region(target)] if r], name="aten.index_put_.default")

    # --- host <-> device ---------------------------------------------------------------
    def to_device(self, source, index: int, dtype=None, non_blocking: bool = False):
        """A host tensor copied to cuda:index on the current stream (`.cuda()`, `.to("cuda")`,
        a factory's `device="cuda"`): from pageable memory, staged now and waited for."""
        self.enter()
        if dtype is not None and dtype != source.dtype:
            source = source.to(dtype)
        src = source.contiguous() if not source.is_contiguous() else source
        s = self.current_stream(index)
        t = self.empty(tuple(src.shape), tuple(src.stride()), src.dtype, index, s)
        region = _region(t)
        if type(source) is PinnedTensor:
            read = _region(source)
            self.device.launch(_Kernel(torch.Tensor.copy_, (t._inner, source._inner), {}, (), None),
                               stream=s.device_stream, reads=[read] if read else [],
                               writes=[region] if region else [], name="aten._to_copy.default")
            if not non_blocking:
                self.device.host_access(name="aten._to_copy.default", sync=s.device_stream)
        else:
            staged = src.detach().clone()
            self.device.launch(_Kernel(torch.Tensor.copy_, (t._inner, staged), {}, (), None),
                               stream=s.device_stream, writes=[region] if region else [],
                               name="aten._to_copy.default")
            # From pageable memory: synchronous, as on CUDA.
            self.device.host_access(name="aten._to_copy.default", sync=s.device_stream)
        if source.requires_grad:
            t.requires_grad_(True)
        return t

    def factory(self, func, args, kwargs, index: int):
        """`torch.zeros(..., device="cuda")` & co.: computed on the host now (random ones with the
        device's generator, at issue), written into a fresh block by a kernel on the current stream."""
        self.enter()
        cpu_kwargs = dict(kwargs, device="cpu")
        cpu_kwargs.pop("pin_memory", None)
        requires_grad = bool(cpu_kwargs.pop("requires_grad", False))
        generator = cpu_kwargs.get("generator")
        if isinstance(generator, EmulatedGenerator):
            cpu_kwargs["generator"] = generator.next_cpu_generator()
            value = func(*args, **cpu_kwargs)
        elif generator is not None:  # already forked at the call
            value = func(*args, **cpu_kwargs)
        elif getattr(func, "__name__", "") in _RANDOM_FACTORIES:
            cpu_kwargs["generator"] = self.generators[index].next_cpu_generator()
            try:
                value = func(*args, **cpu_kwargs)
            except TypeError:  # a factory without a generator argument: the global CPU one
                cpu_kwargs.pop("generator")
                value = func(*args, **cpu_kwargs)
        else:
            value = func(*args, **cpu_kwargs)
        if not isinstance(value, torch.Tensor):
            return value
        s = self.current_stream(index)
        value = value.contiguous()
        t = self.empty(tuple(value.shape), tuple(value.stride()), value.dtype, index, s)
        region = _region(t)
        self.device.launch(_Kernel(torch.Tensor.copy_, (t._inner, value), {}, (), None), stream=s.device_stream,
                           writes=[region] if region else [], name=f"aten.{func.__name__}")
        if func.__name__ in _COPYING_FACTORIES:  # torch.tensor(data, device=...) copies from pageable memory
            self.device.host_access(name=f"aten.{func.__name__}", sync=s.device_stream)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def pinned_factory(self, func, args, kwargs):
        """A factory with pin_memory=True: pinned host memory, written by the host now."""
        cpu_kwargs = dict(kwargs)
        cpu_kwargs.pop("pin_memory", None)
        value = func(*args, **cpu_kwargs)
        return self.pin(value)

    def pin(self, value) -> PinnedTensor:
        value = value.contiguous()
        t = self.pinned(tuple(value.shape), tuple(value.stride()), value.dtype)
        region = _region(t)
        if region is not None:
            self.device.host_access(writes=[region], name="pin_memory")
        t._inner.copy_(value)
        return t

    # --- torch.cuda's patched surface ----------------------------------------------------
    def _patch_torch(self) -> None:
        cuda = torch.cuda
        emu = self

        def put(owner, name, value):
            missing = object()
            old = owner.__dict__.get(name, missing)
            setattr(owner, name, value)

            def undo():
                if old is missing:
                    delattr(owner, name)
                else:
                    setattr(owner, name, old)
            self._undo.append(undo)

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

        def memory_stat(table):
            def read(device=None):
                emu.enter()
                return table.get(0 if device is None else emu.device_index(device), 0)
            return read

        alloc = self.allocator

        def memory_stats(device=None):
            index = 0 if device is None else emu.device_index(device)
            emu.enter()
            return {"allocated_bytes.all.current": alloc.allocated.get(index, 0),
                    "allocated_bytes.all.peak": alloc.peak_allocated.get(index, 0),
                    "reserved_bytes.all.current": alloc.reserved.get(index, 0),
                    "reserved_bytes.all.peak": alloc.peak_reserved.get(index, 0)}

        def reset_peaks(device=None):
            index = 0 if device is None else emu.device_index(device)
            alloc.peak_allocated[index] = alloc.allocated.get(index, 0)
            alloc.peak_reserved[index] = alloc.reserved.get(index, 0)

        def mem_get_info(device=None):
            index = 0 if device is None else emu.device_index(device)
            return TOTAL_MEMORY - alloc.reserved.get(index, 0), TOTAL_MEMORY

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
            "_lazy_init": lambda: None, "device_count": lambda: self.device.devices,
            "current_device": self.current_device, "set_device": self.set_current_device, "device": device,
            "get_device_name": lambda device=None: DeviceProperties(0).name,
            "get_device_capability": lambda device=None: (9, 0),
            "get_device_properties": lambda device=None: DeviceProperties(
                emu.current_device() if device is None else emu.device_index(device)),
            "get_arch_list": lambda: ["sm_90"], "is_bf16_supported": lambda including_emulation=True: True,
            "Stream": stream_factory, "ExternalStream": external_stream, "Event": EmulatedEvent,
            "current_stream": lambda device=None: emu.current_stream(device),
            "default_stream": lambda device=None: emu.default_stream(device),
            "set_stream": self.set_current_stream, "stream": stream, "StreamContext": stream,
            "synchronize": self.synchronize, "_sleep": self.sleep,
            "CUDAGraph": EmulatedGraph, "graph": graph, "graph_pool_handle": self.new_pool,
            "make_graphed_callables": make_graphed_callables,
            "is_current_stream_capturing": is_current_stream_capturing,
            "memory_allocated": memory_stat(alloc.allocated), "max_memory_allocated": memory_stat(alloc.peak_allocated),
            "memory_reserved": memory_stat(alloc.reserved), "max_memory_reserved": memory_stat(alloc.peak_reserved),
            "memory_stats": memory_stats, "reset_peak_memory_stats": reset_peaks,
            "reset_max_memory_allocated": reset_peaks, "mem_get_info": mem_get_info,
            "empty_cache": alloc.empty_cache, "ipc_collect": lambda: None,
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
            lambda a, b: False if _emulated(a) or _emulated(b) else shallow(a, b))
        put(cuda, "nvtx", _Nvtx())
        sys.meta_path.insert(0, _refuse_cupy)
        self._undo.append(lambda: sys.meta_path.remove(_refuse_cupy))
        self._refuse_triton(put)

    def _refuse_triton(self, put) -> None:
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
            self._undo.append(watcher.remove)


_MISSING = object()
_RANDOM_FACTORIES = frozenset({"rand", "randn", "randint", "randperm", "normal", "rand_like", "randn_like",
                               "randint_like", "bernoulli", "multinomial"})
_COPYING_FACTORIES = frozenset({"tensor", "as_tensor", "asarray", "from_numpy"})


# Operators that take host tensors beside device ones as torch does: copies, and indices.
_HOST_TENSORS_ALLOWED = frozenset({"aten.copy_.default", "aten._to_copy.default", "aten._copy_from.default",
                                   "aten._copy_from_and_resize.default", "aten.index.Tensor", "aten.index_put_.default",
                                   "aten.index_put.default", "aten._index_put_impl_.default"})


def _check_same_device(name: str, flat) -> None:
    """torch's device check: a host tensor (other than a 0-d one) beside CUDA ones is an error."""
    devices = set()
    for v in flat:
        if type(v) is CudaTensor:
            devices.add(str(v.device))
        elif isinstance(v, torch.Tensor) and v.dim() > 0:
            devices.add("cpu")
    if len(devices) > 1:
        first, second = sorted(devices, key=lambda d: (d == "cpu", d))[:2]
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {first} "
                           f"and {second}! (when checking argument for {name})")


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _same_view(a, b) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.storage_offset() == b.storage_offset())


def _target_device(kwargs):
    value = kwargs.get("device")
    if value is None:
        return None
    return value if isinstance(value, torch.device) else torch.device(value)


def _signature(func, flat, spec) -> Optional[tuple]:
    """A hashable key of an operator call for the meta cache: tensors by layout, the rest by value."""
    key = [func, spec]
    for v in flat:
        if isinstance(v, torch.Tensor):
            key.append((type(v), tuple(v.shape), v.stride(), v.dtype, v.device.type))
        elif isinstance(v, EmulatedGenerator):
            key.append("generator")
        else:
            key.append((type(v), v))
    key = tuple(key)
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Layout:
    __slots__ = ("leaves", "spec", "in_place")

    def __init__(self, leaves, spec, in_place):
        self.leaves = leaves
        self.spec = spec
        self.in_place = in_place


class _Copies:
    """Copies into host staging memory, as one kernel (a `.item()`'s or a mask's read-back)."""

    __slots__ = ("pairs", "__name__")

    def __init__(self, pairs):
        self.pairs = pairs
        self.__name__ = "copy to host"

    def __call__(self, *_):
        for dst, src in self.pairs:
            dst.copy_(src)


class _Kernel:
    """One operator's execution, run by the scheduler: on the CPU views of its blocks, writing its
    fresh results into the blocks allocated for them."""

    __slots__ = ("func", "args", "kwargs", "targets", "generator", "__name__")

    def __init__(self, func, args, kwargs, targets, generator):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.targets, self.generator = targets, generator
        self.__name__ = getattr(func, "__name__", "kernel")

    def __call__(self, *_):
        kwargs = self.kwargs
        if self.generator is not None:
            if "generator" in kwargs or _takes_generator(self.func):
                kwargs = dict(kwargs, generator=self.generator)
                out = self.func(*self.args, **kwargs)
            else:
                state = torch.default_generator.get_state()
                torch.default_generator.manual_seed(self.generator.initial_seed())
                try:
                    out = self.func(*self.args, **kwargs)
                finally:
                    torch.default_generator.set_state(state)
        else:
            out = self.func(*self.args, **kwargs)
        if self.targets:
            if type(out) is torch.Tensor and len(self.targets) == 1:
                self.targets[0].copy_(out)
                return
            leaves = [v for v in _leaves(out)[0] if isinstance(v, torch.Tensor)]
            fresh = [v for v in leaves if not any(v is a for a in self.args)]
            for dst, src in zip(self.targets, fresh if len(fresh) == len(self.targets) else leaves):
                dst.copy_(src)


@functools.lru_cache(maxsize=None)
def _seeded(func) -> bool:
    """A random operator: it draws from a generator (torch tags them)."""
    return torch.Tag.nondeterministic_seeded in func.tags


@functools.lru_cache(maxsize=None)
def _takes_generator(func) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any(a.name == "generator" for a in schema.arguments)


class _HostBlock:
    """Pinned host memory's block: a sim buffer (so the checker sees its bytes)."""

    __slots__ = ("buffer", "bytes", "views")

    def __init__(self, buffer):
        self.buffer = buffer
        self.bytes = buffer.storage
        self.views = {}


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


_refuse_cupy = _RefuseCupy()


class _FactoryMode(TorchFunctionMode):
    """Factories and conversions a CPU-only torch refuses before dispatch: `device="cuda"`,
    `.cuda()`, `.to("cuda")`, `pin_memory=True`, `.pin_memory()`, `record_stream(s)`."""

    def __init__(self, emulation):
        super().__init__()
        self.emulation = emulation

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_grad_enabled() and _needs_grad(args, kwargs):
            # Autograd is not emulated: a graph node on an emulated tensor asks a CPU-only build for a
            # CUDA stream and aborts the process. Forward passes run as under torch.no_grad();
            # backward() is refused in one line.
            self.emulation.notice(_NO_AUTOGRAD)
            with torch.no_grad():
                return self._call(func, args, kwargs)
        return self._call(func, args, kwargs)

    def _call(self, func, args, kwargs):
        generator = kwargs.get("generator")
        if type(generator) is EmulatedGenerator:
            # Taken here, at the call: past torch's binding the generator is a plain torch.Generator
            # (the same C++ object, a new Python one), no longer known as a CUDA one.
            kwargs = dict(kwargs, generator=generator.next_cpu_generator())
        handler = _METHODS.get(func)
        if handler is not None:
            return handler(self.emulation, func, args, kwargs)
        device_arg = kwargs.get("device")
        if device_arg is not None:
            target = device_arg if isinstance(device_arg, torch.device) else _maybe_device(device_arg)
            if target is not None and target.type == "cuda" and not any(type(a) is CudaTensor for a in args):
                return self.emulation.factory(func, args, kwargs, self.emulation.device_index(target))
        if kwargs.get("pin_memory"):
            return self.emulation.pinned_factory(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except NotImplementedError as exc:
            # A composite function whose C++ makes a tensor "like" a CUDA input (F.scaled_dot_product_attention's
            # causal mask): a CPU-only build has no CUDA kernel for it. Then the function is one kernel.
            if "'CUDA' backend" not in str(exc):
                raise
            flat, spec = _flatten(args, kwargs)
            if not any(type(v) is CudaTensor for v in flat):
                raise
            return self.emulation.whole_function(func, flat, spec, exc)


_NO_AUTOGRAD = ("autograd is not emulated on the sim: operators on tensors that require grad ran as under "
                "torch.no_grad() (their results do not require grad), and backward() is refused; check the backward "
                "pass on a GPU")


def _needs_grad(args, kwargs) -> bool:
    """Whether an emulated tensor that requires grad is among the arguments (one level into lists)."""
    for values in (args, kwargs.values()):
        for value in values:
            kind = type(value)
            if kind is CudaTensor or kind is PinnedTensor:
                if value.requires_grad:
                    return True
            elif kind is list or kind is tuple:
                if any(_emulated(v) and v.requires_grad for v in value):
                    return True
    return False


def _maybe_device(value):
    if isinstance(value, (str, int)):
        try:
            return torch.device(value) if isinstance(value, str) else torch.device("cuda", value)
        except RuntimeError:
            return None
    return None


def _to(emulation, func, args, kwargs):
    self = args[0]
    if len(args) > 1 and isinstance(args[1], torch.Tensor):  # .to(other): its device and dtype
        other = args[1]
        args, kwargs = (self, other.device, other.dtype) + tuple(args[2:]), kwargs
    device_, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
    copy = bool(kwargs.get("copy", False))
    if type(self) is CudaTensor:
        if device_ is not None and device_.type == "cuda":
            device_ = torch.device("cuda", emulation.device_index(device_))  # "cuda": the current device
        if (device_ is None or device_ == self.device) and (dtype is None or dtype == self.dtype) and not copy \
                and memory_format in (None, torch.preserve_format):
            return self  # torch's .to returns the tensor itself when nothing changes
        # Straight to the operator: torch's binding of .to takes a CUDA device guard.
        return torch.ops.aten._to_copy.default(self, dtype=dtype or self.dtype, device=device_ or self.device,
                                               non_blocking=non_blocking, memory_format=memory_format)
    if device_ is not None and device_.type == "cuda":
        return emulation.to_device(self, emulation.device_index(device_), dtype, non_blocking)
    return func(*args, **kwargs)


def _cuda(emulation, func, args, kwargs):
    self = args[0]
    where = args[1] if len(args) > 1 else kwargs.get("device")
    index = emulation.current_device() if where is None else emulation.device_index(where)
    if type(self) is CudaTensor:
        if self.device.index == index:
            return self
        return torch.ops.aten._to_copy.default(self, device=torch.device("cuda", index),
                                               non_blocking=bool(kwargs.get("non_blocking", False)))
    return emulation.to_device(self, index, None, bool(kwargs.get("non_blocking", False)))


def _pin_memory(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is PinnedTensor:
        return self
    if type(self) is CudaTensor:
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    emulation.enter()
    return emulation.pin(self)


def _is_pinned(emulation, func, args, kwargs):
    return type(args[0]) is PinnedTensor


def _numpy(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is CudaTensor:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")
    if type(self) is PinnedTensor:  # the same bytes, as torch's numpy() of pinned memory; the host reads them now
        emulation.enter()
        region = _region(self)
        if region is not None:
            emulation.device.host_access(reads=[region], name="numpy")
        return self._inner.numpy()
    return func(*args, **kwargs)


def _tolist(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is CudaTensor:
        return self.cpu().tolist()  # a copy to the host, then a wait: CUDA's tolist
    if type(self) is PinnedTensor:
        emulation.enter()
        region = _region(self)
        if region is not None:
            emulation.device.host_access(reads=[region], name="tolist")
        return self._inner.tolist()
    return func(*args, **kwargs)


def _inner_index(index, to_meta: bool = False):
    """An index with emulated tensors replaced by their CPU views (or meta stand-ins)."""
    def one(v):
        if _emulated(v) or isinstance(v, torch.Tensor):
            inner = _inner(v)
            return torch.empty_strided(inner.shape, inner.stride(), dtype=inner.dtype, device="meta") if to_meta \
                else inner
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(one(x) for x in v)
        return v
    return tuple(one(v) for v in index) if isinstance(index, tuple) else one(index)


def _basic(index) -> bool:
    """Ints, slices, None and Ellipsis only: indexing makes a view."""
    items = index if isinstance(index, tuple) else (index,)
    return all(v is None or v is Ellipsis or isinstance(v, (int, slice)) and not isinstance(v, bool)
               for v in items)


def _index_tensors(index) -> list:
    items = index if isinstance(index, tuple) else (index,)
    return [v for v in items if isinstance(v, torch.Tensor)]


def _getitem(emulation, func, args, kwargs):
    self, index = args
    if not _emulated(self):
        return func(*args, **kwargs)
    emulation.enter()
    if _basic(index):  # a view of the same bytes: no kernel (torch's indexing here needs a CUDA guard)
        return type(self)(self._inner[index], self._block, self.device)
    if type(self) is PinnedTensor:
        region = _region(self)
        emulation.device.host_access(reads=[region] if region else [], name="index")
        return self._inner[_inner_index(index)]
    return emulation.gather(self, index)


def _setitem(emulation, func, args, kwargs):
    self, index, value = args
    if not _emulated(self):
        return func(*args, **kwargs)
    emulation.enter()
    if _basic(index):
        target = type(self)(self._inner[index], self._block, self.device)
        if isinstance(value, torch.Tensor):
            target.copy_(value)
        else:
            target.fill_(value)
        return None
    if type(self) is PinnedTensor:
        region = _region(self)
        emulation.device.host_access(writes=[region] if region else [], name="index_put_")
        self._inner[_inner_index(index)] = _inner(value)
        return None
    return emulation.scatter(self, index, value)


def _contiguous(emulation, func, args, kwargs):
    # torch's composite `contiguous` takes a CUDA device guard a CPU-only build lacks: a clone does it.
    self = args[0]
    memory_format = args[1] if len(args) > 1 else kwargs.get("memory_format", torch.contiguous_format)
    if not _emulated(self) or self.is_contiguous(memory_format=memory_format):
        return func(*args, **kwargs)
    return torch.Tensor.clone(self, memory_format=memory_format)


def _where(emulation, func, args, kwargs):
    # A Python scalar operand becomes a tensor on the condition's device in C++ (which a CPU-only
    # build cannot allocate): a 0-d host tensor is what CUDA operators accept beside device ones.
    args = tuple(torch.tensor(v) if isinstance(v, (int, float, bool)) else v for v in args)
    kwargs = {k: torch.tensor(v) if isinstance(v, (int, float, bool)) else v for k, v in kwargs.items()}
    return func(*args, **kwargs)


def _nonzero(emulation, func, args, kwargs):
    self = args[0]
    if type(self) is not CudaTensor or kwargs.get("as_tuple") or len(args) > 1:
        return func(*args, **kwargs)
    return emulation.dispatch(torch.ops.aten.nonzero.default, (self,), {})


def _copy(emulation, func, args, kwargs):
    # torch's binding of copy_ takes a CUDA device guard when one side is on the host: straight to
    # the operator, which the emulation dispatches like any other.
    if not any(_emulated(a) for a in args):
        return func(*args, **kwargs)
    return torch.ops.aten.copy_.default(*args, **kwargs)


def _data_ptr(emulation, func, args, kwargs):
    self = args[0]
    if not _emulated(self):
        return func(*args, **kwargs)
    return self._block.bytes.ctypes.data + self.storage_offset() * self.element_size()


def _untyped_storage(emulation, func, args, kwargs):
    self = args[0]
    if not _emulated(self):
        return func(*args, **kwargs)
    return EmulatedStorage(emulation, self)


class EmulatedStorage:
    """`tensor.untyped_storage()` of an emulated tensor: its block. `resize_(0)` frees the block now
    (FSDP's way of giving parameters back), as torch's allocator does: its bytes go back to the
    stream's pool, and pending work on other streams races with the next owner."""

    def __init__(self, emulation, tensor):
        self._emulation = emulation
        self._tensor = tensor
        self.device = tensor.device

    def data_ptr(self) -> int:
        return self._tensor._block.bytes.ctypes.data

    def nbytes(self) -> int:
        return 0 if self._tensor._block.buffer.freed else self._tensor._block.buffer.nbytes

    def size(self) -> int:
        return self.nbytes()

    def resize_(self, nbytes: int):
        emulation = self._emulation
        emulation.enter()
        if nbytes == self.nbytes():
            return self
        if nbytes != 0:
            raise EmulationError(f"untyped_storage().resize_({nbytes}) at {caller_site()}: the sim frees a block "
                                 "(resize_(0)) but does not grow one; allocate a new tensor instead")
        emulation.allocator.release(self._tensor._block)
        return self

    def __len__(self) -> int:
        return self.nbytes()


def _scalar(convert):
    def handler(emulation, func, args, kwargs):
        self = args[0]
        if not _emulated(self):
            return func(*args, **kwargs)
        return convert(self.item())  # a host read, as torch's conversion of a CUDA scalar
    return handler


_METHODS = {
    torch.Tensor.to: _to, torch.Tensor.cuda: _cuda, torch.Tensor.pin_memory: _pin_memory,
    torch.Tensor.is_pinned: _is_pinned,
    torch.Tensor.numpy: _numpy, torch.Tensor.tolist: _tolist, torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem, torch.Tensor.contiguous: _contiguous, torch.where: _where,
    torch.Tensor.where: _where, torch.nonzero: _nonzero, torch.Tensor.nonzero: _nonzero,
    torch.Tensor.copy_: _copy, torch.Tensor.data_ptr: _data_ptr, torch.Tensor.untyped_storage: _untyped_storage,
    torch.Tensor.__float__: _scalar(float), torch.Tensor.__int__: _scalar(int), torch.Tensor.__index__: _scalar(int),
    torch.Tensor.__complex__: _scalar(complex),
}
