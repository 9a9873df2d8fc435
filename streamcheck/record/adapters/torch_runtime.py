"""torch's streams, events, synchronizations and caching allocator, through torch's GPU-trace
callbacks (torch.cuda._gpu_trace: what c10 reports from C++ as it happens, the hooks PyTorch's
own CUDA sanitizer uses) rather than patches: `wait_stream`, `torch.cuda.synchronize`,
`Stream.synchronize`, `Event.record / wait / synchronize`, the allocator's blocks.

Streams come as cudaStream_t, events as cudaEvent_t, memory as block addresses. torch's
default stream is the legacy stream (handle 0) unless per-thread default streams are on;
its pool streams are non-blocking (the driver's stream flags say so). A block is filed under
the stream current when it was allocated: the caching allocator reuses a freed block on that
stream at once (`tensor.record_stream(s)` defers that until `s` passed the free; torch_ops.py
records it). Block sizes are learnt when a tensor on the block is first seen.

The Python entry points of those syncs are also wrapped, only so that the sync audit's proof
rerun can skip one before it runs (the callback comes after); they record nothing themselves.

Supported: torch >= 2.4 (the callbacks and `torch._C._activate_gpu_trace` exist since 2.0;
older versions are refused with a notice). The callbacks cannot be unregistered: they are
registered once per process and forward to the recording that runs, if any.
"""
from __future__ import annotations

import threading

from .. import recorder as R
from ...core import trace as T
from ..gpu import is_suppressed
from .patching import forwarding
from .threads import unseen_work

_installed = threading.Lock()
_active = False  # callbacks registered with torch (once per process)


class TorchState:
    """What a recording keeps about torch: blocks allocated but not yet seen as a tensor
    (address -> stream id of the allocation), the blocks of CUDA graphs' private pools, and the
    host threads allocating into such a pool now (CUDA graph trees' warm-up runs)."""

    def __init__(self):
        self.pending: dict = {}
        self.graph_pool_blocks: set = set()
        self.graph_pool_threads: dict = {}  # thread ident -> depth of graph-pool contexts entered


def state(rec) -> TorchState:
    found = rec.state.get("torch")
    if found is None:
        found = rec.state["torch"] = TorchState()
    return found


def _recording():
    rec = R.current
    if rec is None or is_suppressed() or "torch" not in rec.state:
        return None
    return rec


def current_stream_ptr(torch, device=None) -> int:
    """cudaStream_t of torch's current stream on `device` (None: the current device)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = torch.cuda.current_device() if device is None else device
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream


# --- the callbacks ------------------------------------------------------------------------

# What each event callback records (also run by torch_native's drain, for the callbacks the native observer took).
def event_created(rec, event: int, stream: int = 0) -> None:
    rec.event_handle(event, fresh=True)


def event_deleted(rec, event: int, stream: int = 0) -> None:
    rec.forget_event_handle(event)


def event_recorded(rec, event: int, stream: int) -> None:
    rec.record(T.EventRecord(rec.tid(), rec.site(), event=rec.event_handle(event), stream=rec.sid(stream)))


def event_waited(rec, event: int, stream: int) -> None:
    rec.record(_wait_op(rec, event, stream))


def _event_created(event: int) -> None:
    rec = _recording()
    if rec is not None:
        event_created(rec, event)


def _event_deleted(event: int) -> None:
    rec = _recording()
    if rec is not None:
        event_deleted(rec, event)


def _event_recorded(event: int, stream: int) -> None:
    rec = _recording()
    if rec is not None:
        event_recorded(rec, event, stream)


# The records of torch's syncs and waits, from the raw handles its callbacks pass; also what a
# proof rerun decides on before the Python entry point makes the call (_skippable).
def _wait_op(rec, event: int, stream: int):
    return T.StreamWait(rec.tid(), rec.site(), stream=rec.sid(stream), event=rec.event_handle(event))


def _device_sync_op(rec):
    return T.DeviceSync(rec.tid(), rec.site())


def _stream_sync_op(rec, stream: int):
    return T.StreamSync(rec.tid(), rec.site(), stream=rec.sid(stream))


def _event_sync_op(rec, event: int):
    return T.EventSync(rec.tid(), rec.site(), event=rec.event_handle(event))


def _event_waited(event: int, stream: int) -> None:
    rec = _recording()
    if rec is not None:
        event_waited(rec, event, stream)


def _device_synchronized() -> None:
    rec = _recording()
    if rec is not None:
        rec.record(_device_sync_op(rec))


def _stream_synchronized(stream: int) -> None:
    rec = _recording()
    if rec is not None and not rec.reading:  # .item() and the like: host_read records it, with its cause
        rec.record(_stream_sync_op(rec, stream))


def _event_synchronized(event: int) -> None:
    rec = _recording()
    if rec is not None:
        rec.record(_event_sync_op(rec, event))


# What the allocator's callbacks record (also run by torch_native's drain, for the callbacks the native observer
# took: there `stream` is the stream that was current when the block was allocated, and the drain holds the lock).
def memory_allocated(rec, ptr: int, stream: int) -> None:
    """A block allocated on `stream` (cudaStream_t): filed under it until a tensor on it is first seen."""
    torch_state = state(rec)
    torch_state.pending[ptr] = rec.sid(stream)
    if rec.captures or torch_state.graph_pool_threads.get(R.acting_ident()):
        torch_state.graph_pool_blocks.add(ptr)


def memory_deallocated(rec, ptr: int, stream: int = 0) -> None:
    alloc = _freed_allocation(rec, ptr)
    if alloc is not None:
        rec.free_in_order(alloc, rec.tid(), rec.site())


def _freed_allocation(rec, ptr: int):
    """The recording's allocation that the free of block `ptr` ends (None: none, or not a free)."""
    torch_state = state(rec)
    torch_state.pending.pop(ptr, None)
    if rec.captures or ptr in torch_state.graph_pool_blocks:
        # torch rule: a block freed while a graph is captured, or allocated from a graph's
        # private pool (in a capture, or in a CUDA graph tree's warm-up), goes back to that pool.
        # Only a later capture or warm-up into the pool allocates from it, and torch starts each
        # with torch.cuda.synchronize(); the pool's memory leaves it only through cudaFree, which
        # waits for the device. Not a free: the bytes stay the graphs' (their replays' writes
        # are checked as graph launches).
        torch_state.graph_pool_blocks.discard(ptr)
        return None
    alloc = rec.allocation_at(ptr)
    return alloc if alloc is not None and alloc.pool == "torch" else None


