"""torch's CUDA caching allocator, emulated on the sim with its reuse rule.

A block is a sim buffer of bytes, filed under the stream it was allocated on. When the last
tensor on it dies, the block goes back to that stream's pool at once (safe by stream order, as
torch assumes) and the next allocation of a fitting size *on that stream* gets the same bytes:
work still pending on another stream that reads or writes them races with the new owner, and
its values really are clobbered. `tensor.record_stream(s)` defers the reuse as torch does: the
free records an event on every such stream, and the block is handed out again only once a
query says every event has passed (torch's `process_events`); that query is the host's
synchronization, so the later reuse is ordered after the other stream's work.

Blocks allocated while a stream captures a CUDA graph belong to the graph's private pool
(shared by graphs captured with `pool=`): only captures into that pool reuse them, never
eager allocations, because a replay writes them again.

Sizes are rounded up to 512 bytes, as torch rounds them; a block is reused only for a request of
the same rounded size (the real allocator splits larger blocks; exact sizes keep reuse predictable
and are what repeated steps of a program ask for).

Device memory is reserved as torch reserves it (cudaMalloc'd segments), which is what
`memory_reserved()` and the out-of-memory check see: requests up to 1 MiB come from the small
pool's 2 MiB segments, larger ones under 10 MiB from 20 MiB segments, the rest from a segment of
their size rounded up to 2 MiB; a segment serves the blocks of one stream and pool, and goes back
to the device at `empty_cache()` once none of its blocks is in use. The device holds `capacity`
bytes (times `set_per_process_memory_fraction`'s fraction): a segment that does not fit is
retried after the cache is emptied (its deferred frees synchronized), as torch retries, then
refused with torch's OutOfMemoryError and message; nothing of the request was allocated on the
host by then. memory_stats.py names the counters.
"""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import torch

from ..core.trace import RECORD_STREAM_EVENT
from ..timeout import OWN_THREADS
from .memory_stats import DeviceStats, out_of_memory_message

_ROUND = 512
_BYTES = np.dtype(np.uint8)
SMALL_SIZE = 1 << 20  # torch's kSmallSize: requests up to this come from the small pool
SMALL_SEGMENT = 2 << 20  # kSmallBuffer
LARGE_SEGMENT = 20 << 20  # kLargeBuffer: the segment of a large request under kMinLargeAlloc
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20  # kRoundLarge
ONE_EXABYTE = 1 << 60  # torch refuses larger requests before it looks for memory


