"""The trace: what a stream program asked the device to do, in host issue order.

Pure data. Backends append operations here as the program issues them; the
happens-before checker (hb.py), the exporters and the reports read it. Nothing in
this module knows about CuPy, torch or the simulator.

Ids are small integers chosen by whoever records the trace (the device API).
Every operation carries the host thread that issued it and the Python call site.
"""
from __future__ import annotations

import enum
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Optional, Union


def _parse_choice(cls, value, what: str):
    """A member of the str enum `cls` from itself or its value ("non-blocking" works too)."""
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).replace("-", "_"))
    except ValueError:
        choices = ", ".join(member.value for member in cls)
        raise ValueError(f"unknown {what} {value!r}; choose one of: {choices}") from None


class StreamKind(str, enum.Enum):
    """How a stream synchronizes with the legacy default stream (CUDA programming guide)."""

    LEGACY = "legacy"  # stream 0 / cudaStreamLegacy
    PER_THREAD = "per_thread"  # cudaStreamPerThread: behaves like a blocking stream
    BLOCKING = "blocking"  # cudaStreamCreate / cudaStreamDefault
    NON_BLOCKING = "non_blocking"  # cudaStreamNonBlocking: never syncs with legacy

    @property
    def joins_legacy(self) -> bool:
        """Blocking and per-thread default streams synchronize with the legacy stream."""
        return self in (StreamKind.BLOCKING, StreamKind.PER_THREAD)

    @classmethod
    def parse(cls, value: Union[str, "StreamKind"]) -> "StreamKind":
        return _parse_choice(cls, value, "stream kind")


def stream_label(kind: StreamKind, name: str, stream: int, thread: int) -> str:
    """How reports name a stream: "stream A", the legacy default stream, or a thread's own.
    With several devices in use the checker adds the device (device_label)."""
    if kind is StreamKind.LEGACY:
        return name or "legacy default stream"
    if kind is StreamKind.PER_THREAD:
        return name or f"per-thread default stream of thread {thread}"
    return f"stream {name}" if name else f"stream{stream}"


def device_label(label: str, device: int) -> str:
    """A stream's label with its device, as reports name it when more than one device is in use."""
    return f"{label} (cuda:{device})"


@dataclass(frozen=True)
class CallSite:
    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


UNKNOWN_SITE = CallSite("<unknown>", 0)


class SiteResolver:
    """The user's line that issued a call: the first frame outside `internal` (path prefixes:
    the recording machinery and the libraries it wraps). Runs once per recorded operation, so
    both the per-file verdict and the sites are cached, keyed by file name (whose hash Python
    caches) rather than by code object (whose hash it recomputes)."""

    def __init__(self, internal):
        self.internal = tuple(internal)
        self._inside: dict = {}  # file name -> frame is machinery
        self._sites: dict = {}  # (file name, line) -> CallSite

    def __call__(self, depth_limit: int = 64) -> CallSite:
        frame = sys._getframe(1)
        inside = self._inside
        for _ in range(depth_limit):
            if frame is None:
                break
            filename = frame.f_code.co_filename
            skipped = inside.get(filename)
            if skipped is None:
                path = filename if filename.startswith("<") else os.path.abspath(filename)
                skipped = inside[filename] = path.startswith(self.internal)
            if not skipped:
                key = (filename, frame.f_lineno)
                site = self._sites.get(key)
                if site is None:
                    site = self._sites[key] = CallSite(filename, frame.f_lineno, frame.f_code.co_name)
                return site
            frame = frame.f_back
        return UNKNOWN_SITE


@dataclass(frozen=True)
class Range:
    """Bytes [start, stop) of one allocation."""

    buffer: int
    start: int
    stop: int

    def overlaps(self, other: "Range") -> bool:
        return self.buffer == other.buffer and self.start < other.stop and other.start < self.stop


# --- operations -----------------------------------------------------------------------------
# Each is frozen; `thread` is the issuing host thread, `site` the user's call site.


@dataclass(frozen=True)
class Op:
    thread: int
    site: CallSite


@dataclass(frozen=True)
class ThreadStart(Op):
    """`thread` starts; everything its parent did so far happens before it."""

    parent: Optional[int] = None


@dataclass(frozen=True)
class ThreadJoin(Op):
    """`thread` joins `child`: everything the child did happens before what follows."""

    child: int = 0


@dataclass(frozen=True)
class StreamCreate(Op):
    """A stream of `device` (the device index, as in cuda:N). Each device has its own legacy
    default stream; blocking streams synchronize only with their own device's."""

    stream: int = 0
    kind: StreamKind = StreamKind.NON_BLOCKING
    name: str = ""
    device: int = 0


@dataclass(frozen=True)
class EventCreate(Op):
    event: int = 0
    name: str = ""


@dataclass(frozen=True)
class EventDestroy(Op):
    event: int = 0


@dataclass(frozen=True)
class EventRecord(Op):
    event: int = 0
    stream: int = 0


@dataclass(frozen=True)
class StreamWait(Op):
    """cudaStreamWaitEvent: later work on `stream` waits for the event's state *now*."""

    stream: int = 0
    event: int = 0


# `cause` on the host synchronizations: the call that synchronized, when it is not the plain
# synchronize() (a host read such as "ndarray.get" or ".item()"); the sync audit names it.


