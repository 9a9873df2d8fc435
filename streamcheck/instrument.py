"""Whole-program mode: record what an unmodified CuPy program asks of the GPU, and check it.

    with streamcheck.instrument() as session:
        main()
    print(session.report())

or, for a whole script, `streamcheck run script.py` (streamcheck/commands/run.py).

While a session is active, CuPy's Python entry points are wrapped (monkeypatched)
so that each stream operation is recorded into a streamcheck.trace.Trace in host
issue order and fed to the happens-before checker (hb.Checker) as it happens:

- streams and events: Stream creation, Stream.record / wait_event / synchronize /
  done, Event.record / synchronize / done, Device.synchronize and
  cupy.cuda.runtime.deviceSynchronize;
- kernels: RawKernel and RawModule functions (reads vs writes from the CUDA
  signature: a `const T*` parameter is a read, any other pointer may be written;
  override per kernel with `declare_kernel`), ElementwiseKernel and
  ReductionKernel (inputs read, outputs written), CuPy's ufuncs, cupy.matmul /
  dot and friends, ndarray operators and methods (`a + b`, `a += b`, `a[i] = b`,
  `a.sum()`, ...): an operation that allocates its result or has an `out=` is a
  launch on the current stream;
- host transfers: ndarray.get / set, cupy.asnumpy, item() / bool() / float() /
  printing (a copy on the stream, then a sync of that stream);
- memory: every allocation through CuPy's allocator (the allocator is wrapped
  with cupy.cuda.set_allocator, so any device pointer maps to an allocation and
  a byte offset); a free is recorded when the last reference goes, ordered on
  the stream that allocated it (CuPy's pool reuses the bytes on that stream);
  memory CuPy did not allocate (torch tensors through DLPack or
  __cuda_array_interface__) maps to the driver's allocation that holds it;
- host threads: threading.Thread.start / join are happens-before edges;
- CUDA graphs: Stream.begin_capture / end_capture (CaptureBegin / CaptureEnd, one
  graph id per begin_capture) and launches of the graph end_capture returned
  (GraphLaunch). end_capture returns CuPy's Graph wrapped in a small proxy, since
  CuPy's Graph is a Cython class whose launch cannot be patched. What CUDA refuses
  during a capture is collected by the checker (capture_errors) and printed with the
  races; the real CuPy call still runs, so the program gets CUDA's own error.

What it cannot see, and how to declare it, is in docs/instrument.md. The
analysis itself is hb.py's; this module only adapts CuPy to trace records.

Importing this module imports neither cupy nor torch: they load when a session
starts.
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import re
import sys
import threading
import types
import weakref
import zlib
from typing import Optional

from . import trace as T
from .backends.cupy_backend import capture_mode_of, graph_delay_name
from .hb import Checker, TraceError, format_report
from .trace import UNKNOWN_SITE, CallSite, CopyKind, Range, StreamKind

__all__ = ["instrument", "start", "stop", "active", "current_session", "suppressed", "declare_access",
           "declare_kernel", "torch_stream", "Session", "InstrumentError"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_session: Optional["Session"] = None
_tls = threading.local()  # depth: inside a recorded call; suppress: backend/internal work, record nothing
_KERNEL_ACCESS: dict = {}  # kernel name -> {arg index: "r" | "w" | "-"} (declare_kernel)
_SCALARS = (int, float, complex, bool, str, bytes, type(None), __import__("numpy").generic)  # never arrays


class InstrumentError(RuntimeError):
    """instrument() cannot run here (no GPU, nested sessions); the message says what to do."""


def format_capture_errors(errors) -> str:
    """The stream-capture errors the checker collected (capture.CaptureError: CUDA's error
    name and streamcheck's explanation), as printed after the race reports."""
    if not errors:
        return ""
    head = (f"streamcheck: {len(errors)} stream-capture error{'s' if len(errors) != 1 else ''} "
            "(calls CUDA refuses during graph capture; the program got CUDA's own error from CuPy)")
    blocks = [head]
    for error in errors:
        text, prefix = str(error), f"{error.code}: "
        blocks.append(f"capture error {error.code}\n  {text[len(prefix):] if text.startswith(prefix) else text}")
    return "\n\n".join(blocks)


def captured_kernel_names(ops, origin: int) -> tuple:
    """Names of the kernels a capture begun on stream `origin` holds, from the trace slice
    that starts at its CaptureBegin: the origin and every stream that waited on an event
    recorded by a member are members. For delay targeting only (`--delay-kernel NAME`
    delays the launches of graphs holding NAME); the checker keeps its own account."""
    members, marked, names = {origin}, set(), {}
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
        elif kind in (T.Launch, T.Copy) and op.stream in members:
            names[op.name] = None
    return tuple(names)


# --- small helpers ------------------------------------------------------------------------

def _depth() -> int:
    return getattr(_tls, "depth", 0)


def _quiet() -> bool:
    """True when wrappers must pass straight through: no session, nested call, or suppressed."""
    return _session is None or getattr(_tls, "depth", 0) or getattr(_tls, "suppress", 0)


@contextlib.contextmanager
def suppressed():
    """Record nothing issued by this thread inside the block (the cupy backend's own spins,
    timing events and fills; work a streamcheck Device checks itself)."""
    _tls.suppress = getattr(_tls, "suppress", 0) + 1
    try:
        yield
    finally:
        _tls.suppress -= 1


def _inside(call, *args, **kwargs):
    """Run a wrapped CuPy call: what it calls in turn is part of it, not recorded again."""
    tls = _tls
    tls.depth = getattr(tls, "depth", 0) + 1
    try:
        return call(*args, **kwargs)
    finally:
        tls.depth -= 1


def active() -> bool:
    """Whether a session is recording now."""
    return _session is not None


def current_session() -> Optional["Session"]:
    return _session


# --- CUDA signatures ----------------------------------------------------------------------

def _split_top(text: str) -> list:
    """Split on commas outside (), <>, [] and {}."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def _param_access(param: str) -> str:
    """'r' for `const T*` (read only), 'w' for any other pointer (may be written), '-' otherwise."""
    param = re.sub(r"/\*.*?\*/|//[^\n]*", " ", param)
    if "*" not in param and "[" not in param:
        return "-"
    head = param.split("*", 1)[0] if "*" in param else param
    return "r" if re.search(r"\bconst\b", head) else "w"


def kernel_signature(code: Optional[str], name: str) -> Optional[tuple]:
    """Per-parameter access ('r'/'w'/'-') of `__global__ ... name(...)` in CUDA source, or None
    when the kernel is not found (precompiled module, macro-generated name)."""
    if not code:
        return None
    base = name.split("<", 1)[0].strip()
    pattern = re.compile(r"__global__\b[^;{]*?\b" + re.escape(base) + r"\s*\(")
    for match in pattern.finditer(code):
        start = match.end()
        depth, i = 1, start
        while i < len(code) and depth:
            if code[i] == "(":
                depth += 1
            elif code[i] == ")":
                depth -= 1
            i += 1
        params = code[start:i - 1].strip()
        if not params or params == "void":
            return ()
        return tuple(_param_access(p) for p in _split_top(params))
    return None


def _param_names(spec: str) -> list:
    """Names of ElementwiseKernel/ReductionKernel params: 'T x, raw T y' -> ['x', 'y']."""
    return [p.split()[-1] for p in _split_top(spec or "") if p.split()]


def declare_kernel(name: str, *, reads=(), writes=(), ignore=()) -> None:
    """Say how kernel `name` (RawKernel/RawModule function or ElementwiseKernel name) uses its
    arguments, by position: overrides what the CUDA signature says. Array arguments not listed
    count as written (the conservative choice)."""
    spec = {}
    for i in reads:
        spec[int(i)] = "r"
    for i in writes:
        spec[int(i)] = "w"
    for i in ignore:
        spec[int(i)] = "-"
    _KERNEL_ACCESS[name] = spec


# --- memory ownership ---------------------------------------------------------------------

class _Alloc:
    __slots__ = ("id", "start", "size", "stop", "stream", "serial", "thread", "external", "ranges", "name")

    def __init__(self, id, start, size, stream, serial, thread, external, name):
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


class _Owner:
    """Owns a pooled allocation handed to CuPy as UnownedMemory: when CuPy drops the last
    reference, the allocation is freed - record it, then let the pool have the bytes back."""

    __slots__ = ("session", "alloc", "memptr", "__weakref__")

    def __init__(self, session, alloc, memptr):
        self.session = session
        self.alloc = alloc
        self.memptr = memptr

    def __del__(self):
        session = self.session
        if session is not None and session is _session:
            session._on_free(self.alloc)


class _CudaDriver:
    """cuMemGetAddressRange through ctypes: the allocation (base, size) holding a pointer,
    for memory CuPy's allocator did not hand out (torch, external libraries)."""

    def __init__(self):
        self.fn = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuMemGetAddressRange_v2
            fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
            fn.restype = ctypes.c_int
            self.fn = fn
        except (OSError, AttributeError):
            pass

    def range_of(self, ptr: int):
        if self.fn is None:
            return None
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        if self.fn(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
            return None
        return int(base.value), int(size.value)


# --- the session --------------------------------------------------------------------------

class Session:
    """One recording: the trace, the checker, and the maps from CuPy objects to trace ids."""

    def __init__(self, *, delay_us: float = 0.0, delay_streams=(), delay_kernels=(), seed: int = 0,
                 check: bool = True):
        import cupy

        from .backends.cupy_backend import MAX_DELAY_US

        if not 0 <= delay_us <= MAX_DELAY_US:
            raise InstrumentError(f"instrument: delay_us must be in [0, {MAX_DELAY_US}] µs (the spin kernel's cap), "
                                  f"got {delay_us!r}")
        self.cupy = cupy
        self.trace = T.Trace()
        self.checker: Optional[Checker] = Checker() if check else None
        self.errors: list = []  # internal problems while recording (never raised into the program)
        self.unpatched: list = []  # entry points that could not be wrapped in this CuPy version
        self.delay_us = float(delay_us)
        self.delay_streams = frozenset(delay_streams)
        self.delay_kernels = frozenset(delay_kernels)
        self.seed = seed
        self.delays = 0  # spins injected
        self._spin = None
        self._lock = threading.RLock()
        self._ndarray = cupy.ndarray
        self._current_stream = cupy.cuda.get_current_stream
        self._threads: dict = {threading.get_ident(): 0}
        self._next_thread = 1
        self._streams: dict = {}  # key (ptr, or (2, thread) for per-thread) -> stream id
        self._stream_names: dict = {}  # stream id -> short name (delay targeting)
        self._next_stream = 1
        self._named_streams = 0
        self._events = weakref.WeakKeyDictionary()
        self._next_event = 1
        self._starts: list = []  # sorted allocation starts
        self._allocs: list = []  # _Alloc in the same order
        self._next_buffer = 1
        self._alloc_serial = 0
        self._deferred: list = []  # frees that arrived while the lock was held: (alloc, thread, site)
        self._unmapped: Optional[int] = None  # pseudo-buffer of absolute addresses (last resort)
        self._driver: Optional[_CudaDriver] = None
        self._skip: dict = {}  # file name -> frame belongs to streamcheck/cupy
        self._sites: dict = {}
        self._signatures: dict = {}
        self._skip_dirs = tuple(d + os.sep for d in _library_dirs())
        self._next_graph = 1
        self._capture_origin: dict = {}  # stream id -> (graph id, trace index of its CaptureBegin)
        self._captures = 0  # captures CUDA holds open: the only time spins and failed calls need a look
        self._runtime = cupy.cuda.runtime
        self._append = self.trace.ops.append
        self._feed = self.checker.feed if self.checker is not None else None
        self._record(T.StreamCreate(0, self._site(), stream=0, kind=StreamKind.LEGACY, name="legacy default stream"))
        self._streams[0] = 0
        self._stream_names[0] = "legacy"

    # --- results ------------------------------------------------------------------------
    @property
    def races(self) -> list:
        return self.checker.races if self.checker is not None else []

    @property
    def capture_errors(self) -> list:
        """What CUDA refuses during stream capture (capture.CaptureError), as the checker saw it."""
        return list(getattr(self.checker, "capture_errors", ())) if self.checker is not None else []

    @property
    def findings(self) -> int:
        """Races plus capture errors: what `streamcheck run --error-exitcode` counts."""
        return len(self.races) + len(self.capture_errors)

    def report(self) -> str:
        lines = [format_report(self.races)]
        if self.capture_errors:
            lines.append(format_capture_errors(self.capture_errors))
        if self.errors:
            lines.append(f"streamcheck: {len(self.errors)} internal error(s) while recording (the program was "
                         f"not affected); first: {self.errors[0]}")
        return "\n".join(lines)

    def summary(self) -> str:
        streams = len(self._stream_names)
        delay = (f"delay {self.delay_us:g} µs on "
                 f"{'+'.join(sorted(self.delay_streams)) or 'seed-chosen streams'} ({self.delays} spins)"
                 if self.delay_us else "no injected delay")
        return (f"streamcheck: recorded {len(self.trace)} operations on {streams} stream(s), "
                f"{self._next_thread} host thread(s); {delay}; seed {self.seed}")

    # --- recording core -----------------------------------------------------------------
    def _record(self, op) -> None:
        with self._lock:
            self._append(op)
            if self._feed is not None:
                try:
                    self._feed(op)
                except TraceError as exc:  # a trace we built wrong: keep the program running
                    self.errors.append(str(exc))
        if self._deferred and not self._lock._is_owned():
            self._drain_frees()

    def _drain_frees(self) -> None:
        while self._deferred:
            try:
                alloc, tid, site = self._deferred.pop(0)
            except IndexError:  # another thread drained it
                return
            self._on_free(alloc, tid, site)

    def _site(self) -> CallSite:
        """The first frame outside streamcheck and CuPy: the user's line. (Caches are keyed by
        file name, whose hash Python caches, not by code object, whose hash it recomputes.)"""
        frame = sys._getframe(1)
        skip = self._skip
        while frame is not None:
            filename = frame.f_code.co_filename
            skipped = skip.get(filename)
            if skipped is None:
                path = filename if filename.startswith("<") else os.path.abspath(filename)
                skipped = skip[filename] = path.startswith(self._skip_dirs)
            if not skipped:
                key = (filename, frame.f_lineno)
                site = self._sites.get(key)
                if site is None:
                    site = self._sites[key] = CallSite(filename, frame.f_lineno, frame.f_code.co_name)
                return site
            frame = frame.f_back
        return UNKNOWN_SITE

    def _tid(self) -> int:
        ident = threading.get_ident()
        tid = self._threads.get(ident)
        if tid is None:
            with self._lock:
                tid = self._next_thread
                self._next_thread += 1
                self._threads[ident] = tid
            # A thread we did not see start: unordered with everything (conservative).
            self._record(T.ThreadStart(tid, self._site(), parent=None))
        return tid

    def _implicit(self, reason: str) -> None:
        self._record(T.ImplicitSync(self._tid(), self._site(), reason=reason))

    # --- streams and events -------------------------------------------------------------
    def _stream_key(self, ptr: int):
        if ptr in (0, 1):  # null stream / cudaStreamLegacy
            return 0
        if ptr == 2:  # cudaStreamPerThread: one per host thread
            return (2, self._tid())
        return ptr

    def _register_stream(self, ptr: int, site: CallSite, fresh: bool = False, short: str = "") -> int:
        key = self._stream_key(ptr)
        with self._lock:
            if not fresh and key in self._streams:
                return self._streams[key]
            sid = self._next_stream
            self._next_stream += 1
            if ptr == 2:
                kind, short = StreamKind.PER_THREAD, f"ptds{key[1]}"
                label = f"per-thread default stream of thread {key[1]}"
            else:
                kind = self._stream_kind(ptr)
                if not short:
                    self._named_streams += 1
                    short = f"s{self._named_streams}"
                label = f"{short} (created at {site})" if site is not UNKNOWN_SITE else f"{short} (0x{ptr:x})"
            self._streams[key] = sid
            self._stream_names[sid] = short
        self._record(T.StreamCreate(self._tid(), site, stream=sid, kind=kind, name=label))
        return sid

    def _stream_kind(self, ptr: int) -> StreamKind:
        rt = self.cupy.cuda.runtime
        try:
            flags = rt.streamGetFlags(ptr)
        except Exception:  # unknown: assume non-blocking, the kind that implies the fewest edges
            return StreamKind.NON_BLOCKING
        return StreamKind.NON_BLOCKING if flags & rt.streamNonBlocking else StreamKind.BLOCKING

    def _sid(self, stream) -> int:
        """Trace id of a CuPy stream object, a torch stream, a raw pointer, or None (current)."""
        if stream is None:
            stream = self._current_stream()
        ptr = stream if isinstance(stream, int) else getattr(stream, "ptr", None)
        if ptr is None:
            ptr = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
        if ptr is None:
            raise TypeError(f"not a CUDA stream: {stream!r}")
        if ptr > 2:  # hot path: a stream CuPy or torch created
            sid = self._streams.get(ptr)
            if sid is not None:
                return sid
        key = self._stream_key(ptr)
        sid = self._streams.get(key)
        if sid is None:
            sid = self._register_stream(ptr, UNKNOWN_SITE)
        return sid

    def _eid(self, event) -> int:
        # Kept on the event object itself (CuPy's Event is a plain Python class): cheaper than
        # a weak dictionary, and a new Event with a reused handle still gets a new id.
        tag = getattr(event, "_streamcheck_event", None)
        if tag is not None and tag[0] is self:
            return tag[1]
        with self._lock:
            eid = self._next_event
            self._next_event += 1
        try:
            event._streamcheck_event = (self, eid)
        except AttributeError:  # an event type without a __dict__: look it up by identity
            tag = self._events.get(event)
            if tag is not None:
                return tag
            self._events[event] = eid
        self._record(T.EventCreate(self._tid(), self._site(), event=eid, name=f"event{eid}"))
        return eid

    # --- memory -------------------------------------------------------------------------
    def _add_alloc(self, start: int, size: int, stream: Optional[int], external: bool, name: str) -> _Alloc:
        tid = self._tid()
        site = self._site()
        with self._lock:  # a finalizer running in here defers its free (see _on_free)
            bid = self._next_buffer
            self._next_buffer += 1
            self._alloc_serial += 1
            alloc = _Alloc(bid, start, size, stream, self._alloc_serial, tid, external, name)
            i = bisect.bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._allocs.insert(i, alloc)
        self._record(T.Alloc(tid, site, buffer=bid, nbytes=size, name=name.format(id=bid)))
        return alloc

    def _on_alloc(self, ptr: int, size: int) -> _Alloc:
        sid = self._sid(None)  # CuPy's pool files the chunk under the current stream
        return self._add_alloc(ptr, size, sid, False, "cupy array #{id}" + f" ({size} bytes)")

    def _on_free(self, alloc: _Alloc, tid: Optional[int] = None, site: Optional[CallSite] = None) -> None:
        tid = self._tid() if tid is None else tid
        site = self._site() if site is None else site
        if self._lock._is_owned():
            # A finalizer (GC) ran while this thread was updating the table or the checker:
            # record the free as soon as that is done, with the thread and site it had.
            self._deferred.append((alloc, tid, site))
            return
        with self._lock:
            i = bisect.bisect_left(self._starts, alloc.start)
            while i < len(self._allocs) and self._allocs[i] is not alloc and self._starts[i] == alloc.start:
                i += 1
            if i >= len(self._allocs) or self._allocs[i] is not alloc:
                return
            del self._starts[i]
            del self._allocs[i]
        try:
            self._record(T.Free(tid, site, buffer=alloc.id, stream=alloc.stream))
        except Exception as exc:  # never raise from a finalizer
            self.errors.append(f"free of {alloc.name}: {exc}")

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

    def _external(self, start: int, stop: int) -> tuple:
        """(alloc or None, base) for memory CuPy's allocator did not hand out."""
        if self._driver is None:
            self._driver = _CudaDriver()
            _patch_torch(self)  # such memory usually comes from torch
        found = self._driver.range_of(start)
        if found is not None and found[0] <= start and stop <= found[0] + found[1]:
            base, size = found
            alloc = self._add_alloc(base, size, None, True, f"external memory 0x{base:x} ({size} bytes)")
            return alloc, base
        if self._unmapped is None:
            with self._lock:
                self._unmapped = self._next_buffer
                self._next_buffer += 1
            self._record(T.Alloc(self._tid(), self._site(), buffer=self._unmapped, nbytes=1 << 64,
                                 name="unmapped device memory (offsets are addresses)"))
        return None, 0

    def _range(self, obj) -> Optional[Range]:
        """Bytes an array (CuPy ndarray or __cuda_array_interface__ object) spans."""
        if isinstance(obj, self._ndarray):
            if obj.size == 0:
                return None
            ptr, shape, strides, itemsize = obj.data.ptr, obj.shape, obj.strides, obj.itemsize
        else:
            cai = getattr(obj, "__cuda_array_interface__", None)
            if cai is None:
                return None
            ptr = cai["data"][0]
            shape = tuple(cai["shape"])
            itemsize = int(cai["typestr"][2:])
            strides = cai.get("strides")
            if strides is None:
                strides, acc = [], itemsize
                for n in reversed(shape):
                    strides.append(acc)
                    acc *= n
                strides = tuple(reversed(strides))
            if any(n == 0 for n in shape):
                return None
        lo = hi = 0
        for n, st in zip(shape, strides):
            if n > 1:
                if st >= 0:
                    hi += (n - 1) * st
                else:
                    lo += (n - 1) * st
        start, stop = ptr + lo, ptr + hi + itemsize
        alloc = self._find(start, stop)
        if alloc is None:
            alloc, base = self._external(start, stop)
            if alloc is None:
                return Range(self._unmapped, start, stop)
        key = (start, stop)
        rng = alloc.ranges.get(key)
        if rng is None:
            rng = alloc.ranges[key] = Range(alloc.id, start - alloc.start, stop - alloc.start)
        return rng

    def _ranges(self, objs) -> tuple:
        out = []
        for obj in objs:
            rng = self._range(obj)
            # _range hands out one Range object per (allocation, bytes): identity is equality here.
            if rng is not None and all(rng is not seen for seen in out):
                out.append(rng)
        return tuple(out)

    def _is_new(self, obj, serial0: int, tid: int) -> bool:
        """Whether array `obj` lives in an allocation this thread made after `serial0`."""
        if not isinstance(obj, self._ndarray) or obj.size == 0:
            return False
        ptr = obj.data.ptr
        alloc = self._find(ptr, ptr + 1)
        return alloc is not None and alloc.serial > serial0 and alloc.thread == tid and not alloc.external

    # --- delay injection ----------------------------------------------------------------
    def _targets(self, sid: int, name: str) -> bool:
        if self.delay_kernels and name not in self.delay_kernels:
            return False
        short = self._stream_names.get(sid, "")
        if self.delay_streams:
            return short in self.delay_streams or "all" in self.delay_streams
        if self.delay_kernels:
            return True
        return (zlib.crc32(short.encode()) + self.seed) % 2 == 0  # seed-chosen, as the sim's delay policy

    def _capturing(self, stream) -> bool:
        """Whether CUDA captures work issued to `stream` now (asked only while a capture is open)."""
        ptr = stream if isinstance(stream, int) else getattr(stream, "ptr", None)
        if ptr is None:
            ptr = getattr(stream, "cuda_stream", 0)
        try:
            return bool(self._runtime.streamIsCapturing(ptr))
        except Exception:  # an invalidated capture, or the legacy stream next to a blocking capture
            return True

    def _maybe_spin(self, stream, sid: int, name: str) -> None:
        if not self._targets(sid, name):
            return
        if stream is None or isinstance(stream, int):
            stream = self._current_stream()
        if self._captures and self._capturing(stream):
            # Captured work does not run now, so a spin would delay nothing; it would be baked
            # into the graph and replayed at every launch. Graph launches are delayed instead.
            return
        if self._spin is None:
            from .backends.cupy_backend import SpinDelay

            self._spin = SpinDelay.get()
        self._spin.enqueue(stream, self.delay_us)
        self.delays += 1

    # --- what the wrappers call ---------------------------------------------------------
    def launch(self, name: str, call, stream=None, reads=(), writes=(), site=None):
        """Record a launch of `name` on `stream` (None: current) and run `call()` after any spin."""
        site = site or self._site()
        tid = self._tid()
        sid = self._sid(stream)
        if self.delay_us:
            self._maybe_spin(stream, sid, name)
        try:
            result = _inside(call)
        except BaseException:
            if self._captures:  # refused during a capture (e.g. the legacy stream): the checker says why
                self._record(T.Launch(tid, site, stream=sid, name=name, reads=self._ranges(reads),
                                      writes=self._ranges(writes)))
            raise
        self._record(T.Launch(tid, site, stream=sid, name=name, reads=self._ranges(reads),
                              writes=self._ranges(writes)))
        return result

    def compute(self, name: str, fn, args, kwargs, inplace=(), h2d: bool = False, inputs=None):
        """An operation that launches on the current stream iff it allocates its result, writes
        `out=`, or works in place: record it that way. Reads: `inputs`, by default every array
        among the arguments."""
        site = self._site()
        tid = self._tid()
        stream = kwargs.get("stream") if hasattr(kwargs.get("stream"), "ptr") else None
        sid = self._sid(stream)
        serial0 = self._alloc_serial
        if self.delay_us:
            self._maybe_spin(stream, sid, name)
        result = _inside(fn, *args, **kwargs)
        out = kwargs.get("out")
        written = list(inplace) + _arrays(out if isinstance(out, (tuple, list)) else (out,))
        results = result if isinstance(result, (tuple, list)) else (result,)
        written += [r for r in results if self._is_new(r, serial0, tid)]
        if not written:
            return result  # a view, or nothing new: no kernel ran
        if inputs is None:
            inputs = _arrays(args) + _arrays(v for k, v in kwargs.items() if k != "out")
        writes = self._ranges(written)
        if h2d and not inputs:
            for rng in writes:
                self._record(T.Copy(tid, site, stream=sid, kind=CopyKind.H2D, src=None, dst=rng))
            return result
        # A range both read and written (in place) is recorded as a write: that conflicts with any
        # unordered access already, and one report per racing pair is enough.
        reads = tuple(r for r in self._ranges(inputs) if all(r is not w for w in writes))
        self._record(T.Launch(tid, site, stream=sid, name=name, reads=reads, writes=writes))
        return result

    def host_read(self, name: str, array, stream, blocking: bool, call):
        """A D2H copy of `array` on `stream` (None: current), then a sync of that stream."""
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        if self.delay_us:
            self._maybe_spin(stream, sid, name)
        result = _inside(call)
        rng = self._range(array)
        if rng is not None:
            self._record(T.Copy(tid, site, stream=sid, kind=CopyKind.D2H, src=rng, dst=None))
        if blocking:
            self._record(T.StreamSync(tid, site, stream=sid))
        return result

    def host_write(self, array, stream, call):
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        if self.delay_us:
            self._maybe_spin(stream, sid, "copy H2D")
        result = _inside(call)
        rng = self._range(array)
        if rng is not None:
            self._record(T.Copy(tid, site, stream=sid, kind=CopyKind.H2D, src=None, dst=rng))
        return result

    def kernel_access(self, name: str, code: Optional[str], args) -> tuple:
        """(reads, writes) of a raw kernel launch from its CUDA signature or declare_kernel."""
        spec = _KERNEL_ACCESS.get(name)
        if spec is None:
            key = (name, code)
            spec = self._signatures.get(key)
            if spec is None:
                sig = kernel_signature(code, name)
                # An array passed where the signature has no pointer: the kernel still gets its address.
                spec = {i: ("w" if k == "-" else k) for i, k in enumerate(sig)} if sig is not None else {}
                self._signatures[key] = spec
        reads, writes = [], []
        nd = self._ndarray
        for i, arg in enumerate(args):
            if not isinstance(arg, nd) and (isinstance(arg, _SCALARS) or
                                            not hasattr(arg, "__cuda_array_interface__")):
                continue
            kind = spec.get(i, "w")
            if kind == "r":
                reads.append(arg)
            elif kind != "-":
                writes.append(arg)
        return reads, writes

    def raw_launch(self, name: str, code: Optional[str], args, kwargs, call):
        reads, writes = self.kernel_access(name, code, args)
        return self.launch(name, call, stream=kwargs.get("stream"), reads=reads, writes=writes)

    def _call(self, call, op):
        """Run the real CuPy call. If CUDA refuses it while a capture is open (a sync of a
        capturing stream, a wait across the capture boundary, ...), record `op` anyway so the
        checker collects its own capture error naming this call, then re-raise CUDA's error."""
        try:
            return _inside(call)
        except BaseException:
            if self._captures and op is not None:
                self._record(op)
            raise

    def event_record(self, event, stream, call):
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        op = T.EventRecord(tid, site, event=self._eid(event), stream=sid) if event is not None else None
        result = self._call(call, op)
        if op is None:
            op = T.EventRecord(tid, site, event=self._eid(result), stream=sid)
        self._record(op)
        return result

    def stream_wait(self, stream, event, call):
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        eid = self._eid(event)
        op = T.StreamWait(tid, site, stream=sid, event=eid)
        result = self._call(call, op)
        self._record(op)
        return result

    def stream_sync(self, stream, call, only_if_true: bool = False):
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        op = T.StreamSync(tid, site, stream=sid)
        result = self._call(call, op)
        if not only_if_true or result:
            self._record(op)
        return result

    def event_sync(self, event, call, only_if_true: bool = False):
        site = self._site()
        tid = self._tid()
        eid = self._eid(event)
        op = T.EventSync(tid, site, event=eid)
        result = self._call(call, op)
        if not only_if_true or result:
            self._record(op)
        return result

    def device_sync(self, call):
        site = self._site()
        tid = self._tid()
        op = T.DeviceSync(tid, site)
        result = self._call(call, op)
        self._record(op)
        return result

    # --- stream capture (CUDA graphs) ---------------------------------------------------
    def capture_begin(self, stream, mode, call):
        """Stream.begin_capture: a CaptureBegin with a new graph id, after CUDA began it."""
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        try:
            capture_mode = capture_mode_of(mode, self._runtime)
        except ValueError as exc:  # CUDA refuses it too (cudaErrorInvalidValue); nothing began
            result = _inside(call)
            self.errors.append(f"begin_capture at {site}: {exc}; not recorded")
            return result
        with self._lock:
            gid = self._next_graph
            self._next_graph += 1
        op = T.CaptureBegin(tid, site, stream=sid, graph=gid, mode=capture_mode)
        # The refusals the checker knows (the legacy stream, a stream already capturing) are
        # recorded so its report names the call; anything else CUDA refuses began nothing.
        known_refusal = sid == 0 or sid in self._capture_origin or bool(self._captures and self._capturing(stream))
        try:
            result = _inside(call)
        except BaseException:
            if known_refusal:
                self._record(op)
            raise
        with self._lock:
            self._capture_origin[sid] = (gid, len(self.trace))
            self._captures += 1
        self._record(op)
        return result

    def capture_end(self, stream, call):
        """Stream.end_capture: a CaptureEnd, recorded whether or not CUDA produced a graph (the
        checker explains a refusal, e.g. an unjoined fork); the graph comes back proxied."""
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        begun = self._capture_origin.get(sid)
        try:
            graph = _inside(call)
        except BaseException:
            if begun is None:
                with self._lock:
                    gid = self._next_graph
                    self._next_graph += 1
            else:
                gid = begun[0]
                if not self._capturing(stream):  # CUDA ended the capture (unjoined, invalidated)
                    self._capture_ended(sid)
            self._record(T.CaptureEnd(tid, site, stream=sid, graph=gid))
            raise
        if begun is None:  # begun before this session started: nothing to check it against
            return graph
        gid, begin_index = begun
        self._capture_ended(sid)
        self._record(T.CaptureEnd(tid, site, stream=sid, graph=gid))
        names = captured_kernel_names(self.trace.ops[begin_index:], sid)
        return _GraphProxy(graph, gid, names, self)

    def _capture_ended(self, sid: int) -> None:
        with self._lock:
            if self._capture_origin.pop(sid, None) is not None:
                self._captures -= 1

    def graph_launch(self, gid: int, names: tuple, stream, call):
        """Graph.launch: one GraphLaunch on the stream (None: current), after any spin there."""
        site = self._site()
        tid = self._tid()
        sid = self._sid(stream)
        if self.delay_us:
            self._maybe_spin(stream, sid, graph_delay_name(names, self.delay_kernels))
        result = _inside(call)
        self._record(T.GraphLaunch(tid, site, stream=sid, graph=gid))
        return result

    # --- threads ------------------------------------------------------------------------
    def thread_starting(self) -> int:
        parent = self._tid()
        with self._lock:
            child = self._next_thread
            self._next_thread += 1
        self._record(T.ThreadStart(child, self._site(), parent=parent))
        return child

    def thread_running(self, child: int) -> None:
        with self._lock:
            self._threads[threading.get_ident()] = child

    def thread_joined(self, child: int) -> None:
        self._record(T.ThreadJoin(self._tid(), self._site(), child=child))

    # --- warm-up ------------------------------------------------------------------------
    def warm_up(self, pool_bytes: int = 64 << 20) -> None:
        """Get implicit synchronizations out of the way before the program runs (first cuBLAS
        call, CuPy's first kernels, the spin module, pool growth); record each as such."""
        cupy = self.cupy
        with suppressed():
            a = cupy.ones((8, 8), dtype=cupy.float32)
            (a @ a).sum()
            a[...] = a.copy()
            cupy.cuda.runtime.deviceSynchronize()
            self._implicit("warm-up: first cuBLAS call (handle creation) and CuPy's first kernels")
            if self.delay_us:
                from .backends.cupy_backend import SpinDelay

                self._spin = SpinDelay.get()
                self._implicit("warm-up: lazy module load of the streamcheck spin kernel")
            pool = cupy.get_default_memory_pool()
            before = pool.total_bytes()
            if pool.free_bytes() < pool_bytes:
                cupy.empty(pool_bytes, dtype=cupy.uint8)  # freed at once: the pool keeps the bytes
            if pool.total_bytes() > before:
                self._implicit(f"warm-up: memory pool growth by {pool.total_bytes() - before} bytes (cudaMalloc)")

    def preload(self, kernel) -> None:
        """Compile and load a RawKernel now: lazy loading at its first launch may synchronize
        the device and hide the very race a delay was meant to expose."""
        try:
            with suppressed():
                kernel.kernel
        except Exception:  # a compile error surfaces at the first call, as without streamcheck
            return
        self._implicit(f"module load of RawKernel `{kernel.name}` (loaded at definition, not at first launch)")


def _arrays(values) -> list:
    """Arrays among values (one level into lists/tuples, for concatenate & co.)."""
    session = _session
    nd = session._ndarray if session is not None else ()
    out = []
    for v in values:
        if v is None:
            continue
        if isinstance(v, nd) or hasattr(v, "__cuda_array_interface__"):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, nd) or hasattr(x, "__cuda_array_interface__"))
    return out