def rounded(nbytes: int) -> int:
    return max(_ROUND, (nbytes + _ROUND - 1) // _ROUND * _ROUND)


def segment_size(size: int) -> int:
    """The bytes torch's allocator reserves (cudaMalloc) for a request of `size` rounded bytes that no
    cached memory serves."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class Segment:
    """Reserved device memory (one cudaMalloc) that blocks are carved from: `room` bytes are not
    carved yet; `busy` counts its blocks in use (allocated, or freed while record_stream's events
    are pending). Only a segment none of whose blocks is busy goes back at empty_cache."""

    __slots__ = ("key", "small", "size", "room", "busy")

    def __init__(self, key, size: int):
        self.key = key  # (device index, stream id, pool, small)
        self.small = key[3]
        self.size = size
        self.room = size
        self.busy = 0


class Block:
    """One allocation: its sim buffer and the numpy bytes under it, the stream (id) it is
    filed under, the graph pool it belongs to (None: eager), and the streams that
    `record_stream` added. Tensors hold their block; pending work holds only the bytes."""

    __slots__ = ("buffer", "bytes", "stream", "pool", "used_on", "device_index", "allocator", "entry", "views")

    def __init__(self, buffer, stream: int, pool, device_index: int, views=None):
        self.buffer = buffer
        self.views = {} if views is None else views  # dtype -> a CPU tensor over all the bytes (kept across owners)
        self.bytes = buffer.storage  # the sim keeps a buffer's numpy bytes as its storage
        self.stream = stream
        self.pool = pool
        self.used_on: list = []  # device streams of record_stream calls
        self.device_index = device_index
        self.allocator = None  # told when the last tensor on the block dies (None: freed already)
        self.entry = None

    def __del__(self):
        # Cheaper than weakref.finalize, and a block dies once per tensor operator's temporary.
        allocator = self.allocator
        if allocator is not None:
            allocator._died(self.entry)


class CachingAllocator:
    """Blocks for one emulated run. `collect()` must run at every entry point of the emulation
    before it touches the device: tensors die wherever Python's reference counting says,
    possibly inside another device call, so a death only queues its block and the free is
    recorded at the next entry point (the host order CUDA would see it in, at the latest)."""

    def __init__(self, device, capacity: int):
        self.device = device
        self.capacity = capacity  # bytes of each emulated device
        self.fractions: dict = {}  # device index -> set_per_process_memory_fraction's fraction
        self._free: dict = {}  # (device index, stream id, pool, nbytes) -> [Block, ...] ready for reuse
        self._deferred: list = []  # (Block, [events]) freed after record_stream: reusable once every event passed
        self._dead: list = []  # blocks whose last tensor died since the last collect()
        self._busy = 0  # inside allocate/collect: a death now only queues
        self._open: dict = {}  # (device index, stream id, pool, small) -> [Segment with room]
        self._segments: list = []  # every reserved segment
        self._stats: dict = {}  # device index -> DeviceStats
        self.pool_users: dict = {}  # graph pool -> how many graphs hold it (its segments stay while any does)
        self.closed = False

    def stats(self, index: int) -> DeviceStats:
        found = self._stats.get(index)
        if found is None:
            found = self._stats[index] = DeviceStats()
        return found

    def reserved(self, index: int) -> int:
        return self.stats(index).current("reserved_bytes")

    def free_memory(self, index: int) -> int:
        """cudaMemGetInfo's free bytes: the device's capacity less what this process reserved."""
        return self.capacity - self.reserved(index)

    # --- handing out ----------------------------------------------------------------------
    def allocate(self, nbytes: int, stream, pool=None, name: str = "torch tensor") -> Block:
        """A block of at least `nbytes` for work on device stream `stream`."""
        if nbytes >= ONE_EXABYTE:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.")
        with self.device._lock:  # host threads allocate one at a time, as the real allocator's mutex makes them
            self.collect()
            self._busy += 1
            try:
                return self._allocate(nbytes, stream, pool, name)
            finally:
                self._busy -= 1

    def _allocate(self, nbytes: int, stream, pool, name: str) -> Block:
        size = rounded(nbytes)
        index = stream.device_index
        key = (index, stream.id, pool, size)
        reused = self._take(key)
        if reused is not None:
            segment = reused.segment
            segment.busy += 1
        else:
            segment = self._carve(index, stream.id, pool, size)
        if reused is not None and pool is not None:
            buffer = reused.buffer  # a graph pool's block is never freed: the same buffer, a new owner
        elif reused is not None:
            # Handed out on the host from `stream`'s pool: a use of these bytes still pending on another
            # stream that neither orders before this is the FREE race (core.trace.Free).
            buffer = self.device._alloc_reused(reused.buffer, name, stream)
        else:
            buffer = self.device.alloc((size,), _BYTES, name=name, device=index, fill=0)
        block = Block(buffer, stream.id, pool, index, reused.views if reused is not None else None)
        self.stats(index).changed(segment.small, (("allocation", 1), ("allocated_bytes", size), ("active", 1),
                                                  ("active_bytes", size), ("requested_bytes", nbytes)))
        block.entry = (buffer, stream, pool, block.used_on, index, block.views, segment, nbytes)
        block.allocator = self
        return block

    def _carve(self, index: int, stream_id: int, pool, size: int) -> Segment:
        """`size` bytes from a segment of the stream's pool with room, or from a new one."""
        small = size <= SMALL_SIZE
        key = (index, stream_id, pool, small)
        open_segments = self._open.setdefault(key, [])
        segment = next((s for s in open_segments if s.room >= size), None)
        if segment is None:
            segment = self._reserve(key, size)
            open_segments.append(segment)
        segment.room -= size
        segment.busy += 1
        if segment.room < _ROUND:
            open_segments.remove(segment)
        return segment

    def _reserve(self, key, size: int) -> Segment:
        """A new segment (cudaMalloc) for a request of `size`: when the device has no room, the
        cached blocks go back first and the reservation is retried, as torch does; then torch's
        out-of-memory error."""
        index = key[0]
        wanted = segment_size(size)
        stats = self.stats(index)
        if not self._fits(index, wanted):
            # During a capture torch frees only what needs no synchronization (a capture forbids it).
            self._release_cached(wait=not self.device.capture_tracker.active)
            stats.count("num_alloc_retries")
            if not self._fits(index, wanted):
                stats.count("num_ooms")
                raise torch.OutOfMemoryError(self._out_of_memory(index, wanted))
        segment = Segment(key, wanted)
        self._segments.append(segment)
        stats.changed(segment.small, (("segment", 1), ("reserved_bytes", wanted)))
        stats.count("num_device_alloc")
        return segment

    def _limit(self, index: int) -> int:
        return int(self.capacity * self.fractions.get(index, 1.0))

    def _fits(self, index: int, nbytes: int) -> bool:
        return self.reserved(index) + nbytes <= self._limit(index)

    def _out_of_memory(self, index: int, alloc_size: int) -> str:
        stats = self.stats(index)
        fraction = self.fractions.get(index)
        in_private_pools = sum(block.buffer.nbytes for (i, _, pool, _), blocks in self._free.items()
                               if i == index and pool is not None for block in blocks)
        return out_of_memory_message(index, alloc_size, self.capacity, self.free_memory(index),
                                     self._limit(index) if fraction is not None else None,
                                     stats.current("allocated_bytes"), stats.current("reserved_bytes"),
                                     in_private_pools)

    def release(self, block) -> None:
        """Free `block` now, whatever still views it (`untyped_storage().resize_(0)`)."""
        with self.device._lock:
            if block.allocator is None:
                return
            block.allocator = None
            self._dead.append(block.entry)
            self.collect()

    def _died(self, entry) -> None:
        """The last tensor on a block died. Outside any device call (the usual case: `del x`, a
        temporary dropped at the end of a statement) the free is recorded now, at the user's
        line; inside one (a cycle collected mid-call) it waits for the next entry point."""
        if self.closed:  # a tensor that outlived its run (a cache, a module attribute): nothing to record
            return
        self._dead.append(entry)
        # A death in one of streamcheck's own threads (a time limit's watchdog, where Python's cycle
        # collector happened to run) is the program's: recorded at its next call, at its line.
        if not self._busy and not self.device._lock._is_owned() and \
                not threading.current_thread().name.startswith(OWN_THREADS):
            self.collect()

    def _take(self, key) -> Optional["_Returned"]:
        ready = self._free.get(key)
        if not ready and self._deferred:
            self._settle_deferred()
            ready = self._free.get(key)
        return ready.pop() if ready else None

    def _settle_deferred(self, wait: bool = False) -> None:
        """Blocks freed after record_stream whose events have all passed become reusable (torch
        queries the events when it looks for a block; a query that says done orders the host).
        `wait`: the host synchronizes with every event first (torch's synchronize_and_free_events)."""
        waiting = []
        for entry in self._deferred:
            block, events = entry
            if wait:
                for event in events:
                    event.synchronize()
            if wait or all(event.query() for event in events):
                self.device.free(block.buffer, self.device._stream_objects[block.stream])
                self._inactive(block)
                self._file(block)
            else:
                waiting.append(entry)
        self._deferred = waiting

    def _inactive(self, block) -> None:
        """A freed block no work may still use: no longer active, its segment's block not busy."""
        self.stats(block.device_index).changed(block.segment.small,
                                               (("active", -1), ("active_bytes", -block.buffer.nbytes)))
        block.segment.busy -= 1

    def _file(self, block) -> None:
        self._free.setdefault((block.device_index, block.stream, block.pool, block.buffer.nbytes), []).append(block)

    def close(self) -> None:
        """The run ended: blocks whose tensors die later (at exit, in a cache) are not recorded."""
        self.collect()
        self.closed = True

    # --- giving back ----------------------------------------------------------------------
    def collect(self) -> None:
        """Record the frees of blocks whose tensors died since the last call."""
        if not self._dead:  # the usual case, at every entry point of the emulation
            return
        with self.device._lock:
            self._busy += 1
            try:
                self._collect()
            finally:
                self._busy -= 1

    def _collect(self) -> None:
        while self._dead:
            buffer, stream, pool, used_on, index, views, segment, requested = self._dead.pop(0)
            self.stats(index).changed(segment.small, (("allocation", -1), ("allocated_bytes", -buffer.nbytes),
                                                      ("requested_bytes", -requested)))
            block = _Returned(buffer, stream.id, pool, index, views, segment)
            if pool is not None:
                # A graph's block stays the graph's: its replays write it, so it is never freed; only
                # a capture into the same pool gets it again (torch.cuda.graph(pool=...)).
                self._inactive(block)
                self._file(block)
                continue
            if used_on:
                # record_stream: torch records an event on each stream that used the block and frees
                # it only once a query says every one has passed; that query orders the free.
                events = []
                for other in used_on:
                    event = self.device.event(name=RECORD_STREAM_EVENT)
                    event.record(other)
                    events.append(event)
                self._deferred.append((block, events))
            else:
                self.device._free_block(buffer, stream)  # ordered on the block's stream, as the allocator's reuse is
                self._inactive(block)
                self._file(block)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache: segments none of whose blocks is in use go back to the device
        (their cached blocks are never reused); blocks waiting for record_stream's events are
        waited for first."""
        with self.device._lock:
            self.collect()
            self._release_cached()

    def _release_cached(self, wait: bool = True) -> None:
        """torch's release_cached_blocks: the host synchronizes with the pending record_stream
        events (`wait`), then every segment with no block in use is released, except those of graph
        pools a graph still holds."""
        if wait:
            for index in range(self.device.devices):
                self.stats(index).count("num_sync_all_streams")
            self._settle_deferred(wait=True)
        held = {pool for pool, users in self.pool_users.items() if users > 0}
        released = [s for s in self._segments if s.busy == 0 and s.key[2] not in held]
        if not released:
            return
        gone = set(map(id, released))
        for key, blocks in list(self._free.items()):
            kept = [b for b in blocks if id(b.segment) not in gone]
            if kept:
                self._free[key] = kept
            else:
                del self._free[key]
        for segment in released:
            stats = self.stats(segment.key[0])
            stats.changed(segment.small, (("segment", -1), ("reserved_bytes", -segment.size)))
            stats.count("num_device_free")
            open_segments = self._open.get(segment.key)
            if open_segments and segment in open_segments:
                open_segments.remove(segment)
        self._segments = [s for s in self._segments if id(s) not in gone]


class _Returned:
    """A freed block waiting in a pool: its bytes, where it may be handed out again, its segment."""

    __slots__ = ("buffer", "stream", "pool", "device_index", "views", "segment")

    def __init__(self, buffer, stream: int, pool, device_index: int, views, segment):
        self.buffer = buffer
        self.views = views
        self.stream = stream
        self.pool = pool
        self.device_index = device_index
        self.segment = segment