@dataclass(frozen=True)
class StreamSync(Op):
    stream: int = 0
    cause: str = ""


@dataclass(frozen=True)
class EventSync(Op):
    event: int = 0
    cause: str = ""


@dataclass(frozen=True)
class DeviceSync(Op):
    """cudaDeviceSynchronize of `device`: orders the host after that device's streams only."""

    device: int = 0
    cause: str = ""


@dataclass(frozen=True)
class StreamQuery(Op):
    """cudaStreamQuery (`Stream.query()`, CuPy's `stream.done`): `done` is what it returned. A query
    that returned done orders the host after everything issued to the stream so far, as a
    synchronize would; one that returned not-done orders nothing."""

    stream: int = 0
    done: bool = False


@dataclass(frozen=True)
class EventQuery(Op):
    """cudaEventQuery (`Event.query()`, CuPy's `event.done`): done orders the host after the work the
    event captured (at once for a never-recorded event, which orders nothing); not-done orders nothing."""

    event: int = 0
    done: bool = False


@dataclass(frozen=True)
class PeerAccess(Op):
    """cudaDeviceEnablePeerAccess: kernels on `device` may access memory of `peer` from now on
    (one direction only). Not a synchronization. Copies between devices never need it (CUDA
    stages them through the host); a kernel touching another device's memory without it faults."""

    device: int = 0
    peer: int = 0


@dataclass(frozen=True)
class Alloc(Op):
    """`nbytes` of memory on `device`."""

    buffer: int = 0
    nbytes: int = 0
    name: str = ""
    device: int = 0


@dataclass(frozen=True)
class Free(Op):
    """Return memory for reuse. With a stream it is stream-ordered (pool allocators): the pool
    hands the bytes to the next allocation on that stream. `also`: streams whose work issued so
    far is ordered before the reuse too (torch's `tensor.record_stream(s)`: the caching allocator
    waits for an event it records on each such stream at the free). `pool`: the allocator, for
    the report's fix ("torch" suggests record_stream)."""

    buffer: int = 0
    stream: Optional[int] = None
    also: tuple = ()
    pool: str = ""


@dataclass(frozen=True)
class Launch(Op):
    stream: int = 0
    name: str = ""
    reads: tuple = ()
    writes: tuple = ()


class CopyKind(str, enum.Enum):
    H2D = "H2D"
    D2H = "D2H"
    D2D = "D2D"
    PEER = "P2P"  # between two devices (cudaMemcpyPeerAsync): reads src's device, writes dst's


@dataclass(frozen=True)
class Copy(Op):
    """An async copy: an access on its stream like a kernel (device side only)."""

    stream: int = 0
    kind: CopyKind = CopyKind.D2D
    src: Optional[Range] = None  # None for host memory
    dst: Optional[Range] = None

    @property
    def reads(self) -> tuple:
        return (self.src,) if self.src is not None else ()

    @property
    def writes(self) -> tuple:
        return (self.dst,) if self.dst is not None else ()

    @property
    def name(self) -> str:
        return f"copy {self.kind.value}"


@dataclass(frozen=True)
class HostAccess(Op):
    """The host reads or writes device memory directly (mapped memory, or after a sync)."""

    reads: tuple = ()
    writes: tuple = ()
    name: str = "host access"


@dataclass(frozen=True)
class ImplicitSync(Op):
    """Something that often *behaves* like a sync but CUDA does not promise it is one:
    first cuBLAS call, lazy module loading, memory-pool growth (cudaMalloc), a
    synchronous copy from pageable memory. Recorded for the timeline; the checker
    deliberately draws no edge from it."""

    reason: str = ""


class CaptureMode(str, enum.Enum):
    """cudaStreamCaptureMode: which other threads' unsafe calls a capture forbids."""

    GLOBAL = "global"
    THREAD_LOCAL = "thread_local"
    RELAXED = "relaxed"

    @classmethod
    def parse(cls, value: Union[str, "CaptureMode"]) -> "CaptureMode":
        return _parse_choice(cls, value, "capture mode")


@dataclass(frozen=True)
class CaptureBegin(Op):
    """cudaStreamBeginCapture: work issued to `stream` (and to streams that fork from it
    through events) is recorded into graph `graph` instead of executing."""

    stream: int = 0
    graph: int = 0
    mode: CaptureMode = CaptureMode.GLOBAL


@dataclass(frozen=True)
class CaptureEnd(Op):
    """cudaStreamEndCapture on the stream that began the capture."""

    stream: int = 0
    graph: int = 0


@dataclass(frozen=True)
class GraphLaunch(Op):
    """cudaGraphLaunch: the whole captured graph runs as one unit of work on `stream`."""

    stream: int = 0
    graph: int = 0


StreamOp = (EventRecord, StreamWait, Launch, Copy)


@dataclass
class Trace:
    """Operations in host issue order, plus the names the reports need."""

    ops: list = field(default_factory=list)

    def append(self, op: Op) -> None:
        self.ops.append(op)

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    def to_json(self) -> str:
        return json.dumps([op_to_dict(op) for op in self.ops])


def op_to_dict(op: Op) -> dict:
    d = asdict(op)
    d["op"] = type(op).__name__
    d["site"] = str(op.site)
    for key, value in list(d.items()):
        if isinstance(value, enum.Enum):
            d[key] = value.value
    return d