def _library_dirs() -> list:
    dirs = [_PACKAGE_DIR]
    for mod in ("cupy", "cupyx", "cupy_backends"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(m.__file__)))
    return dirs


# --- patching -----------------------------------------------------------------------------

class _Patcher:
    """Set attributes and remember how to undo it, in reverse order."""

    def __init__(self, session: Session):
        self.session = session
        self.undo: list = []  # callables

    def set(self, obj, name: str, value, what: str = "") -> bool:
        missing = object()
        own = getattr(obj, "__dict__", {})
        old = own.get(name, missing)
        try:
            setattr(obj, name, value)
        except (AttributeError, TypeError) as exc:
            self.session.unpatched.append(f"{what or name}: {exc}")
            return False

        def undo():
            if old is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self.undo.append(undo)
        return True

    def restore(self) -> None:
        while self.undo:
            undo = self.undo.pop()
            try:
                undo()
            except (AttributeError, TypeError):
                pass


_COMPUTE_METHODS = (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__",
    "__neg__", "__pos__", "__abs__", "__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__",
    "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__lt__", "__le__", "__gt__", "__ge__",
    "__eq__", "__ne__", "__getitem__", "sum", "prod", "mean", "var", "std", "max", "min", "argmax", "argmin",
    "all", "any", "cumsum", "cumprod", "dot", "astype", "copy", "clip", "round", "conj", "ravel", "flatten",
    "reshape", "take", "repeat", "argsort", "nonzero", "trace", "real", "imag",
)
_INPLACE_METHODS = ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__", "fill", "sort",
                    "put")