def _allocated(ptr: int) -> None:
    rec = _recording()  # also inside a recorded op: its outputs are allocated there
    if rec is not None:
        rec.flush()  # the native observer's records come first (a free of this address among them)
        memory_allocated(rec, ptr, current_stream_ptr(rec.gpu.torch))
        unseen_work(rec, "allocated CUDA memory through torch")  # a thread the dispatch mode never reached


def _deallocated(ptr: int) -> None:
    rec = _recording()
    if rec is None:
        return
    rec.flush()  # the native observer's records of the block's tensors come first (they register it)
    alloc = _freed_allocation(rec, ptr)
    if alloc is not None:
        rec.free(alloc)


# The callbacks the native observer takes over while it records (observer.cpp's trace_hook numbers them by their
# place here): the registry of torch.cuda._gpu_trace, the callback registered there, what it records. The
# allocator's come last: the observer calls their callback itself where it cannot defer them (trace_hook).
TRACE_CALLBACKS = (
    ("EventCreationCallbacks", _event_created, event_created),
    ("EventDeletionCallbacks", _event_deleted, event_deleted),
    ("EventRecordCallbacks", _event_recorded, event_recorded),
    ("EventWaitCallbacks", _event_waited, event_waited),
    ("MemoryAllocationCallbacks", _allocated, memory_allocated),
    ("MemoryDeallocationCallbacks", _deallocated, memory_deallocated),
)

_CALLBACKS = (
    ("register_callback_for_event_creation", _event_created),
    ("register_callback_for_event_deletion", _event_deleted),
    ("register_callback_for_event_record", _event_recorded),
    ("register_callback_for_event_wait", _event_waited),
    ("register_callback_for_device_synchronization", _device_synchronized),
    ("register_callback_for_stream_synchronization", _stream_synchronized),
    ("register_callback_for_event_synchronization", _event_synchronized),
    ("register_callback_for_memory_allocation", _allocated),
    ("register_callback_for_memory_deallocation", _deallocated),
)


def _activate(torch) -> None:
    global _active
    with _installed:
        if _active:
            return
        from torch.cuda import _gpu_trace

        for name, callback in _CALLBACKS:
            getattr(_gpu_trace, name)(callback)
        torch._C._activate_gpu_trace()
        _active = True


def supported(torch) -> str:
    """Why this torch cannot be recorded (empty: it can)."""
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < (2, 4):
        return f"torch {torch.__version__} is older than 2.4; torch work is not checked (upgrade torch)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (a CPU build, or no GPU); torch work is not checked"
    if not hasattr(torch._C, "_activate_gpu_trace"):
        return f"torch {torch.__version__} has no GPU-trace hooks; torch streams and events are not checked"
    return ""


def install(rec, patcher) -> None:
    torch = rec.gpu.torch
    reason = supported(torch)
    if reason:
        rec.notice(reason)
        return
    state(rec)  # from here on the callbacks record for `rec`
    _activate(torch)
    patcher.on_undo(lambda: rec.state.pop("torch", None))


