"""The recorder: "this library call touched these bytes on this stream" becomes trace records,
fed to the happens-before checker as they happen.

One recorder serves every library adapter (streamcheck/record/adapters/). It owns what the trace
needs and no library provides: small ids for streams, events, buffers and host threads;
the allocation table that maps a device pointer to (buffer, byte offset); frees, ordered on
the stream that allocated the bytes; the user's call site of each operation; delay
injection at chosen launches. What it needs from the GPU library it asks a `Gpu` (below),
so the recorder runs and is tested on the CPU with fakes.

Threading: library calls may come from several host threads, and CuPy's finalizers may run
inside any of them. One re-entrant lock guards the tables and the checker; a free that
arrives while the lock is held (a finalizer run by the garbage collector mid-update) is
deferred until the update is done.
"""
from __future__ import annotations

import bisect
import os
import threading
import weakref
from typing import Optional, Protocol

from . import gpu as _gpu
from . import kernel_access
from ..core import trace as T
from ..core.fast import new_checker, untrack
from ..core.hb import Checker, TraceError, format_hazards, format_report
from ..core.schedule import graph_delay_name, seed_delays
from .gpu import thread_state as _state
from ..core.trace import UNKNOWN_SITE, CallSite, CaptureMode, CopyKind, Range, SiteResolver, StreamKind

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # streamcheck/, all of it
# What the sync audit's proof rerun can skip at the call (Recorder.skipped); queries never are.
_SYNC_OPS = (T.StreamWait, T.StreamSync, T.EventSync, T.DeviceSync)

current: Optional["Recorder"] = None  # the recording adapters feed; set by activate()


class Gpu(Protocol):
    """What the recorder asks of the GPU library beneath the adapters (CuPy today:
    streamcheck/record/adapters/cupy_device.py). Streams and arrays are the library's own objects."""

    library_dirs: tuple  # frames in these directories are the library's, never the user's call site

    def current_stream(self): ...

    def stream_ptr(self, stream) -> int: ...  # cudaStream_t of a stream object (raises TypeError if none)

    def stream_kind(self, ptr: int) -> StreamKind: ...  # from cudaStreamGetFlags; NON_BLOCKING if unknown

    def is_capturing(self, stream) -> bool: ...  # True also when CUDA cannot tell (invalidated capture)

    def spin(self, stream, us: float) -> None: ...  # a bounded spin kernel on `stream`, now

    def is_array(self, obj) -> bool: ...  # a device array whose bytes can be named

    def array_span(self, obj) -> Optional[tuple]: ...  # (start, stop) device addresses; None if empty

    def driver_range(self, ptr: int) -> Optional[tuple]: ...  # (base, size) of the cudaMalloc holding ptr

    def capture_mode(self, value) -> CaptureMode: ...  # the library's capture-mode argument; ValueError if unknown


def depth() -> int:
    return _state.depth


def allocation_name(what: str, size: int) -> str:
    """The name of a pool's allocation in reports, `{id}` standing for its buffer id."""
    return what + " #{id}" + f" ({size} bytes)"


def acting_ident() -> int:
    """The ident of the host thread whose work is being recorded: the calling thread's, or the one a drain of
    the native observer's records acts as (gpu.thread_state.acting)."""
    return _state.acting or threading.get_ident()


def inside(call, *args, **kwargs):
    """Run a library call on the program's behalf: what it calls in turn is part of it, not
    recorded again."""
    state = _state
    state.depth += 1
    pause = _gpu.native_pause
    if pause is not None:
        pause(1)
    try:
        return call(*args, **kwargs)
    finally:
        state.depth -= 1
        if pause is not None:
            pause(-1)


def format_capture_errors(errors) -> str:
    """The stream-capture errors the checker collected (capture.CaptureError: CUDA's error
    name and streamcheck's explanation), as printed after the race reports."""
    if not errors:
        return ""
    head = (f"streamcheck: {len(errors)} stream-capture error{'s' if len(errors) != 1 else ''} "
            "(calls CUDA refuses during graph capture; the program got CUDA's own error from the library)")
    blocks = [head]
    for error in errors:
        text, prefix = str(error), f"{error.code}: "
        blocks.append(f"capture error {error.code}\n  {text[len(prefix):] if text.startswith(prefix) else text}")
    return "\n\n".join(blocks)


def captured_work(ops, origin: int) -> tuple:
    """(kernel names, buffer ids) of what a capture begun on stream `origin` holds, from the
    trace slice that starts at its CaptureBegin: the origin and every stream that waited on an
    event recorded by a member are members. Names are for delay targeting (`--delay-kernel
    NAME` delays the launches of graphs holding NAME), buffers for their lifetime (memory a
    graph's nodes use lives as long as the graph); the checker keeps its own account."""
    members, marked, names, buffers = {origin}, set(), {}, set()
    for op in ops:
        kind = type(op)
        if kind is T.EventRecord:
            if op.stream in members:
                marked.add(op.event)
            else:
                marked.discard(op.event)
        elif kind is T.StreamWait:
            if op.event in marked:
                members.add(op.stream)
        elif kind is T.CaptureEnd and op.stream == origin:
            break
        elif kind is T.Launch and op.stream in members:
            names[op.name] = None
            buffers.update(r.buffer for r in op.reads + op.writes)
        elif kind is T.Copy and op.stream in members:
            names[op.name] = None
            buffers.update(r.buffer for r in (op.src, op.dst) if r is not None)
    return tuple(names), frozenset(buffers)


class _Alloc:
    __slots__ = ("id", "start", "size", "stop", "stream", "serial", "thread", "external", "ranges", "name", "pool",
                 "also", "host_events")

    def __init__(self, id, start, size, stream, serial, thread, external, name, pool=""):
        self.id = id
        self.start = start
        self.size = size
        self.stop = start + size
        self.stream = stream
        self.serial = serial
        self.thread = thread
        self.external = external
        self.ranges: dict = {}  # (start, stop) -> Range, reused across calls
        self.name = name
        self.pool = pool  # the allocator ("cupy", "torch"), for the report's fix
        self.also: tuple = ()  # streams record_stream marked it as used on (torch)
        self.host_events: list = []  # a pinned block's: events recorded after the copies that used it