_HOST_READ_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__complex__", "__index__",
                      "__repr__", "__str__", "__format__")
_MODULE_COMPUTE = ("matmul", "dot", "vdot", "inner", "outer", "tensordot", "einsum", "kron", "concatenate", "stack",
                   "hstack", "vstack", "dstack", "where", "clip", "sum", "prod", "mean", "var", "std", "amax",
                   "amin", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "sort", "argsort", "zeros", "ones",
                   "full", "zeros_like", "ones_like", "full_like", "arange", "linspace", "eye", "identity", "copy",
                   "ascontiguousarray", "asfortranarray", "array", "asarray", "asanyarray", "tril", "triu", "diag",
                   "flip", "roll", "tile", "broadcast_to", "transpose", "reshape", "maximum", "minimum")
_H2D_FUNCS = ("array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray")
_CREATION_FUNCS = ("zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "linspace", "eye",
                   "identity")  # write their result; `*_like` reads only its argument's shape


class _UfuncProxy:
    """Stands in for a cupy.ufunc in the cupy namespace: records calls, forwards the rest."""

    def __init__(self, ufunc, name: str):
        self._ufunc = ufunc
        self.__name__ = name  # the name in the cupy namespace (CuPy's own is e.g. 'cupy_exp')
        self.__doc__ = getattr(ufunc, "__doc__", None)

    def __call__(self, *args, **kwargs):
        if _quiet():
            return self._ufunc(*args, **kwargs)
        return _session.compute(f"cupy.{self.__name__}", self._ufunc, args, kwargs)

    def __getattr__(self, name):
        attr = getattr(self._ufunc, name)
        if name in ("reduce", "accumulate", "outer", "reduceat") and callable(attr):
            label = f"cupy.{self.__name__}.{name}"

            def method(*args, **kwargs):
                if _quiet():
                    return attr(*args, **kwargs)
                return _session.compute(label, attr, args, kwargs)
            return method
        if name == "at" and callable(attr):
            label = f"cupy.{self.__name__}.at"

            def at(a, *args, **kwargs):
                if _quiet():
                    return attr(a, *args, **kwargs)
                return _session.compute(label, attr, (a,) + args, kwargs, inplace=(a,))
            return at
        return attr

    def __repr__(self):
        return f"<streamcheck-recorded {self._ufunc!r}>"


