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

Sizes are rounded up to 512 bytes, as the real allocator's small blocks are; a block is reused
only for a request of the same rounded size (the real allocator splits larger blocks; exact
sizes keep reuse predictable and are what repeated steps of a program ask for).
"""
from __future__ import annotations

from typing import Optional

import numpy as np


_ROUND = 512
_BYTES = np.dtype(np.uint8)


def rounded(nbytes: int) -> int:
    return max(_ROUND, (nbytes + _ROUND - 1) // _ROUND * _ROUND)


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

    def __init__(self, device):
        self.device = device
        self._free: dict = {}  # (device index, stream id, pool, nbytes) -> [Block, ...] ready for reuse
        self._deferred: list = []  # (Block, [events]) freed after record_stream: reusable once every event passed
        self._dead: list = []  # blocks whose last tensor died since the last collect()
        self._busy = 0  # inside allocate/collect: a death now only queues
        self.allocated = {}  # device index -> bytes in live blocks
        self.reserved = {}  # device index -> bytes in all blocks, cached ones included
        self.peak_allocated = {}
        self.peak_reserved = {}
        self.live = 0

    # --- handing out ----------------------------------------------------------------------
    def allocate(self, nbytes: int, stream, pool=None, name: str = "torch tensor") -> Block:
        """A block of at least `nbytes` for work on device stream `stream`."""
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
        if reused is not None and pool is not None:
            buffer = reused.buffer  # a graph pool's block is never freed: the same buffer, a new owner
        elif reused is not None:
            # Handed out on the host from `stream`'s pool: a use of these bytes still pending on another
            # stream that neither orders before this is the FREE race (core.trace.Free).
            buffer = self.device.alloc((size,), _BYTES, name=name, device=index, reuse=reused.buffer, stream=stream)
        else:
            buffer = self.device.alloc((size,), _BYTES, name=name, device=index, fill=0)
            self.reserved[index] = self.reserved.get(index, 0) + size
            self.peak_reserved[index] = max(self.peak_reserved.get(index, 0), self.reserved[index])
        block = Block(buffer, stream.id, pool, index, reused.views if reused is not None else None)
        self.allocated[index] = self.allocated.get(index, 0) + size
        self.peak_allocated[index] = max(self.peak_allocated.get(index, 0), self.allocated[index])
        block.entry = (buffer, stream, pool, block.used_on, index, block.views)
        block.allocator = self
        return block

    def release(self, block) -> None:
        """Free `block` now, whatever still views it (`untyped_storage().resize_(0)`)."""
        if block.allocator is None:
            return
        block.allocator = None
        self._dead.append(block.entry)
        self.collect()

    def _died(self, entry) -> None:
        """The last tensor on a block died. Outside any device call (the usual case: `del x`, a
        temporary dropped at the end of a statement) the free is recorded now, at the user's
        line; inside one (a cycle collected mid-call) it waits for the next entry point."""
        self._dead.append(entry)
        if not self._busy and not self.device._lock._is_owned():
            self.collect()

    def _take(self, key) -> Optional[Block]:
        ready = self._free.get(key)
        if not ready and self._deferred:
            self._settle_deferred()
            ready = self._free.get(key)
        return ready.pop() if ready else None

    def _settle_deferred(self) -> None:
        """Blocks freed after record_stream whose events have all passed become reusable (torch
        queries the events when it looks for a block; a query that says done orders the host)."""
        waiting = []
        for entry in self._deferred:
            block, events = entry
            if all(event.query() for event in events):
                self.device.free(block.buffer, self.device._stream_objects[block.stream])
                self._file(block)
            else:
                waiting.append(entry)
        self._deferred = waiting

    def _file(self, block) -> None:
        self._free.setdefault((block.device_index, block.stream, block.pool, block.buffer.nbytes), []).append(block)

    # --- giving back ----------------------------------------------------------------------
    def collect(self) -> None:
        """Record the frees of blocks whose tensors died since the last call."""
        if not self._dead:  # the usual case, at every entry point of the emulation
            return
        self._busy += 1
        try:
            self._collect()
        finally:
            self._busy -= 1

    def _collect(self) -> None:
        while self._dead:
            buffer, stream, pool, used_on, index, views = self._dead.pop(0)
            self.allocated[index] -= buffer.nbytes
            block = _Returned(buffer, stream.id, pool, index, views)
            if pool is not None:
                # A graph's block stays the graph's: its replays write it, so it is never freed; only
                # a capture into the same pool gets it again (torch.cuda.graph(pool=...)).
                self._file(block)
                continue
            if used_on:
                # record_stream: torch records an event on each stream that used the block and frees
                # it only once a query says every one has passed; that query orders the free.
                events = []
                for other in used_on:
                    event = self.device.event(name="record_stream")
                    event.record(other)
                    events.append(event)
                self._deferred.append((block, events))
            else:
                self.device.free(buffer, stream)  # ordered on the block's stream, as the allocator's reuse is
                self._file(block)

    def empty_cache(self) -> None:
        """Cached blocks go back to the device (torch.cuda.empty_cache): they are never reused."""
        self.collect()
        for key, blocks in list(self._free.items()):
            if key[2] is None:
                self.reserved[key[0]] = self.reserved.get(key[0], 0) - sum(b.buffer.nbytes for b in blocks)
                del self._free[key]


class _Returned:
    """A freed block waiting in a pool: its bytes and where it may be handed out again."""

    __slots__ = ("buffer", "stream", "pool", "device_index", "views")

    def __init__(self, buffer, stream: int, pool, device_index: int, views):
        self.buffer = buffer
        self.views = views
        self.stream = stream
        self.pool = pool
        self.device_index = device_index