class Recorder:
    """One recording: the trace, the checker, and the maps from library objects to trace ids.

    delay_us > 0 spins that long before each launch, copy and graph launch on the targeted
    streams: those named in `delay_streams` ("all" for every one), else those `seed` picks
    (schedule.seed_delays, the sim's rule); `delay_kernels` narrows it to those launches."""

    def __init__(self, gpu: Gpu, *, delay_us: float = 0.0, delay_streams=(), delay_kernels=(), seed: int = 0,
                 check: bool = True, strict_free: bool = False):
        self.gpu = gpu
        # A free is a race only once an allocation gets its bytes too early (core.trace.Free): the
        # pools' allocations are seen by address, so the one that gets freed bytes is known.
        self.strict_free = strict_free
        self._trace = T.Trace()
        # Records issued but not in the trace yet (the native operator observer's buffer): a function
        # that records them, called before anything else is recorded or read (flush).
        self.pending = None
        self._flushing = False
        self.reading = False  # inside a blocking host read, which records its own StreamSync
        self.edits = None  # the sync audit's proof rerun (analyses.sync_audit.SyncEdits): syncs to skip
        self._decided = None  # the sync op a skip-capable call already put to `edits`
        self._replacement_events: dict = {}  # stream id -> (driver event, its trace id) the replacements record
        self._checker: Optional[Checker] = new_checker() if check else None
        self._checked = None  # with defer_checks(): how many trace records the checker has seen
        self.errors: list = []  # internal problems while recording (never raised into the program)
        self.refused: list = []  # (trace index, record, TraceError) the checker refused: a race can hide there
        self.unpatched: list = []  # entry points an adapter could not wrap in this library version
        self.notices: list = []  # what is not checked and why, said once
        self.state: dict = {}  # per library adapter ("torch": ...): what it keeps for this recording
        self.thread_contexts: list = []  # factories of context managers a new host thread enters (torch's mode)
        self.delay_us = float(delay_us)
        self.delay_streams = frozenset(delay_streams)
        self.delay_kernels = frozenset(delay_kernels)
        self.seed = seed
        self.delays = 0  # spins injected
        self.probe = None  # confirm_gpu.Probe of a race-confirmation rerun (streamcheck run --confirm)
        self.intercepts = bool(self.delay_us)  # something runs before each issue: a spin or the probe
        self._lock = threading.RLock()
        self._threads: dict = {threading.get_ident(): 0}
        self._next_thread = 1
        self._streams: dict = {}  # key (ptr, or (2, thread) for per-thread) -> stream id
        self._stream_names: dict = {}  # stream id -> short name (delay targeting)
        self._delayed: dict = {}  # stream id -> targeted by the delay (cache)
        self._aliases: dict = {}  # stream id -> more names delays target it by
        self._next_stream = 1
        self._named_streams = 0
        self._events = weakref.WeakKeyDictionary()
        self._event_handles: dict = {}  # cudaEvent_t -> event id (libraries that report handles)
        self._next_event = 1
        # Program events are named by their own count (event1, event2, ...): a proof rerun's
        # replacement events take ids too, and the audit's keys name events as the recorded run did.
        self._named_events = 0
        self._starts: list = []  # sorted allocation starts
        self._allocs: list = []  # _Alloc in the same order
        self._pool_at: dict = {}  # start -> the live allocation there that is not external (allocation_at)
        self._next_buffer = 1
        self._alloc_serial = 0
        self._deferred: list = []  # frees that arrived while the lock was held: (alloc, thread, site)
        self._freed_starts: list = []  # sorted starts of freed pool bytes not handed out again (never overlapping)
        self._freed: list = []  # (start, stop, buffer id, the buffer's start) in the same order
        self._unmapped: Optional[int] = None  # pseudo-buffer of absolute addresses (last resort)
        self._graph_held: dict = {}  # buffer id -> graphs alive whose nodes use it
        self._freed_while_held: dict = {}  # buffer id -> (alloc, thread, site) of a free a graph defers
        # the user's line: the first frame outside streamcheck and the libraries (the Gpu's among them)
        self.site = SiteResolver((_PACKAGE_DIR + os.sep,), libraries=(d + os.sep for d in gpu.library_dirs))
        self._signatures: dict = {}
        self._next_graph = 1
        self._capture_origin: dict = {}  # stream id -> (graph id, trace index of its CaptureBegin)
        self._append = self._trace.ops.append
        self._feed = self._checker.feed if self._checker is not None else None
        self.record(T.StreamCreate(0, self.site(), stream=0, kind=StreamKind.LEGACY, name="legacy default stream"))
        self._streams[0] = 0
        self._stream_names[0] = "legacy"

    @property
    def trace(self) -> T.Trace:
        """Every record so far (those the native observer holds included)."""
        if self.pending is not None:
            self.flush()
        return self._trace

    def flush(self) -> None:
        """Record what `pending` holds, in issue order, before what comes next."""
        if self.pending is None or self._flushing:
            return
        with self._lock:
            if self._flushing or self.pending is None:
                return
            self._flushing = True
            try:
                self.pending()
            finally:
                self._flushing = False

    # --- activation ---------------------------------------------------------------------
    def activate(self) -> None:
        """Make this the recording the adapters feed (one at a time)."""
        global current
        current = self

    def deactivate(self) -> None:
        global current
        if current is self:
            current = None

    # --- results ------------------------------------------------------------------------
    @property
    def checker(self) -> Optional[Checker]:
        """The happens-before checker, having seen every record so far (None: checking is off)."""
        if self._checked is not None:
            self.check_now()
        return self._checker

    def defer_checks(self) -> None:
        """Feed the checker at host synchronizations (and when results are read) instead of at
        each record: the program's thread issues its GPU work sooner, and the check runs while
        the GPU catches up (measured in docs/benchmarks.md). Not with a probe, which needs each
        record checked as it is issued."""
        if self._checker is not None and self.probe is None and self._checked is None:
            with self._lock:
                self._checked = len(self.trace)
                self._feed = None

    def check_now(self) -> None:
        """Feed the checker what defer_checks held back."""
        with self._lock:
            ops, feed = self.trace.ops, self._checker.feed
            while self._checked < len(ops):
                op = ops[self._checked]
                self._checked += 1
                try:
                    feed(op)
                except TraceError as exc:  # as record() keeps it
                    self.refuse(op, exc, self._checked - 1)

    @property
    def races(self) -> list:
        return self.checker.races if self.checker is not None else []

    @property
    def hazards(self) -> list:
        """Frees with a use pending on another stream that no allocation got (core.hb.Hazard)."""
        return self.checker.hazards if self.checker is not None else []

    @property
    def capture_errors(self) -> list:
        """What CUDA refuses during stream capture (capture.CaptureError), as the checker saw it."""
        return list(self.checker.capture_errors) if self.checker is not None else []

    @property
    def findings(self) -> int:
        """Races plus capture errors: what `streamcheck run --error-exitcode` counts."""
        return len(self.races) + len(self.capture_errors)

    @property
    def streams(self) -> dict:
        """stream id -> short name ("legacy", "s1", ..., "ptds<thread>", "torch")."""
        return dict(self._stream_names)

    def report(self, width: Optional[int] = None) -> str:
        """Races, capture errors, notices and internal errors; race lines wrapped at `width`."""
        lines = [format_report(self.races, width=width)]
        if self.hazards:
            lines.append(format_hazards(self.hazards, width=width))
        if self.capture_errors:
            lines.append(format_capture_errors(self.capture_errors))
        lines.extend(f"streamcheck: note: {text}" for text in self.notices)
        if self.errors:
            lines.append(f"streamcheck: {len(self.errors)} internal error(s) while recording (the program was "
                         f"not affected); first: {self.errors[0]}")
        return "\n".join(lines)

    def summary(self) -> str:
        delay = (f"delay {self.delay_us:g} µs on "
                 f"{'+'.join(sorted(self.delay_streams)) or 'seed-chosen streams'} ({self.delays} spins)"
                 if self.delay_us else "no injected delay")
        return (f"streamcheck: recorded {len(self.trace)} operations on {len(self._stream_names)} stream(s), "
                f"{self._next_thread} host thread(s); {delay}; seed {self.seed}")

    def notice(self, text: str) -> None:
        """Say once what is not checked and why (a library version, an object not understood)."""
        if text not in self.notices:
            self.notices.append(text)

    # --- recording core -----------------------------------------------------------------
    def record(self, op) -> None:
        with self._lock:
            if self.pending is not None and not self._flushing:
                self.flush()  # under the lock: no other thread's record comes between
            edits = self.edits
            if edits is not None:
                if op is not self._decided and type(op) in _SYNC_OPS:
                    edits.recorded_anyway(op)  # reported after it ran (torch's callbacks): not skippable
                edits.see(op)
            self._append(op)
            untrack(op)  # frozen and acyclic: the GC need not walk the trace (core.fast.untrack)
            if self._feed is not None:
                try:
                    self._feed(op)
                except TraceError as exc:  # a trace we built wrong: keep the program running
                    self.refuse(op, exc)
            if self.probe is not None:
                self.probe.issued(self, op)
        if self._deferred and not self._lock._is_owned():
            self._drain_frees()

    def refuse(self, op, exc: TraceError, index: Optional[int] = None) -> None:
        """The checker refused `op`, the trace's record at `index` (None: the last one): kept in the
        trace, the error said."""
        self.errors.append(str(exc))
        self.refused.append((len(self._trace.ops) - 1 if index is None else index, op, exc))

    def native_lane(self) -> Optional[tuple]:
        """What record() does for an operator, as tables a native drain can read under the lock
        (torch_native's): (live allocations by start, stream ids by pointer, thread ids by ident,
        the trace's records, the checker's feed or None, range_in, event ids by handle, name_event_handle,
        strict_free, and the allocation table as file() and unfile() change it: (the recorder, its sorted
        starts, its allocations in that order, the freed bytes' sorted starts, their (start, stop, buffer id,
        buffer start), the buffers graphs hold, the allocation type)), or None where each record must go
        through record() itself (an edit plan or a probe watches the records)."""
        if self.edits is not None or self.probe is not None:
            return None
        table = (self, self._starts, self._allocs, self._freed_starts, self._freed, self._graph_held, _Alloc)
        return (self._pool_at, self._streams, self._threads, self._trace.ops, self._feed, self.range_in,
                self._event_handles, self.name_event_handle, self.strict_free, table)

    def _drain_frees(self) -> None:
        while self._deferred:
            try:
                alloc, tid, site = self._deferred.pop(0)
            except IndexError:  # another thread drained it
                return
            self.free(alloc, tid, site)

    def tid(self) -> int:
        ident = _state.acting or threading.get_ident()  # acting_ident(), inline: this runs for every record
        tid = self._threads.get(ident)
        if tid is None:
            with self._lock:
                tid = self._next_thread
                self._next_thread += 1
                self._threads[ident] = tid
            # A thread we did not see start: unordered with everything (conservative).
            self.record(T.ThreadStart(tid, self.site(), parent=None))
        return tid

    def implicit(self, reason: str) -> None:
        """An implicit synchronization (lazy loading, pool growth): noted, never an edge."""
        self.record(T.ImplicitSync(self.tid(), self.site(), reason=reason))

    # --- streams and events -------------------------------------------------------------
    def stream_key(self, ptr: int):
        if ptr in (0, 1):  # null stream / cudaStreamLegacy
            return 0
        if ptr == 2:  # cudaStreamPerThread: one per host thread
            return (2, self.tid())
        return ptr

    def knows_stream(self, ptr: int) -> bool:
        return self.stream_key(ptr) in self._streams

    def register_stream(self, ptr: int, site: CallSite, fresh: bool = False, short: str = "") -> int:
        """The stream id of cudaStream_t `ptr`; `fresh`: a stream just created (its pointer may
        be one a destroyed stream had), `short`: the name delays target it by."""
        key = self.stream_key(ptr)
        with self._lock:
            if not fresh and key in self._streams:
                return self._streams[key]
            sid = self._next_stream
            self._next_stream += 1
            if ptr == 2:
                kind, short = StreamKind.PER_THREAD, f"ptds{key[1]}"
                label = f"per-thread default stream of thread {key[1]}"
            else:
                kind = self.gpu.stream_kind(ptr)
                if not short:
                    self._named_streams += 1
                    short = f"s{self._named_streams}"
                label = f"{short} (created at {site})" if site is not UNKNOWN_SITE else f"{short} (0x{ptr:x})"
            self._streams[key] = sid
            self._stream_names[sid] = short
        self.record(T.StreamCreate(self.tid(), site, stream=sid, kind=kind, name=label))
        return sid

    def sid(self, stream) -> int:
        """Trace id of a stream object, a raw pointer, or None (the library's current stream)."""
        if stream is None:
            stream = self.gpu.current_stream()
        ptr = stream if isinstance(stream, int) else getattr(stream, "ptr", None)
        if ptr is None:
            ptr = self.gpu.stream_ptr(stream)  # torch's, or another library's
        if ptr > 2:  # hot path: a stream the program created
            sid = self._streams.get(ptr)
            if sid is not None:
                return sid
        sid = self._streams.get(self.stream_key(ptr))
        if sid is None:
            sid = self.register_stream(ptr, UNKNOWN_SITE)
        return sid

    def eid(self, event) -> int:
        # Kept on the event object itself where it has a __dict__ (CuPy's Event does): cheaper
        # than a weak dictionary, and a new Event with a reused handle still gets a new id.
        tag = getattr(event, "_streamcheck_event", None)
        if tag is not None and tag[0] is self:
            return tag[1]
        with self._lock:
            eid, name = self._new_event()
        try:
            event._streamcheck_event = (self, eid)
        except AttributeError:  # an event type without a __dict__: look it up by identity
            tag = self._events.get(event)
            if tag is not None:
                return tag
            self._events[event] = eid
        self.record(T.EventCreate(self.tid(), self.site(), event=eid, name=name))
        return eid

    def event_handle(self, handle: int, fresh: bool = False) -> int:
        """The event id of a raw cudaEvent_t (torch reports events by handle); `fresh`: a new
        event (a destroyed one's handle may come back)."""
        if not fresh:
            eid = self._event_handles.get(handle)  # one dict read, atomic: a known handle needs no lock
            if eid is not None:
                return eid
        self.flush()  # events named in issue order: those the native observer holds first
        with self._lock:
            eid = self._event_handles.get(handle)
            if eid is not None and not fresh:
                return eid
            eid, name = self.name_event_handle(handle)
        self.record(T.EventCreate(self.tid(), self.site(), event=eid, name=name))
        return eid

    def name_event_handle(self, handle: int) -> tuple:
        """A new event for raw handle `handle` in the event table (event_handle's part, and the native drain's,
        which makes the EventCreate record itself): (its id, its name)."""
        with self._lock:
            eid, name = self._new_event()
            self._event_handles[handle] = eid
        return eid, name

    def _new_event(self, named: bool = True) -> tuple:
        """(id, name) of a new event; the caller holds the lock. Program events are named by
        their own count, so a proof rerun's replacement events (named=False) take ids only."""
        eid = self._next_event
        self._next_event += 1
        if not named:
            return eid, None
        self._named_events += 1
        return eid, f"event{self._named_events}"

    def forget_event_handle(self, handle: int) -> None:
        with self._lock:
            self._event_handles.pop(handle, None)

    # --- memory -------------------------------------------------------------------------
    def _add_alloc(self, start: int, size: int, stream: Optional[int], external: bool, name: str,
                   pool: str = "") -> _Alloc:
        tid = self.tid()
        site = self.site()
        alloc, reuses = self.file(start, size, stream, tid, external, name, pool)
        self.record(T.Alloc(tid, site, buffer=alloc.id, nbytes=size, name=name.format(id=alloc.id), stream=stream,
                            reuses=reuses))
        return alloc

    def file(self, start: int, size: int, stream: Optional[int], tid: int, external: bool, name: str,
             pool: str = "") -> tuple:
        """An allocation's part in the table (_add_alloc's; torch_native's C++ drain does the same for a block of
        torch's pool, then makes the Alloc record): (the new allocation, the Ranges of freed blocks whose bytes it
        reuses)."""
        with self._lock:  # a finalizer running in here defers its free (see free)
            bid = self._next_buffer
            self._next_buffer += 1
            self._alloc_serial += 1
            alloc = _Alloc(bid, start, size, stream, self._alloc_serial, tid, external, name, pool)
            i = bisect.bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._allocs.insert(i, alloc)
            if not external:
                self._pool_at[start] = alloc
            reuses = () if external or not self._freed else self._take_freed(start, start + size)
        return alloc, reuses

    def _take_freed(self, start: int, stop: int) -> tuple:
        """Ranges of freed blocks that [start, stop) reuses: the pool handed their bytes to a new
        allocation. Those bytes leave the freed list, and a split block keeps its other bytes there,
        so the freed bytes never overlap and a later reuse names their latest owner."""
        starts, freed = self._freed_starts, self._freed
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        reuses = []
        while i < len(freed) and freed[i][0] < stop:
            lo, hi, bid, base = freed[i]
            if hi <= start:
                i += 1
                continue
            reuses.append(Range(bid, max(lo, start) - base, min(hi, stop) - base))
            del starts[i]
            del freed[i]
            for rest_lo, rest_hi in ((lo, start), (stop, hi)):  # what the new allocation leaves of it
                if rest_lo < rest_hi:
                    starts.insert(i, rest_lo)
                    freed.insert(i, (rest_lo, rest_hi, bid, base))
                    i += 1
        return tuple(reuses)

    def alloc(self, ptr: int, size: int, stream=None, what: str = "array", pool: str = "", sid=None):
        """A pool allocation of `size` bytes at `ptr`, filed (as CuPy's and torch's pools do)
        under `stream` (None: the current stream; or its id as `sid`), where the pool reuses the
        bytes after a free. Returns the handle `free` takes."""
        if sid is None:
            sid = self.sid(stream)
        return self._add_alloc(ptr, size, sid, False, allocation_name(what, size), pool)

    def host_alloc(self, ptr: int, size: int, what: str = "pinned host tensor"):
        """A block of pinned host memory at `ptr` (torch's CachingHostAllocator): filed under no
        stream; its free and reuse are the host's (host_block_reused)."""
        return self._add_alloc(ptr, size, None, False, allocation_name(what, size), "pinned")

    def host_view_access(self, lo: int, hi: int, write: bool, name: str) -> None:
        """The host read or wrote host addresses [lo, hi) through a view (record.host_views): a
        host access of those bytes, where an allocation holds them."""
        alloc = self._find(lo, hi)
        if alloc is None:
            return
        rng = Range(alloc.id, lo - alloc.start, hi - alloc.start)
        self.record(T.HostAccess(self.tid(), self.site(), reads=() if write else (rng,), writes=(rng,) if write else (),
                                 name=name))

    def host_block_used(self, alloc: _Alloc, sid: int) -> None:
        """A non_blocking copy on stream `sid` used pinned block `alloc`: the CachingHostAllocator
        records an event on that stream for the block, and hands the block out again only once
        the event completed."""
        with self._lock:
            eid, _ = self._new_event(named=False)
        tid, site = self.tid(), self.site()
        self.record(T.EventCreate(tid, site, event=eid, name="pinned block in use"))
        self.record(T.EventRecord(tid, site, event=eid, stream=sid))
        alloc.host_events.append(eid)

    def host_block_reused(self, alloc: _Alloc) -> None:
        """The CachingHostAllocator hands pinned block `alloc` to a new tensor: it queried every
        event of the copies that used the block and found them complete (so the host is ordered
        after those copies), and the old tensor's bytes have a new owner."""
        tid, site = self.tid(), self.site()
        for eid in alloc.host_events:
            self.record(T.EventQuery(tid, site, event=eid, done=True))
        self.free(alloc, tid, site)

    def allocation_at(self, ptr: int) -> Optional[_Alloc]:
        """The live allocation that starts at `ptr` (pools free by their block's address)."""
        if self.pending is not None:
            self.flush()  # the native observer's records may register it
        return self._pool_at.get(ptr)

    def allocation_of(self, obj) -> Optional[_Alloc]:
        """The allocation holding array `obj`, if the recording knows it."""
        if self.pending is not None:
            self.flush()
        span = self.gpu.array_span(obj)
        return self._find(span[0], span[1]) if span is not None else None

    def record_stream(self, alloc: _Alloc, stream) -> None:
        """torch's `tensor.record_stream(s)`: the pool will not reuse the block before `s` has
        run what it was issued by the time of the free."""
        sid = self.sid(stream)
        if sid != alloc.stream and sid not in alloc.also:
            alloc.also += (sid,)

    def free(self, alloc: _Alloc, tid: Optional[int] = None, site: Optional[CallSite] = None) -> None:
        """The pool got the bytes of `alloc` back: a Free ordered on its allocating stream.
        Safe to call from a finalizer."""
        tid = self.tid() if tid is None else tid
        site = self.site() if site is None else site
        if self._lock._is_owned():
            # A finalizer (GC) ran while this thread was updating the table or the checker:
            # record the free as soon as that is done, with the thread and site it had.
            self._deferred.append((alloc, tid, site))
            return
        self.free_in_order(alloc, tid, site)

    def free_in_order(self, alloc: _Alloc, tid: int, site: CallSite) -> None:
        """free() now, for the native drain (torch_native): it holds the lock, and a free it turns from its
        buffer takes its place among the records around it (free() would defer it)."""
        if not self.unfile(alloc, tid, site):
            return
        try:
            self.record(T.Free(tid, site, buffer=alloc.id, stream=alloc.stream, also=alloc.also, pool=alloc.pool,
                               strict=self.strict_free))
        except Exception as exc:  # never raise from a finalizer
            self.errors.append(f"free of {alloc.name}: {exc}")

    def unfile(self, alloc: _Alloc, tid: int, site: CallSite) -> bool:
        """A free's part in the allocation table (torch_native's C++ drain does the same where no graph holds the
        bytes): `alloc` leaves it, and its bytes are filed as freed (the next allocation there reuses them).
        False when no Free is to be recorded now: a graph holds the bytes (its free waits for the graph), or it
        left the table already."""
        with self._lock:
            if alloc.id in self._graph_held:
                # CUDA rule: memory a graph's nodes use lives as long as the graph; the free
                # takes effect when the last such graph is gone (hold_for_graph).
                self._freed_while_held[alloc.id] = (alloc, tid, site)
                return False
            i = bisect.bisect_left(self._starts, alloc.start)
            while i < len(self._allocs) and self._allocs[i] is not alloc and self._starts[i] == alloc.start:
                i += 1
            if i >= len(self._allocs) or self._allocs[i] is not alloc:
                return False
            allocs = self._allocs
            del self._starts[i]
            del allocs[i]
            if self._pool_at.get(alloc.start) is alloc:
                del self._pool_at[alloc.start]
                for k in range(i, len(allocs)):  # another one there (bisect order: the latest first)
                    other = allocs[k]
                    if other.start != alloc.start:
                        break
                    if not other.external:
                        self._pool_at[alloc.start] = other
                        break
            j = bisect.bisect_left(self._freed_starts, alloc.start)
            self._freed_starts.insert(j, alloc.start)
            self._freed.insert(j, (alloc.start, alloc.stop, alloc.id, alloc.start))
        return True

    def _find(self, start: int, stop: int) -> Optional[_Alloc]:
        with self._lock:  # other threads (and finalizers) change the table
            i = bisect.bisect_right(self._starts, start) - 1
            while i >= 0:
                alloc = self._allocs[i]
                if alloc.start <= start and stop <= alloc.stop:
                    return alloc
                if alloc.stop <= start and not alloc.external:
                    return None
                i -= 1  # an external (driver) allocation may contain later pool chunks
            return None

    def _external(self, start: int, stop: int) -> Optional[_Alloc]:
        """The allocation holding memory no recorded allocator handed out (torch, another
        library, a thread-local allocator): the driver's cudaMalloc range, registered once."""
        found = self.gpu.driver_range(start)
        if found is not None and found[0] <= start and stop <= found[0] + found[1]:
            base, size = found
            return self._add_alloc(base, size, None, True, f"external memory 0x{base:x} ({size} bytes)")
        if self._unmapped is None:
            with self._lock:
                self._unmapped = self._next_buffer
                self._next_buffer += 1
            # Every address a 64-bit process maps (CPU and CUDA virtual addresses are below 2**57), in the
            # native checker's int64: with 1 << 64 it handed the whole run to the Python checker.
            self.record(T.Alloc(self.tid(), self.site(), buffer=self._unmapped, nbytes=(1 << 63) - 1,
                                name="unmapped device memory (offsets are addresses)"))
        return None

    def range_of(self, obj) -> Optional[Range]:
        """Bytes an array spans, as a Range of its allocation (None for an empty array)."""
        if self.pending is not None:
            self.flush()  # the native observer's records may register it (else: foreign memory, another buffer)
        span = self.gpu.array_span(obj)
        if span is None:
            return None
        return self.span_range(*span)

    def span_range(self, start: int, stop: int) -> Range:
        """Device addresses [start, stop) as a Range of the allocation holding them."""
        alloc = self._find(start, stop)
        if alloc is None:
            alloc = self._external(start, stop)
            if alloc is None:
                return Range(self._unmapped, start, stop)
        return self.range_in(alloc, start, stop)

    def range_in(self, alloc: _Alloc, start: int, stop: int) -> Range:
        """Addresses [start, stop) of allocation `alloc` as a Range (one object per bytes)."""
        key = (start, stop)
        rng = alloc.ranges.get(key)
        if rng is None:
            rng = alloc.ranges[key] = Range(alloc.id, start - alloc.start, stop - alloc.start)
            untrack(rng)
        return rng

    def ranges(self, objs) -> tuple:
        out = []
        for obj in objs:
            rng = self.range_of(obj)
            # range_of hands out one Range object per (allocation, bytes): identity is equality here.
            if rng is not None and all(rng is not seen for seen in out):
                out.append(rng)
        return tuple(out)

    def arrays(self, values) -> list:
        """Arrays among values (one level into lists/tuples, for concatenate & co.)."""
        is_array = self.gpu.is_array
        out = []
        for v in values:
            if v is None:
                continue
            if is_array(v):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                out.extend(x for x in v if is_array(x))
        return out

    def is_new(self, obj, serial0: int, tid: int) -> bool:
        """Whether array `obj` lives in an allocation this thread made after `serial0`."""
        span = self.gpu.array_span(obj) if self.gpu.is_array(obj) else None
        if span is None:
            return False
        alloc = self._find(span[0], span[0] + 1)
        return alloc is not None and alloc.serial > serial0 and alloc.thread == tid and not alloc.external

    # --- delay injection ----------------------------------------------------------------
    def _targets(self, sid: int, name: str) -> bool:
        if self.delay_kernels and name not in self.delay_kernels:
            return False
        if self.delay_streams:
            return ("all" in self.delay_streams or self._stream_names.get(sid, "") in self.delay_streams
                    or bool(self._aliases.get(sid, set()) & self.delay_streams))
        if self.delay_kernels:
            return True
        delayed = self._delayed.get(sid)
        if delayed is None:
            delayed = self._delayed[sid] = seed_delays(self.seed, self._stream_names.get(sid, ""))
        return delayed

    def alias_stream(self, sid: int, name: str) -> None:
        """One more name `delay_streams` can target stream `sid` by (torch_stream(): "torch")."""
        self._aliases.setdefault(sid, set()).add(name)

    def refresh_library_dirs(self) -> None:
        """The program imported another library: its frames are not the user's either."""
        self.site = SiteResolver((_PACKAGE_DIR + os.sep,), libraries=(d + os.sep for d in self.gpu.library_dirs))

    def set_probe(self, probe) -> None:
        """Confirm one race in this run: `probe.issuing` before each issue, `probe.issued` after."""
        if self._checked is not None:  # the probe reads the checker at each record
            self.check_now()
            self._checked, self._feed = None, self._checker.feed
        self.probe = probe
        self.intercepts = True

    def before_issue(self, stream, sid: int, name: str) -> None:
        """What runs right before an operation is issued on `stream`: the delay, the probe."""
        if self.delay_us:
            self.maybe_spin(stream, sid, name)
        if self.probe is not None:
            self.probe.issuing(self, stream, sid)

    def maybe_spin(self, stream, sid: int, name: str) -> None:
        """Spin before the operation `name` on `stream` if the delay targets it."""
        if not self._targets(sid, name):
            return
        if stream is None:
            stream = self.gpu.current_stream()
        if self._capture_origin and self.gpu.is_capturing(stream):
            # Captured work does not run now, so a spin would delay nothing; it would be baked
            # into the graph and replayed at every launch. Graph launches are delayed instead.
            return
        self.gpu.spin(stream, self.delay_us)
        self.delays += 1

    # --- what the adapters call ---------------------------------------------------------
    def launch(self, name: str, call, stream=None, reads=(), writes=(), site=None):
        """Record a launch of `name` on `stream` (None: current) reading the arrays `reads` and
        writing `writes`, and run `call()` after any spin."""
        site = site or self.site()
        tid = self.tid()
        sid = self.sid(stream)
        if self.intercepts:
            self.before_issue(stream, sid, name)
        try:
            result = inside(call)
        except BaseException:
            if self._capture_origin:  # refused during a capture (e.g. the legacy stream): the checker says why
                self.record(T.Launch(tid, site, stream=sid, name=name, reads=self.ranges(reads),
                                     writes=self.ranges(writes)))
            raise
        self.record(T.Launch(tid, site, stream=sid, name=name, reads=self.ranges(reads), writes=self.ranges(writes)))
        return result

    def compute(self, name: str, fn, args, kwargs, inplace=(), h2d: bool = False, inputs=None, stream=None):
        """An operation that launches on `stream` (None: current) iff it allocates its result,
        writes `out=`, or works in place: record it that way. Reads: `inputs`, by default every
        array among the arguments."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        serial0 = self._alloc_serial
        if self.intercepts:
            self.before_issue(stream, sid, name)
        result = inside(fn, *args, **kwargs)
        out = kwargs.get("out")
        written = list(inplace) + self.arrays(out if isinstance(out, (tuple, list)) else (out,))
        results = result if isinstance(result, (tuple, list)) else (result,)
        written += [r for r in results if self.is_new(r, serial0, tid)]
        if not written:
            return result  # a view, or nothing new: no kernel ran
        if inputs is None:
            inputs = self.arrays(args) + self.arrays(v for k, v in kwargs.items() if k != "out")
        writes = self.ranges(written)
        if h2d and not inputs:
            for rng in writes:
                self.record(T.Copy(tid, site, stream=sid, kind=CopyKind.H2D, src=None, dst=rng))
            return result
        # A range both read and written (in place) is recorded as a write: that conflicts with any
        # unordered access already, and one report per racing pair is enough.
        reads = tuple(r for r in self.ranges(inputs) if all(r is not w for w in writes))
        self.record(T.Launch(tid, site, stream=sid, name=name, reads=reads, writes=writes))
        return result

    def host_read(self, name: str, array, stream, blocking: bool, call):
        """A D2H copy of `array` on `stream` (None: current), then (blocking) a sync of that stream."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        if self.intercepts:
            self.before_issue(stream, sid, name)
        if blocking and self._checked is not None:
            self.check_now()  # while the GPU catches up: the host waits in the call anyway
        self.reading = blocking  # the library's own report of this sync (torch's callback) is this one
        try:
            result = inside(call)
        finally:
            self.reading = False
        rng = self.range_of(array)
        if rng is not None:
            self.record(T.Copy(tid, site, stream=sid, kind=CopyKind.D2H, src=rng, dst=None))
        if blocking:
            self.record(T.StreamSync(tid, site, stream=sid, cause=name))
        return result

    def host_write(self, array, stream, call):
        """An H2D copy into `array` on `stream` (None: current)."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        if self.intercepts:
            self.before_issue(stream, sid, "copy H2D")
        result = inside(call)
        rng = self.range_of(array)
        if rng is not None:
            self.record(T.Copy(tid, site, stream=sid, kind=CopyKind.H2D, src=None, dst=rng))
        return result

    def kernel_access(self, name: str, code: Optional[str], args) -> tuple:
        """(reads, writes) of a kernel launch by source, from declare_kernel or its signature."""
        spec = kernel_access.declared(name)
        if spec is None:
            key = (name, code)
            spec = self._signatures.get(key)
            if spec is None:
                spec = self._signatures[key] = kernel_access.access_spec(name, code)
        reads, writes = [], []
        is_array = self.gpu.is_array
        for i, arg in enumerate(args):
            if not is_array(arg):
                continue
            kind = spec.get(i, "w")
            if kind == "r":
                reads.append(arg)
            elif kind != "-":
                writes.append(arg)
        return reads, writes

    def source_launch(self, name: str, code: Optional[str], args, stream, call):
        """A launch of a kernel compiled from `code`, its accesses from the signature."""
        reads, writes = self.kernel_access(name, code, args)
        return self.launch(name, call, stream=stream, reads=reads, writes=writes)

    def _call(self, call, op):
        """Run the real library call. If CUDA refuses it while a capture is open (a sync of a
        capturing stream, a wait across the capture boundary, ...), record `op` anyway so the
        checker collects its own capture error naming this call, then re-raise CUDA's error."""
        try:
            return inside(call)
        except BaseException:
            if self._capture_origin and op is not None:
                self.record(op)
            raise

    def event_record(self, event, stream, call):
        """event.record(stream); `event` None: the call creates it and returns it."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        op = T.EventRecord(tid, site, event=self.eid(event), stream=sid) if event is not None else None
        result = self._call(call, op)
        if op is None:
            op = T.EventRecord(tid, site, event=self.eid(result), stream=sid)
        self.record(op)
        return result

    def skipped(self, op) -> bool:
        """The sync audit's proof rerun: True when the sync `op` is not to be made (its
        replacement, record on the producer's stream and wait on the consumer's, issued here
        through the driver so that no adapter records them)."""
        edits = self.edits
        if edits is None:
            return False
        self.flush()  # the occurrences before this one seen first (the native observer holds waits it took)
        self._decided = op
        plan = edits.decide(op)
        if plan is None:
            return False
        driver = self.gpu.driver
        ptrs = {sid: key if isinstance(key, int) else 2 for key, sid in self._streams.items()}
        if any(sid not in ptrs for sid in plan.records) or any(w[0] not in ptrs for w in plan.waits):
            edits.recorded_anyway(op)  # a stream the program has not shown us yet: make the call
            return False
        if any(eid is not None for _, _, eid in plan.waits):
            edits.recorded_anyway(op)  # a wait on the program's own event: no driver handle for it here
            return False
        tid, site = self.tid(), op.site
        for sid in plan.records:
            found = self._replacement_events.get(sid)
            if found is None:
                with self._lock:
                    eid, _ = self._new_event(named=False)
                found = self._replacement_events[sid] = (driver.event_create(), eid)
                self.record(T.EventCreate(tid, site, event=eid, name=f"audit replacement on {self._stream_names.get(sid, sid)}"))
            driver.event_record(found[0], ptrs[sid])
            self.record(T.EventRecord(tid, site, event=found[1], stream=sid))  # the checker sees the edge too
        for sid, source, _ in plan.waits:
            handle, eid = self._replacement_events[source]
            driver.stream_wait_event(ptrs[sid], handle)
            self.record(T.StreamWait(tid, site, stream=sid, event=eid))
        return True

    def stream_wait(self, stream, event, call):
        site = self.site()
        op = T.StreamWait(self.tid(), site, stream=self.sid(stream), event=self.eid(event))
        if self.skipped(op):
            return None
        result = self._call(call, op)
        self.record(op)
        return result

    def stream_sync(self, stream, call):
        return self._host_sync(T.StreamSync(self.tid(), self.site(), stream=self.sid(stream)), call)

    def event_sync(self, event, call):
        return self._host_sync(T.EventSync(self.tid(), self.site(), event=self.eid(event)), call)

    def stream_query(self, stream, call):
        """stream.query() / CuPy's stream.done: recorded with what it returned (done orders, not-done does not)."""
        tid, site, sid = self.tid(), self.site(), self.sid(stream)
        result = self._call(call, T.StreamQuery(tid, site, stream=sid))
        self.record(T.StreamQuery(tid, site, stream=sid, done=bool(result)))
        return result

    def event_query(self, event, call):
        """event.query() / CuPy's event.done; `event` an event object or a raw cudaEvent_t (torch's)."""
        tid, site = self.tid(), self.site()
        eid = self.event_handle(event) if isinstance(event, int) else self.eid(event)
        result = self._call(call, T.EventQuery(tid, site, event=eid))
        self.record(T.EventQuery(tid, site, event=eid, done=bool(result)))
        return result

    def device_sync(self, call):
        return self._host_sync(T.DeviceSync(self.tid(), self.site()), call)

    def _host_sync(self, op, call):
        """A host synchronization `op` made by `call()`, unless a proof rerun skips it."""
        if self.skipped(op):
            return None
        if self._checked is not None:
            self.check_now()  # while the GPU catches up
        result = self._call(call, op)
        self.record(op)
        return result

    def declare(self, reads=(), writes=(), stream=None, name: str = "declared access") -> None:
        """Work the adapters cannot see, as a launch on `stream`."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        if self.probe is not None:
            self.probe.issuing(self, stream, sid)
        self.record(T.Launch(tid, site, stream=sid, name=name, reads=self.ranges(self.arrays(reads)),
                             writes=self.ranges(self.arrays(writes))))

    # --- stream capture (CUDA graphs) ---------------------------------------------------
    def _new_graph_id(self) -> int:
        with self._lock:
            gid = self._next_graph
            self._next_graph += 1
        return gid

    def capture_begin(self, stream, mode, call):
        """begin_capture: a CaptureBegin with a new graph id, after CUDA began it."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        try:
            capture_mode = self.gpu.capture_mode(mode)
        except ValueError as exc:  # CUDA refuses it too (cudaErrorInvalidValue); nothing began
            result = inside(call)
            self.errors.append(f"begin_capture at {site}: {exc}; not recorded")
            return result
        gid = self._new_graph_id()
        op = T.CaptureBegin(tid, site, stream=sid, graph=gid, mode=capture_mode)
        # The refusals the checker knows (the legacy stream, a stream already capturing) are
        # recorded so its report names the call; anything else CUDA refuses began nothing.
        known_refusal = sid == 0 or sid in self._capture_origin or bool(self._capture_origin and
                                                                        self.gpu.is_capturing(stream))
        try:
            result = inside(call)
        except BaseException:
            if known_refusal:
                self.record(op)
            raise
        # The native observer's records made before the capture are drained as such (a free before it is a free).
        self.flush()
        with self._lock:
            self._capture_origin[sid] = (gid, len(self.trace))
        self.record(op)
        return result

    def capture_end(self, stream, call) -> tuple:
        """end_capture: a CaptureEnd, recorded whether or not CUDA produced a graph (the checker
        explains a refusal, e.g. an unjoined fork). Returns (graph, graph id, kernel names,
        buffers its nodes use); the id is None for a capture begun before this recording."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        begun = self._capture_origin.get(sid)
        try:
            graph = inside(call)
        except BaseException:
            if begun is None:
                gid = self._new_graph_id()
            else:
                gid = begun[0]
                if not self.gpu.is_capturing(stream):  # CUDA ended the capture (unjoined, invalidated)
                    self._capture_ended(sid)
            self.record(T.CaptureEnd(tid, site, stream=sid, graph=gid))
            raise
        if begun is None:  # begun before this recording started: nothing to check it against
            return graph, None, (), frozenset()
        gid, begin_index = begun
        self._capture_ended(sid)
        self.record(T.CaptureEnd(tid, site, stream=sid, graph=gid))
        names, buffers = captured_work(self.trace.ops[begin_index:], sid)
        return graph, gid, names, buffers

    def _capture_ended(self, sid: int) -> None:
        self.flush()  # the native observer's records made in the capture are drained as such
        with self._lock:
            self._capture_origin.pop(sid, None)

    @property
    def captures(self) -> int:
        """Captures CUDA holds open: the only time spins and failed calls need a look."""
        return len(self._capture_origin)

    def hold_for_graph(self, graph, buffers) -> None:
        """`graph` (the library's object) has nodes that use `buffers`: their frees wait until the
        graph is garbage (CUDA rule: memory graph nodes use lives as long as the graph)."""
        if not buffers:
            return
        with self._lock:
            for bid in buffers:
                self._graph_held[bid] = self._graph_held.get(bid, 0) + 1
        weakref.finalize(graph, self._release_graph, buffers)

    def _release_graph(self, buffers) -> None:
        """That graph is gone: frees it deferred take effect now, on their allocating stream."""
        due = []
        with self._lock:
            for bid in buffers:
                left = self._graph_held.get(bid, 0) - 1
                if left > 0:
                    self._graph_held[bid] = left
                    continue
                self._graph_held.pop(bid, None)
                pending = self._freed_while_held.pop(bid, None)
                if pending is not None:
                    due.append(pending)
        for alloc, tid, site in due:
            self.free(alloc, tid, site)

    def graph_launch(self, gid: int, names: tuple, stream, call):
        """A graph launch: one GraphLaunch on the stream (None: current), after any spin there
        (the name matched against `delay_kernels` is the first of the graph's kernels named)."""
        site = self.site()
        tid = self.tid()
        sid = self.sid(stream)
        if self.intercepts:
            self.before_issue(stream, sid, graph_delay_name(names, self.delay_kernels))
        result = inside(call)
        self.record(T.GraphLaunch(tid, site, stream=sid, graph=gid))
        return result

    # --- host threads -------------------------------------------------------------------
    def thread_starting(self) -> int:
        parent = self.tid()
        with self._lock:
            child = self._next_thread
            self._next_thread += 1
        self.record(T.ThreadStart(child, self.site(), parent=parent))
        return child

    def thread_running(self, child: int) -> None:
        with self._lock:
            self._threads[threading.get_ident()] = child

    def thread_joined(self, child: int) -> None:
        self.record(T.ThreadJoin(self.tid(), self.site(), child=child))

    def knows_thread(self) -> bool:
        """Whether the calling thread issued recorded work (or was started or reached by the recording)."""
        return threading.get_ident() in self._threads

    def thread_hand_over(self, kind, channel: int, what: str) -> None:
        """A hand-off between host threads (host_handoffs.py): `kind` is T.HandOff (Event.set, a put,
        a release, ...) or T.TakeOver (a wait that returned True, the get of the item, an acquire, ...)."""
        self.record(kind(self.tid(), self.site(), channel=channel, what=what))


__all__ = ["Recorder", "Gpu", "current", "inside", "depth", "captured_work", "format_capture_errors"]