class _KernelProxy:
    """A RawKernel from RawModule.get_function (built inside CuPy, so not our subclass)."""

    def __init__(self, kernel, name: str):
        object.__setattr__(self, "_kernel", kernel)
        object.__setattr__(self, "_name", name)

    def __call__(self, grid, block, args, **kwargs):
        kernel = self._kernel
        if _quiet():
            return kernel(grid, block, args, **kwargs)
        return _session.raw_launch(self._name, kernel.code, args, kwargs,
                                   lambda: kernel(grid, block, args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __setattr__(self, name, value):
        setattr(self._kernel, name, value)


class _GraphProxy:
    """What Stream.end_capture returns while a session records: CuPy's Graph (a Cython class,
    whose launch cannot be patched) with `launch` recorded as a GraphLaunch of this graph's
    id; everything else (upload, debug_dot_str, ...) is the Graph's own. Launched while no
    session, or another one, records, it just launches."""

    __slots__ = ("graph", "graph_id", "kernel_names", "_session")

    def __init__(self, graph, graph_id: int, kernel_names: tuple, session: Session):
        self.graph = graph
        self.graph_id = graph_id
        self.kernel_names = kernel_names
        self._session = session

    def launch(self, stream=None):
        graph = self.graph
        if _quiet() or _session is not self._session:
            return graph.launch(stream)
        return _session.graph_launch(self.graph_id, self.kernel_names, stream, lambda: graph.launch(stream))

    def __getattr__(self, name):
        return getattr(self.graph, name)

    def __repr__(self):
        return f"<streamcheck-recorded graph {self.graph_id}: {self.graph!r}>"


def _install(session: Session) -> _Patcher:
    cupy = session.cupy
    p = _Patcher(session)
    stream_mod = cupy.cuda.stream
    Event = stream_mod.Event
    BaseStream = stream_mod._BaseStream
    Stream = stream_mod.Stream

    # --- events and streams (plain Python classes in CuPy: patch their methods) --------
    ev_record, ev_sync = Event.record, Event.synchronize
    ev_done = Event.__dict__.get("done")

    def event_record(self, stream=None):
        if _quiet():
            return ev_record(self, stream)
        return _session.event_record(self, stream, lambda: ev_record(self, stream))

    def event_synchronize(self):
        if _quiet():
            return ev_sync(self)
        return _session.event_sync(self, lambda: ev_sync(self))

    p.set(Event, "record", event_record)
    p.set(Event, "synchronize", event_synchronize)
    if isinstance(ev_done, property):
        def event_done(self):
            if _quiet():
                return ev_done.fget(self)
            return _session.event_sync(self, lambda: ev_done.fget(self), only_if_true=True)
        p.set(Event, "done", property(event_done))

    st_record, st_wait, st_sync = BaseStream.record, BaseStream.wait_event, BaseStream.synchronize
    st_done = BaseStream.__dict__.get("done")

    def stream_record(self, event=None):
        if _quiet():
            return st_record(self, event)
        return _session.event_record(event, self, lambda: st_record(self, event))

    def stream_wait_event(self, event):
        if _quiet():
            return st_wait(self, event)
        return _session.stream_wait(self, event, lambda: st_wait(self, event))

    def stream_synchronize(self):
        if _quiet():
            return st_sync(self)
        return _session.stream_sync(self, lambda: st_sync(self))

    p.set(BaseStream, "record", stream_record)
    p.set(BaseStream, "wait_event", stream_wait_event)
    p.set(BaseStream, "synchronize", stream_synchronize)
    if isinstance(st_done, property):
        def stream_done(self):
            if _quiet():
                return st_done.fget(self)
            return _session.stream_sync(self, lambda: st_done.fget(self), only_if_true=True)
        p.set(BaseStream, "done", property(stream_done))

    # --- stream capture: begin/end are plain Python methods; is_capturing needs no record --
    st_begin, st_end = BaseStream.__dict__.get("begin_capture"), BaseStream.__dict__.get("end_capture")
    if st_begin is not None and st_end is not None:
        def stream_begin_capture(self, mode=None):
            if _quiet():
                return st_begin(self, mode)
            return _session.capture_begin(self, mode, lambda: st_begin(self, mode))

        def stream_end_capture(self):
            if _quiet():
                return st_end(self)
            return _session.capture_end(self, lambda: st_end(self))

        p.set(BaseStream, "begin_capture", stream_begin_capture, "cupy.cuda.Stream.begin_capture")
        p.set(BaseStream, "end_capture", stream_end_capture, "cupy.cuda.Stream.end_capture")
    else:
        session.unpatched.append("cupy.cuda.Stream.begin_capture / end_capture: not in this CuPy version")

    st_init = Stream.__init__

    def stream_init(self, *args, **kwargs):
        st_init(self, *args, **kwargs)
        s = _session
        if s is not None and not getattr(_tls, "suppress", 0) and self.ptr not in (0, 1, 2):
            s._register_stream(self.ptr, s._site(), fresh=True)  # a new stream (its pointer may be reused)

    p.set(Stream, "__init__", stream_init)

    # --- device synchronize ---------------------------------------------------------------
    rt = cupy.cuda.runtime
    dev_sync = rt.deviceSynchronize

    def device_synchronize():
        if _quiet():
            return dev_sync()
        return _session.device_sync(dev_sync)

    p.set(rt, "deviceSynchronize", device_synchronize, "cupy.cuda.runtime.deviceSynchronize")
    Device = cupy.cuda.Device
    try:
        class _Device(Device):
            def synchronize(self):
                if _quiet():
                    return Device.synchronize(self)
                return _session.device_sync(lambda: Device.synchronize(self))
        _Device.__name__ = _Device.__qualname__ = "Device"
        p.set(cupy.cuda, "Device", _Device, "cupy.cuda.Device")
        p.set(cupy.cuda.device, "Device", _Device, "cupy.cuda.device.Device")
    except TypeError as exc:
        session.unpatched.append(f"cupy.cuda.Device.synchronize: {exc}")

    # --- raw kernels ----------------------------------------------------------------------
    RawKernel, RawModule = cupy.RawKernel, cupy.RawModule
    try:
        class _RawKernel(RawKernel):
            def __init__(self, *args, **kwargs):
                RawKernel.__init__(self, *args, **kwargs)
                s = _session
                if s is not None and not getattr(_tls, "suppress", 0):
                    s.preload(self)

            def __call__(self, grid, block, args, **kwargs):
                if _quiet():
                    return RawKernel.__call__(self, grid, block, args, **kwargs)
                return _session.raw_launch(self.name, self.code, args, kwargs,
                                           lambda: RawKernel.__call__(self, grid, block, args, **kwargs))
        _RawKernel.__name__ = _RawKernel.__qualname__ = "RawKernel"
        p.set(cupy, "RawKernel", _RawKernel, "cupy.RawKernel")
        p.set(cupy._core, "RawKernel", _RawKernel, "cupy._core.RawKernel")
    except TypeError as exc:
        session.unpatched.append(f"cupy.RawKernel: {exc}")
    try:
        class _RawModule(RawModule):
            def get_function(self, name):
                kernel = RawModule.get_function(self, name)
                return _KernelProxy(kernel, name)
        _RawModule.__name__ = _RawModule.__qualname__ = "RawModule"
        p.set(cupy, "RawModule", _RawModule, "cupy.RawModule")
        p.set(cupy._core, "RawModule", _RawModule, "cupy._core.RawModule")
    except TypeError as exc:
        session.unpatched.append(f"cupy.RawModule: {exc}")

    # --- elementwise and reduction kernels ------------------------------------------------
    EK = cupy.ElementwiseKernel
    try:
        class _ElementwiseKernel(EK):
            def __init__(self, in_params, out_params, operation, name="kernel", *args, **kwargs):
                EK.__init__(self, in_params, out_params, operation, name, *args, **kwargs)
                self._sc = (name, len(_param_names(in_params)), len(_param_names(out_params)))

            def __call__(self, *args, **kwargs):
                if _quiet():
                    return EK.__call__(self, *args, **kwargs)
                name, nin, nout = self._sc
                return _session.compute(name, lambda *a, **k: EK.__call__(self, *a, **k), args, kwargs,
                                        inplace=_arrays(args[nin:nin + nout]), inputs=_arrays(args[:nin]))
        _ElementwiseKernel.__name__ = _ElementwiseKernel.__qualname__ = "ElementwiseKernel"
        p.set(cupy, "ElementwiseKernel", _ElementwiseKernel, "cupy.ElementwiseKernel")
        p.set(cupy._core, "ElementwiseKernel", _ElementwiseKernel, "cupy._core.ElementwiseKernel")
    except TypeError as exc:
        session.unpatched.append(f"cupy.ElementwiseKernel: {exc}")
    RK = cupy.ReductionKernel
    try:
        class _ReductionKernel(RK):
            def __init__(self, in_params, out_params, *args, **kwargs):
                RK.__init__(self, in_params, out_params, *args, **kwargs)
                name = args[4] if len(args) > 4 else kwargs.get("name", "reduce_kernel")
                self._sc = (name, len(_param_names(in_params)), len(_param_names(out_params)))

            def __call__(self, *args, **kwargs):
                if _quiet():
                    return RK.__call__(self, *args, **kwargs)
                name, nin, nout = self._sc
                return _session.compute(name, lambda *a, **k: RK.__call__(self, *a, **k), args, kwargs,
                                        inplace=_arrays(args[nin:nin + nout]), inputs=_arrays(args[:nin]))
        _ReductionKernel.__name__ = _ReductionKernel.__qualname__ = "ReductionKernel"
        p.set(cupy, "ReductionKernel", _ReductionKernel, "cupy.ReductionKernel")
        p.set(cupy._core, "ReductionKernel", _ReductionKernel, "cupy._core.ReductionKernel")
    except TypeError as exc:
        session.unpatched.append(f"cupy.ReductionKernel: {exc}")

    # --- ndarray methods and operators ------------------------------------------------------
    nd = cupy.ndarray
    for name in _COMPUTE_METHODS:
        orig = getattr(nd, name, None)
        if orig is not None:
            p.set(nd, name, _compute_method(f"ndarray.{name}", orig), f"cupy.ndarray.{name}")
    for name in _INPLACE_METHODS:
        orig = getattr(nd, name, None)
        if orig is not None:
            p.set(nd, name, _inplace_method(f"ndarray.{name}", orig), f"cupy.ndarray.{name}")
    for name in _HOST_READ_METHODS:
        orig = getattr(nd, name, None)
        if orig is not None:
            p.set(nd, name, _host_read_method(f"ndarray.{name}", orig), f"cupy.ndarray.{name}")
    p.set(nd, "__setitem__", _setitem(nd.__setitem__, nd.__getitem__), "cupy.ndarray.__setitem__")
    nd_get, nd_set = nd.get, nd.set

    def get(self, *args, **kwargs):
        if _quiet():
            return nd_get(self, *args, **kwargs)
        stream = kwargs.get("stream", args[0] if args else None)
        blocking = kwargs.get("blocking", args[3] if len(args) > 3 else True)
        return _session.host_read("ndarray.get", self, stream, bool(blocking),
                                  lambda: nd_get(self, *args, **kwargs))

    def set_(self, arr, stream=None):
        if _quiet():
            return nd_set(self, arr, stream)
        return _session.host_write(self, stream, lambda: nd_set(self, arr, stream))

    p.set(nd, "get", get, "cupy.ndarray.get")
    p.set(nd, "set", set_, "cupy.ndarray.set")

    # --- module functions -------------------------------------------------------------------
    for name in _MODULE_COMPUTE:
        fn = getattr(cupy, name, None)
        if fn is not None and callable(fn) and not isinstance(fn, type):
            p.set(cupy, name, _compute_function(f"cupy.{name}", fn, h2d=name in _H2D_FUNCS,
                                                creation=name in _CREATION_FUNCS), f"cupy.{name}")
    ufunc_type = cupy.ufunc
    for name, value in list(vars(cupy).items()):
        if isinstance(value, ufunc_type) and name not in _MODULE_COMPUTE:
            p.set(cupy, name, _UfuncProxy(value, name), f"cupy.{name}")
    copyto = cupy.copyto

    def copyto_(dst, src, *args, **kwargs):
        if _quiet():
            return copyto(dst, src, *args, **kwargs)
        return _session.compute("cupy.copyto", copyto, (dst, src) + args, kwargs, inplace=(dst,))

    p.set(cupy, "copyto", copyto_, "cupy.copyto")
    asnumpy = cupy.asnumpy

    def asnumpy_(a, stream=None, *args, **kwargs):
        if _quiet() or isinstance(a, nd) or not hasattr(a, "__cuda_array_interface__"):
            return asnumpy(a, stream, *args, **kwargs)  # ndarray: recorded by ndarray.get
        return _session.host_read("cupy.asnumpy", a, stream, kwargs.get("blocking", True),
                                  lambda: asnumpy(a, stream, *args, **kwargs))

    p.set(cupy, "asnumpy", asnumpy_, "cupy.asnumpy")

    # --- the allocator ----------------------------------------------------------------------
    memory = cupy.cuda.memory
    orig_set_allocator, orig_get_allocator = memory.set_allocator, memory.get_allocator

    def set_allocator(allocator=None):
        orig_set_allocator(allocator)  # CuPy resolves None to its raw allocator
        orig_set_allocator(_wrap_allocator(session, orig_get_allocator()))

    previous = orig_get_allocator()
    orig_set_allocator(_wrap_allocator(session, previous))
    p.undo.append(lambda: orig_set_allocator(previous))
    p.set(memory, "set_allocator", set_allocator, "cupy.cuda.memory.set_allocator")
    p.set(cupy.cuda, "set_allocator", set_allocator, "cupy.cuda.set_allocator")

    # --- host threads -----------------------------------------------------------------------
    th_start, th_join = threading.Thread.start, threading.Thread.join

    def thread_start(self):
        s = _session
        if s is None or getattr(_tls, "suppress", 0):
            return th_start(self)
        child = s.thread_starting()
        run = self.run

        def run_registered():
            if _session is s:
                s.thread_running(child)
            run()
        self.run = run_registered
        self._streamcheck_tid = child
        return th_start(self)

    def thread_join(self, timeout=None):
        result = th_join(self, timeout)
        s = _session
        child = getattr(self, "_streamcheck_tid", None)
        if s is not None and child is not None and not self.is_alive():
            s.thread_joined(child)
        return result

    p.set(threading.Thread, "start", thread_start, "threading.Thread.start")
    p.set(threading.Thread, "join", thread_join, "threading.Thread.join")
    _patch_torch(session, p)
    return p


def _wrap_allocator(session: Session, allocator):
    """CuPy allocator that records each allocation and hands CuPy memory whose last reference
    records the free (UnownedMemory owned by an _Owner holding the real MemoryPointer)."""
    if getattr(allocator, "_streamcheck_session", None) is session:
        return allocator
    cupy = session.cupy
    MemoryPointer, UnownedMemory = cupy.cuda.memory.MemoryPointer, cupy.cuda.memory.UnownedMemory
    pool = getattr(allocator, "__self__", None)
    total = getattr(pool, "total_bytes", None)

    def malloc(size):
        if _session is not session or getattr(_tls, "suppress", 0):
            return allocator(size)
        before = total() if total is not None else 0
        memptr = allocator(size)
        if size == 0 or not memptr.ptr:
            return memptr
        try:
            alloc = session._on_alloc(memptr.ptr, size)
            if total is not None and total() > before:
                session._implicit(f"memory pool growth by {total() - before} bytes (cudaMalloc)")
            owner = _Owner(session, alloc, memptr)
            device_id = getattr(memptr, "device_id", -1)
            return MemoryPointer(UnownedMemory(memptr.ptr, size, owner, device_id), 0)
        except Exception as exc:  # recording must never break the program's allocation
            session.errors.append(f"allocation of {size} bytes: {exc}")
            return memptr

    malloc._streamcheck_session = session
    malloc.__wrapped__ = allocator
    return malloc


def _compute_method(label: str, orig):
    def method(self, *args, **kwargs):
        if _quiet():
            return orig(self, *args, **kwargs)
        return _session.compute(label, orig, (self,) + args, kwargs)
    method.__name__ = getattr(orig, "__name__", label)
    return method


def _inplace_method(label: str, orig):
    def method(self, *args, **kwargs):
        if _quiet():
            return orig(self, *args, **kwargs)
        return _session.compute(label, orig, (self,) + args, kwargs, inplace=(self,))
    method.__name__ = getattr(orig, "__name__", label)
    return method


def _host_read_method(label: str, orig):
    def method(self, *args, **kwargs):
        if _quiet():
            return orig(self, *args, **kwargs)
        return _session.host_read(label, self, None, True, lambda: orig(self, *args, **kwargs))
    method.__name__ = getattr(orig, "__name__", label)
    return method


def _setitem(orig_set, orig_get):
    def __setitem__(self, key, value):
        if _quiet():
            return orig_set(self, key, value)
        session = _session
        target = self
        try:
            view = _inside(orig_get, self, key)
            if isinstance(view, session._ndarray) and view.data.mem is self.data.mem:
                target = view  # basic indexing: only the view's bytes are written
        except Exception:
            pass
        reads = _arrays((value,))
        return session.launch("ndarray.__setitem__", lambda: orig_set(self, key, value), reads=reads,
                              writes=(target,))
    return __setitem__


def _compute_function(label: str, fn, h2d: bool = False, creation: bool = False):
    def function(*args, **kwargs):
        if _quiet():
            return fn(*args, **kwargs)
        return _session.compute(label, fn, args, kwargs, h2d=h2d, inputs=() if creation else None)
    function.__name__ = getattr(fn, "__name__", label)
    function.__doc__ = getattr(fn, "__doc__", None)
    function.__wrapped__ = fn
    return function


def _patch_torch(session: Session, patcher: Optional[_Patcher] = None) -> None:
    """torch.cuda.synchronize is a device synchronize; patch it if torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(session, "_torch_patched", False):
        return
    cuda = getattr(torch, "cuda", None)
    sync = getattr(cuda, "synchronize", None)
    if sync is None:
        return
    session._torch_patched = True

    def synchronize(device=None):
        if _quiet():
            return sync(device)
        return _session.device_sync(lambda: sync(device))

    p = patcher or session._patcher
    p.set(cuda, "synchronize", synchronize, "torch.cuda.synchronize")


# --- public API ---------------------------------------------------------------------------

def start(*, delay_us: float = 0.0, delay_streams=(), delay_kernels=(), seed: int = 0, warm_up: bool = True,
          check: bool = True) -> Session:
    """Begin recording (see instrument()). Raises InstrumentError without a GPU or if a session
    is already active."""
    global _session
    if _session is not None:
        raise InstrumentError("streamcheck.instrument: a session is already recording; stop it first "
                              "(sessions do not nest)")
    from .backends import gpu_available

    if not gpu_available():
        raise InstrumentError("streamcheck.instrument needs an NVIDIA GPU and CuPy (pip install "
                              "'streamcheck[gpu]'); none found here. The device API's sim backend "
                              "(Device('sim')) checks stream programs on the CPU.")
    session = Session(delay_us=delay_us, delay_streams=delay_streams, delay_kernels=delay_kernels, seed=seed,
                      check=check)
    session._patcher = _install(session)
    _session = session
    if warm_up:
        session.warm_up()
    return session


def stop() -> Optional[Session]:
    """Stop recording, undo every patch, and return the session (None if none was active)."""
    global _session
    session = _session
    if session is None:
        return None
    _session = None
    session._patcher.restore()
    return session


@contextlib.contextmanager
def instrument(*, delay_us: float = 0.0, delay_streams=(), delay_kernels=(), seed: int = 0,
               warm_up: bool = True):
    """Record and check the CuPy work issued inside the block; yields the Session.

    delay_us: spin this long (bounded, ≤ 50 ms) on targeted streams before each launch/copy,
    so that races strike. delay_streams: short stream names to target ("legacy", "s1", "s2", ...
    in creation order, "ptds<thread>", or "all"); none named: seed-chosen.
    delay_kernels: only before these kernels. warm_up: get implicit syncs out of the way first."""
    session = start(delay_us=delay_us, delay_streams=delay_streams, delay_kernels=delay_kernels, seed=seed,
                    warm_up=warm_up)
    try:
        yield session
    finally:
        stop()


def declare_access(reads=(), writes=(), *, stream=None, name: str = "declared access") -> None:
    """Record work streamcheck cannot see (torch ops, kernels launched through ctypes or
    another library) as a launch on `stream` (a CuPy or torch stream; None: CuPy's current
    stream) reading `reads` and writing `writes` (CuPy arrays or __cuda_array_interface__
    objects such as torch tensors). Does nothing when no session is recording."""
    session = _session
    if session is None or getattr(_tls, "suppress", 0):
        return
    site = session._site()
    tid = session._tid()
    sid = session._sid(stream)
    session._record(T.Launch(tid, site, stream=sid, name=name, reads=session._ranges(_arrays(reads)),
                             writes=session._ranges(_arrays(writes))))


def torch_stream():
    """torch's current stream as a CuPy stream, to use as the caller's stream of CuPy code
    inside a torch model: `with torch_stream(): flashnorm(x)`."""
    import cupy
    import torch

    from .backends.cupy_backend import _external_stream

    ptr = torch.cuda.current_stream().cuda_stream
    if ptr == 0:
        return cupy.cuda.Stream.null  # torch's default stream is the legacy default stream
    session = _session
    if session is not None and session._stream_key(ptr) not in session._streams:
        session._register_stream(ptr, session._site(), short="torch")  # `--delay-stream torch` targets it
    return _external_stream(cupy, ptr)


class _InstrumentModule(types.ModuleType):
    """`streamcheck.instrument` is both this module and the context manager: importing the
    submodule rebinds the package attribute to the module, so the module itself is callable."""

    def __call__(self, **kwargs):
        return instrument(**kwargs)


sys.modules[__name__].__class__ = _InstrumentModule