def _stream_new(orig):
    # torch.cuda.Stream() hands out streams of a pool (created all at once, which is all its
    # creation callback reports): name a stream when the program first asks for it, in that
    # order (s1, s2, ...), and keep the id of a pool stream handed out again.
    def __new__(cls, *args, **kwargs):
        stream = orig(cls, *args, **kwargs)
        rec = _recording()
        if rec is not None and stream.cuda_stream not in (0, 1, 2):
            rec.register_stream(stream.cuda_stream, rec.site())
        return stream
    return staticmethod(__new__)


def _stream_query(orig):
    # No GPU-trace callback reports a query; what it returned decides whether it ordered anything.
    def query(self):
        rec = _recording()
        if rec is None:
            return orig(self)
        return rec.stream_query(self, lambda: orig(self))
    return forwarding(orig, query)


def _event_query(orig):
    def query(self):
        rec = _recording()
        if rec is None:
            return orig(self)
        # torch reports events by handle; a never-recorded event has none yet (0) and orders nothing.
        return rec.event_query(self.cuda_event, lambda: orig(self))
    return forwarding(orig, query)


def _empty_cache(orig):
    def empty_cache(*args, **kwargs):
        rec = _recording()
        result = orig(*args, **kwargs)
        if rec is not None and not R.depth():
            # It gives the cached segments back with cudaFree, which waits for every stream's
            # pending work (measured, docs/cuda-rules.md (b)); no edge: CUDA's docs promise no
            # ordering, and with nothing cached nothing is freed. It is a device-wide wait's cost.
            rec.implicit("torch.cuda.empty_cache(): cudaFree of the cached blocks waits for every stream's pending "
                         "work (a device-wide wait; not an edge: CUDA's docs promise no ordering)")
        return result
    return forwarding(orig, empty_cache)


# --- synchronizations a proof rerun skips ------------------------------------------------
# torch's callbacks report a sync after it ran, so the sync audit's proof rerun
# (Recorder.skipped) decides at the Python entry point instead. A call that is made is still
# recorded by its callback, as in any recording; a skipped one makes no callback. Syncs torch
# makes inside C++ (`.item()`, `.cpu()`, `nonzero()`) pass no Python entry point: they stay
# unskippable, and the proof names them.

def _synchronize_device(rec, device=None):
    return _device_sync_op(rec)


def _synchronize_stream(rec, stream):
    return _stream_sync_op(rec, stream.cuda_stream)


def _synchronize_event(rec, event):
    # An event never recorded has no handle yet (0): torch returns at once and reports nothing.
    return _event_sync_op(rec, event.cuda_event) if event.cuda_event else None


def _wait_event(rec, event, stream=None):
    # `wait_stream` and `Stream.wait_event` end here (`event.wait(self)`); None: the current stream.
    if not event.cuda_event:
        return None
    return _wait_op(rec, event.cuda_event, current_stream_ptr(rec.gpu.torch) if stream is None else stream.cuda_stream)


def _skippable(make_op):
    """Wrap a sync so that a proof rerun whose edits skip it does not make the call (and issues
    its replacement, when the audit gave one); `make_op(rec, *args)`: the trace record the
    callback would make, or None when the call synchronizes nothing."""
    def wrap(orig):
        def call(*args, **kwargs):
            rec = _recording()
            if rec is None or rec.edits is None or getattr(_deciding, "inside", False):
                return orig(*args, **kwargs)
            op = make_op(rec, *args, **kwargs)
            if op is not None and rec.skipped(op):
                return None
            # One decision per call: an entry point reached from inside another (wait_stream's
            # Event.wait, or a method wrapped twice) must not count the same occurrence again.
            _deciding.inside = True
            try:
                return orig(*args, **kwargs)
            finally:
                _deciding.inside = False
        return forwarding(orig, call)
    return wrap


_deciding = threading.local()  # .inside: this thread is in a call a proof rerun already decided


def patches() -> tuple:
    """torch reports streams, events, syncs and memory through its callbacks; the names of the
    streams the program creates, the queries (which no callback reports) and the skipping of a
    proof rerun's syncs come from here."""
    from .patching import Patch

    return (Patch("torch.cuda.streams.Stream.__new__", _stream_new),
            Patch("torch.cuda.streams.Stream.query", _stream_query),
            Patch("torch.cuda.streams.Event.query", _event_query),
            Patch("torch.cuda.memory.empty_cache", _empty_cache, also=("torch.cuda.empty_cache",)),
            Patch("torch.cuda.synchronize", _skippable(_synchronize_device)),
            Patch("torch.accelerator.synchronize", _skippable(_synchronize_device)),
            Patch("torch.cuda.streams.Stream.synchronize", _skippable(_synchronize_stream)),
            Patch("torch.cuda.streams.Event.synchronize", _skippable(_synchronize_event)),
            Patch("torch.cuda.streams.Event.wait", _skippable(_wait_event)))
