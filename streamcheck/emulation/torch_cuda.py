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
  random operator is issued (in a graph, replayed), so values do not depend on the schedule), memory
  statistics, capacity and out-of-memory errors, and device properties of an emulated device; several
  devices with peer copies between them.

- autograd: torch's engine, through the native CUDA guard (autograd.py, native/) where the
  process was started with it: backward operators on their forward operators' streams, the
  engine's syncs as sim events and waits; the current streams are the guard's thread-locals.
- host threads: every thread uses the emulation, with its own current device and stream; thread
  start and join are edges, as are queues, events and locks (threads, host_handoffs.py).

What it refuses, with one line that names it and the user's line (EmulationError): CuPy,
operators with no CPU implementation (custom CUDA extensions), Triton kernels, `ExternalStream`,
`make_graphed_callables`, and, without the native guard, `backward()`, `torch.autograd.backward/grad`
and `Function.apply` on emulated tensors (torch's engine would ask a CPU-only build for a CUDA device
guard and abort the process; forward operators on tensors that require grad then run as under
no_grad, with a notice). `torch.compile` runs its function as eager operators, with a notice (and
one more for CUDA graph trees, which are not emulated).
docs/emulation.md has the table, and a second one classifying every public torch.cuda name (NVML,
NCCL, raw handles, pluggable allocators, ... are refused there). The pieces, one module each: running (the active emulation),
tensors, streams, generators, graphs, device_properties, operators, transfers, factory_mode,
surface (torch.cuda's names and the refusals), threads, legacy_types (torch.cuda.FloatTensor & co.), accelerator
(torch.accelerator, torch.Stream / torch.Event on cuda, torch.backends.cuda), autograd (with native/), allocator (with its segments
and capacity), memory_stats.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import threading
from typing import Optional

import torch

from ..core.trace import skip_wrapper_frames
from . import running
from .allocator import CachingAllocator, rounded
from .autograd import Autograd
from .device_properties import DeviceProperties
from .generators import EmulatedGenerator
from .graphs import graph
from .memory_stats import capacity_from_environment
from .operators import OperatorDispatch
from .running import EmulationError, active  # noqa: F401 (active: public here)
from .streams import EmulatedStream
from .surface import patch_torch
from .tensors import CudaTensor, HostBlock, PinnedTensor, storage_elements, typed_view
from .threads import HostThreads
from .transfers import HostTransfers

SLEEP_CYCLES_PER_STEP = 1_000_000  # torch.cuda._sleep: cycles per host step its stream is held


# torch.ops.aten.X(...) calls go through OpOverload.__call__: a forwarding frame, not the user's library call.
skip_wrapper_frames(torch._ops.__file__, "__call__")


class Emulation(OperatorDispatch, HostTransfers):
    """One emulated run: the sim Device, torch's streams over its streams, the allocator, the
    generators, what was refused. Enter it with `with Emulation(device):`."""

    def __init__(self, device, memory_capacity: Optional[int] = None):
        """`memory_capacity`: bytes of each emulated device (None: STREAMCHECK_MEMORY_CAPACITY's, else
        8 GiB); allocations beyond it raise torch's OutOfMemoryError."""
        self._memory_capacity = memory_capacity
        self._undo: list = []
        self._froze = False
        self.device = device
        self.autograd = Autograd(self)
        self.threads = HostThreads(self)  # one for the emulation's life: its patches and per-thread modes
        # The current device and streams of each thread: the native guard's (C++ thread-locals that
        # torch's autograd engine reads and sets too) where it is loaded, else these tables.
        self._native = self.autograd.library
        self._start(device)

    def _start(self, device) -> None:
        """The state of one run on `device` (what reset() makes fresh)."""
        self.device = device
        capacity = self._memory_capacity if self._memory_capacity is not None else capacity_from_environment()
        self.allocator = CachingAllocator(device, capacity)
        self.properties = [DeviceProperties(k, capacity) for k in range(device.devices)]
        self._cuda_devices = [torch.device("cuda", k) for k in range(device.devices)]
        self.notices: list = []
        self.capture_errors: list = []  # core.capture.CaptureError the program got from a capture
        self.capture_pools: dict = {}  # capturing device stream id -> graph pool
        self.capture_graphs: dict = {}  # capturing device stream id -> its EmulatedGraph
        self._pools = 0
        self._streams = 0
        self._legacies = [EmulatedStream(self, legacy) for legacy in device.legacies]
        self._by_id: dict = {}  # sim stream id -> EmulatedStream, for the native guard's stream ids
        self._current: dict = {}  # (thread ident, device index) -> EmulatedStream
        self._current_device: dict = {}  # thread ident -> device index
        self.threads.refusals = []
        self.generators = [EmulatedGenerator(k) for k in range(device.devices)]
        self._calls: dict = {}  # operator call signature -> what it decides (operators._Call): meta is slow
        self.sync_debug_mode = 0  # torch.cuda.set_sync_debug_mode: 0 quiet, 1 warn, 2 error on implicit syncs
        self._adopted: dict = {}  # id(a block of an earlier run) -> (that block, its copy in this run)
        graph.default_capture_stream = None

    # --- entering and leaving ------------------------------------------------------------
    def __enter__(self):
        if running.is_active():
            raise EmulationError("an emulation is already running in this process")
        running.set_active(self)
        # torch._dynamo loaded before the patches: meta kernels import it, and its trace rules index
        # torch.cuda's functions by name.
        importlib.import_module("torch._dynamo")
        self._undo.extend(patch_torch(self))
        self.autograd.start()
        self._undo.append(self.autograd.stop)
        self._undo.extend(self.threads.install())
        self.threads.enter_here()
        # Python's full collections walk every object alive, some 300,000 after torch's import: a
        # fifth of an emulated operator's time. What exists now is frozen for the run (gc.freeze, where
        # nothing froze it already), so they walk what the run made; the program's garbage is
        # collected as before, and the frozen objects are ordinary again afterwards.
        self._froze = gc.get_freeze_count() == 0
        if self._froze:
            gc.freeze()
        return self

    def __exit__(self, *exc):
        try:
            self.threads.leave_here()
            self.threads.stop()
            self.allocator.close()
        finally:
            for undo in reversed(self._undo):
                undo()
            self._undo.clear()
            running.set_active(None)
            graph.default_capture_stream = None
            if self._froze:
                gc.unfreeze()

    def reset(self, device) -> None:
        """Go on as a fresh run on `device`, the patches staying in place (an emulation that lasts a
        whole pytest session, reset for each test): new streams (numbered from s1), allocator
        (memory statistics from 0), generators (torch's default seeds), notices, recording. Tensors
        of the earlier runs keep their values: the first operator of this run that uses one copies
        its block into this run (adopt)."""
        self.autograd.stop()  # the native guard's events and thread state were the earlier run's
        self.allocator.close()
        self._start(device)
        self.autograd.start()

    @contextlib.contextmanager
    def running_on(self, device):
        """`with emulation.running_on(device):` a run of its own on `device` in this thread (one of
        run_schedules' torch programs inside an emulated test), then the run it interrupted again."""
        saved = dict(self.__dict__)
        self._start(device)
        entered = not self.threads.has_mode()  # torch's mode stack is per thread: this thread needs one
        if entered:
            self.threads.enter_here()
        try:
            yield self
        finally:
            if entered:
                self.threads.leave_here()
            self.allocator.close()
            self.__dict__.update(saved)

    def adopt_earlier(self, flat) -> None:
        """Tensors among an operator's arguments that an earlier run made: adopted (below)."""
        device = self.device
        for v in flat:
            kind = type(v)
            if (kind is CudaTensor or kind is PinnedTensor) and v._block.buffer.device is not device:
                self.adopt(v)

    def adopt(self, t) -> None:
        """`t` is a tensor an earlier run made (module-level code, a module- or session-scoped
        fixture): its block's bytes are copied into a block of this run, and every tensor over the
        earlier block moves to the copy when this run first uses it. Its values carry over (after
        the earlier run finished its work); its history does not (no race with earlier runs)."""
        old = t._block
        found = self._adopted.get(id(old))
        if found is None:
            nbytes = old.buffer.nbytes
            index = old.buffer.device_index
            if type(t) is PinnedTensor:  # host memory: written now
                buffer = self.device.alloc((nbytes,), "uint8", name="pinned host tensor", fill=0, device=index)
                new = HostBlock(buffer)
                new.bytes[:nbytes] = old.bytes[:nbytes]
            else:
                # A block may come back from the allocator with work still pending on it: the values are
                # written by a kernel on the block's stream, after that work, as a copy would be.
                stream = self.current_stream(index).device_stream
                new = self.allocator.allocate(nbytes, stream)
                source, target = old.bytes, new.bytes

                def carry_over(*_):
                    target[:nbytes] = source[:nbytes]
                self.device.launch(carry_over, stream=stream, writes=[new.buffer.region()],
                                   name="values of a tensor from an earlier test")
            found = self._adopted[id(old)] = (old, new)
        new = found[1]
        t._inner = typed_view(new, t._inner.dtype, t._inner.shape, t._inner.stride(), t._inner.storage_offset())
        t._block = new

    def finish(self) -> None:
        """The end of a run that later runs may follow: its pending work done, as a GPU does it
        before the next test's (recorded as its last synchronize)."""
        self.synchronize()

    def enter(self) -> None:
        """Every entry point: record the frees of tensors that died since the last one. A thread that
        was running before the emulation began enters its factory mode here (threads.py)."""
        if not self.threads.has_mode() and running._active is self:
            self.threads.enter_here()
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
                raise ValueError(f"Expected a cuda device, but got: {where}")  # torch.cuda's own check
            index = where.index if where.index is not None else self.current_device()
        if not 0 <= index < self.device.devices:
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{index}; the sim emulates "
                               f"{self.device.devices} device(s): streamcheck run --devices N for more)")
        return index

    def current_device(self) -> int:
        if self._native is not None:
            return self._native.current_device()
        return self._current_device.get(threading.get_ident(), 0)

    def set_current_device(self, index) -> None:
        index = self.device_index(index)
        if self._native is not None:
            self._native.set_current_device(index)
        else:
            self._current_device[threading.get_ident()] = index

    def current_stream(self, index=None) -> EmulatedStream:
        index = self.current_device() if index is None else self.device_index(index)
        if self._native is not None:
            return self.stream_by_id(index, self._native.current_stream(index))
        found = self._current.get((threading.get_ident(), index))
        return found if found is not None else self._legacies[index]

    def stream_by_id(self, index: int, stream_id: int) -> EmulatedStream:
        """The stream a native guard's stream id names: 0 is the device's legacy default stream (as
        torch's CUDA stream ids), another its sim stream id; one this run did not make, the legacy."""
        found = self._by_id.get(stream_id) if stream_id else None
        return found if found is not None and found.device_index == index else self._legacies[index]

    def forget_thread(self) -> None:
        """The calling thread starts or ends: its current device and streams go (a CUDA thread starts
        on device 0 and its default stream; Python hands a dead thread's ident to a later one)."""
        ident = threading.get_ident()
        self._current_device.pop(ident, None)
        for index in range(self.device.devices):
            self._current.pop((ident, index), None)

    def default_stream(self, index=None) -> EmulatedStream:
        return self._legacies[self.current_device() if index is None else self.device_index(index)]

    def set_current_stream(self, s) -> None:
        if s is None:
            return
        if self._native is not None:
            stream_id = 0 if s is self._legacies[s.device_index] else s.device_stream.id
            self._native.set_current_stream(s.device_index, stream_id)
        else:
            self._current[(threading.get_ident(), s.device_index)] = s

    def new_stream(self, device=None, priority: int = 0, name: Optional[str] = None) -> EmulatedStream:
        """A stream of torch's pool: the program's are named s1, s2, ... in creation order; `name`: one of
        torch's own (it numbers none of the program's)."""
        self.enter()
        index = self.current_device() if device is None else self.device_index(device)
        with self.device._lock:  # threads making streams at once: one name each
            if name is None:
                self._streams += 1
                name = f"s{self._streams}"
            # torch's pool streams are non-blocking (cudaStreamNonBlocking): no join with the legacy stream.
            made = EmulatedStream(self, self.device.stream(name=name, kind="non_blocking",
                                                           priority=int(priority), device=index), priority)
            self._by_id[made.device_stream.id] = made
        return made

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
        nbytes = storage_elements(shape, stride) * dtype.itemsize
        pool = self.capture_pools.get(self._capturing_root(s.device_stream)) if self.capture_pools else None
        block = self.allocator.allocate(nbytes, s.device_stream, pool=pool)
        return CudaTensor(typed_view(block, dtype, shape, stride), block, self._cuda_devices[index])

    def is_capturing(self, s: EmulatedStream) -> bool:
        """Whether `s` takes part in a CUDA graph capture begun through torch.cuda."""
        return self._capturing_root(s.device_stream) is not None

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

    # --- random numbers ---------------------------------------------------------------------
    def draw(self, generator: EmulatedGenerator, stream: EmulatedStream):
        """What a random operator issued now on `stream` draws from: the generator's next state; in a
        CUDA graph capture, a slot that each replay fills from the generator's state at replay time."""
        if self.capture_graphs:
            root = self._capturing_root(stream.device_stream)
            if root is not None:
                return self.capture_graphs[root].captured_draw(generator)
        return generator.next_cpu_generator()

    def reseed(self, generator: EmulatedGenerator, seed: int) -> None:
        """manual_seed of a CUDA generator: refused while the current stream captures, unless the seed
        is the one it has (torch: the graph reads the seed at replay)."""
        if self.capture_graphs and self.is_capturing(self.current_stream()) and generator.initial_seed() != seed:
            raise RuntimeError("CUDAGeneratorImpl::set_current_seed can be called during stream capture only if "
                               "new seed is the same as the original seed.")
        generator.manual_seed(seed)

    def pinned(self, shape, stride, dtype, device_index: Optional[int] = None) -> PinnedTensor:
        """Pinned host memory. The sim files it under a device (the current one unless given):
        the streams of another device reach it as peer memory (not emulated as host memory)."""
        self.enter()
        nbytes = storage_elements(shape, stride) * dtype.itemsize
        index = self.current_device() if device_index is None else device_index
        buffer = self.device.alloc((rounded(nbytes),), "uint8", name="pinned host tensor", fill=0, device=index)
        block = HostBlock(buffer)
        return PinnedTensor(typed_view(block, dtype, shape, stride), block)


def run_on(device):
    """`with run_on(device) as emulation:` one run on `device`: on the emulation already running in
    this process (a pytest session's, see Emulation.running_on), else on a new one entered for it."""
    if running.is_active():
        return running.active().running_on(device)
    return Emulation(device)
