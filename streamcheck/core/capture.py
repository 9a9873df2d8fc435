"""CUDA stream capture: which operations go into a graph instead of executing, and the
errors CUDA raises for captures it cannot turn into a graph.

Pure bookkeeping over trace records, shared by the happens-before checker (hb.py) and the
simulated device (device/backends/sim.py), so both agree on what a capture contains. The rules
(CUDA programming guide, "Stream Capture"; docs/cuda-rules.md section 8):
- work issued to a capturing stream is recorded as graph nodes, not executed;
- a stream joins a capture by waiting on an event recorded inside it (a fork); every
  forked stream that captured work must be joined back into the origin stream before
  end_capture (cudaErrorStreamCaptureUnjoined; a fork with no work needs no join);
- only in-stream order crosses the capture boundary: a capturing stream may not wait on
  an event recorded outside the capture (cudaErrorStreamCaptureIsolation), nor on one
  recorded in another capture (cudaErrorStreamCaptureMerge, which invalidates both);
- synchronizing a capturing stream or the device is illegal
  (cudaErrorStreamCaptureUnsupported); an event last recorded inside a capture records
  nothing on the device: CUDA refuses to synchronize it during the capture
  (cudaErrorCapturedEvent) and, once the capture has ended, to synchronize or wait on it
  (cudaErrorInvalidValue) until it is recorded again;
- the legacy default stream cannot be captured, and using it while a blocking stream
  captures would create an implicit dependency (cudaErrorStreamCaptureImplicit);
- a capture not begun in relaxed mode must end on the thread that began it
  (cudaErrorStreamCaptureWrongThread), and on the stream that began it
  (cudaErrorStreamCaptureUnmatched);
- tests/streamcheck/core/test_capture_rules_gpu.py holds these error codes against CUDA's on a GPU.
An error invalidates the capture, as in CUDA: its end_capture then fails too.

Inside a capture, graph order is tracked with per-capture vector clocks over member
streams: node j is ordered after node i when j.clock[i.stream] >= i.seq.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .trace import (
    CallSite,
    CaptureBegin,
    CaptureEnd,
    CaptureMode,
    EventRecord,
    Op,
    StreamKind,
    StreamWait,
)


# What cudaGetErrorString says for each error a capture can end in: the text torch puts after "CUDA error: ".
CUDA_ERROR_STRINGS = {
    "cudaErrorInvalidValue": "invalid argument",
    "cudaErrorIllegalState": "the operation cannot be performed in the present state",
    "cudaErrorStreamCaptureUnsupported": "operation not permitted when stream is capturing",
    "cudaErrorStreamCaptureInvalidated": "operation failed due to a previous error during capture",
    "cudaErrorStreamCaptureMerge": "operation would result in a merge of separate capture sequences",
    "cudaErrorStreamCaptureUnmatched": "capture was not ended in the same stream as it began",
    "cudaErrorStreamCaptureUnjoined": "capturing stream has unjoined work",
    "cudaErrorStreamCaptureIsolation": "dependency created on uncaptured work in another stream",
    "cudaErrorStreamCaptureImplicit": "operation would make the legacy stream depend on a capturing blocking stream",
    "cudaErrorCapturedEvent": "operation not permitted on an event last recorded in a capturing stream",
    "cudaErrorStreamCaptureWrongThread": "attempt to terminate a thread-local capture sequence from another thread",
}


class CaptureError(RuntimeError):
    """An operation CUDA refuses during stream capture; `code` is CUDA's error name."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code

    def cuda_text(self) -> str:
        """What torch's exception says on a GPU: "CUDA error: <CUDA's string>"."""
        return f"CUDA error: {CUDA_ERROR_STRINGS.get(self.code, self.code)}"


@dataclass(frozen=True)
class CapturedNode:
    """One captured kernel or copy: `seq` counts the nodes of its stream in this capture
    (from 1), `clock` maps each member stream to how many of its nodes this one follows."""

    index: int
    stream: int
    seq: int
    clock: dict
    op: Op

    def after(self, other: "CapturedNode") -> bool:
        """True when the graph orders this node after `other`."""
        return self.clock.get(other.stream, 0) >= other.seq


@dataclass(frozen=True)
class CapturedGraph:
    id: int
    origin: int  # stream the capture began and ended on
    nodes: tuple
    begin_site: CallSite
    end_site: CallSite


class _Capture:
    __slots__ = ("graph", "origin", "mode", "thread", "site", "clocks", "last", "nodes", "error")

    def __init__(self, op: CaptureBegin, mode: CaptureMode):
        self.graph = op.graph
        self.origin = op.stream
        self.mode = mode
        self.thread = op.thread
        self.site = op.site
        self.clocks: dict = {op.stream: {op.stream: 0}}  # member stream -> its clock in this capture
        self.last: dict = {}  # member stream -> its latest node
        self.nodes: list = []
        self.error: Optional[CaptureError] = None  # the first error, which invalidated it


class CaptureTracker:
    """Feed the capture-relevant operations in issue order (ids already validated)."""

    def __init__(self) -> None:
        self._kinds: dict = {}  # stream id -> StreamKind
        self._labels: dict = {}  # stream id -> name for messages
        self._active: dict = {}  # graph id -> _Capture
        self._member: dict = {}  # stream id -> _Capture it belongs to
        # event id -> (capture, clock at record) of a record made in a capture; read-only outside
        self.captured_events: dict = {}
        self._graphs: dict = {}  # graph id -> CapturedGraph
        self._graph_ids: set = set()  # every id ever begun: a graph id names one capture
        self.active = False  # any capture in progress: the one check on the hot path

    # --- queries --------------------------------------------------------------------------
    def is_active(self, graph_id: int) -> bool:
        return graph_id in self._active

    def origin(self, graph_id: int) -> Optional[int]:
        """The stream an active capture began on."""
        capture = self._active.get(graph_id)
        return None if capture is None else capture.origin

    def capturing(self, stream: int) -> Optional[int]:
        """The graph id `stream` is capturing into, or None."""
        capture = self._member.get(stream)
        return None if capture is None else capture.graph

    def graph(self, graph_id: int) -> Optional[CapturedGraph]:
        return self._graphs.get(graph_id)

    # --- bookkeeping ------------------------------------------------------------------------
    def stream_created(self, stream: int, kind: StreamKind, label: str) -> None:
        self._kinds[stream] = StreamKind.parse(kind)
        self._labels[stream] = label

    def _fail(self, capture: Optional[_Capture], code: str, message: str, *others: _Capture) -> None:
        """Raise CUDA's error; it invalidates `capture` (and `others`), as CUDA does."""
        error = CaptureError(code, message)
        for invalid in (capture, *others):
            if invalid is not None and invalid.error is None:
                invalid.error = error
        raise error

    def check_legacy(self, op: Op, stream: int) -> None:
        """Work on the legacy stream would implicitly join a capturing blocking stream."""
        if self._kinds.get(stream) is not StreamKind.LEGACY or not self._active:
            return
        for member, capture in self._member.items():
            if self._kinds[member].joins_legacy:
                self._fail(capture, "cudaErrorStreamCaptureImplicit",
                           f"{type(op).__name__} on the legacy default stream at {op.site} while "
                           f"{self._labels[member]} (a blocking stream) is capturing graph {capture.graph} "
                           f"(begun at {capture.site}); the legacy stream's implicit join cannot be captured. "
                           "Use non-blocking streams for captured work, or keep the legacy stream idle "
                           "until end_capture")

    # --- operations ---------------------------------------------------------------------------
    def begin(self, op: CaptureBegin) -> None:
        label = self._labels[op.stream]
        mode = CaptureMode.parse(op.mode)
        if self._kinds[op.stream] is StreamKind.LEGACY:
            raise CaptureError("cudaErrorStreamCaptureUnsupported",
                               f"begin_capture on the legacy default stream at {op.site}: it cannot be "
                               "captured; capture on a stream you created (non-blocking)")
        known = self._member.get(op.stream)
        if known is not None:
            raise CaptureError("cudaErrorIllegalState",
                               f"begin_capture on {label} at {op.site}: it is already capturing graph "
                               f"{known.graph} (begun at {known.site}); end that capture first")
        if op.graph in self._graph_ids:
            raise CaptureError("cudaErrorIllegalState",
                               f"begin_capture at {op.site}: graph id {op.graph} was used before; "
                               "give each capture its own graph id")
        capture = _Capture(op, mode)
        self._graph_ids.add(op.graph)
        self._active[op.graph] = capture
        self._member[op.stream] = capture
        self.active = True

    def node(self, op: Op, stream: int) -> Optional[CapturedNode]:
        """A kernel or copy on `stream`: its graph node when captured (it does not execute
        now), else None."""
        self.check_legacy(op, stream)
        capture = self._member.get(stream)
        if capture is None:
            return None
        clock = capture.clocks[stream]
        seq = clock[stream] = clock.get(stream, 0) + 1
        node = CapturedNode(len(capture.nodes), stream, seq, dict(clock), op)
        if capture.error is None:
            capture.nodes.append(node)
            capture.last[stream] = node
        return node

    def record(self, op: EventRecord) -> bool:
        """True when the record is made inside a capture: it marks a point in the graph
        for forks and joins and records nothing on the device."""
        self.check_legacy(op, op.stream)
        capture = self._member.get(op.stream)
        if capture is None:
            self.captured_events.pop(op.event, None)
            return False
        self.captured_events[op.event] = (capture, dict(capture.clocks[op.stream]))
        return True

    def wait(self, op: StreamWait, recorded_outside: bool) -> bool:
        """True when the wait is a graph edge (a fork into, or a join within, a capture),
        or a wait on a captured event that has no effect; False: ordinary CUDA semantics.
        `recorded_outside`: the event's last record was an ordinary (executed) one."""
        self.check_legacy(op, op.stream)
        label = self._labels[op.stream]
        mine = self._member.get(op.stream)
        source = self.captured_events.get(op.event)
        if source is None:
            if mine is not None and recorded_outside:
                self._fail(mine, "cudaErrorStreamCaptureIsolation",
                           f"{label} waits at {op.site} on an event recorded outside graph {mine.graph} "
                           f"(capture begun at {mine.site}); only in-stream order may cross the capture "
                           "boundary. Make the dependency before begin_capture (wait on the origin "
                           "stream first), or record the event inside the capture")
            return mine is not None  # a never-recorded event: a no-op either way
        capture, state = source
        if self._active.get(capture.graph) is not capture:
            # The capture ended; its records executed nothing, and CUDA (measured on an H200)
            # refuses such an event as an invalid value until it is recorded again.
            self._fail(mine, "cudaErrorInvalidValue",
                       f"{label} waits at {op.site} on an event last recorded inside graph {capture.graph} "
                       f"(captured at {capture.site}), whose capture has ended; such an event records "
                       "nothing on the device. Record it again outside the capture before waiting on it")
        if mine is not None and mine is not capture:
            self._fail(mine, "cudaErrorStreamCaptureMerge",
                       f"{label} (capturing graph {mine.graph}) waits at {op.site} on an event recorded "
                       f"in graph {capture.graph}; two captures cannot be merged, and both are now invalid",
                       capture)
        clock = capture.clocks.get(op.stream)
        if clock is None and self._kinds[op.stream] is StreamKind.LEGACY:
            self._fail(capture, "cudaErrorStreamCaptureImplicit",
                       f"the legacy default stream waits at {op.site} on an event recorded inside graph "
                       f"{capture.graph}; the legacy stream cannot join a capture. Fork to a stream you "
                       "created instead")
        if clock is None:  # a fork: the stream joins the capture
            clock = capture.clocks[op.stream] = {op.stream: 0}
            self._member[op.stream] = capture
        for stream, seq in state.items():
            if clock.get(stream, 0) < seq:
                clock[stream] = seq
        return True

    def sync_stream(self, op: Op, stream: int) -> None:
        capture = self._member.get(stream)
        if capture is not None:
            self._fail(capture, "cudaErrorStreamCaptureUnsupported",
                       f"synchronize at {op.site} on {self._labels[stream]}, which is capturing graph "
                       f"{capture.graph} (begun at {capture.site}); its work has not run and will not "
                       "until the graph is launched. Synchronize after end_capture and launch")

    def sync_event(self, op: Op, event: int, name: str) -> None:
        source = self.captured_events.get(event)
        if source is None:
            return
        capture = source[0]
        hint = ("such an event records nothing on the device. Synchronize the stream the graph is launched "
                "on, or an event recorded there after the launch")
        if self._active.get(capture.graph) is capture:
            self._fail(capture, "cudaErrorCapturedEvent",
                       f"synchronize at {op.site} on event `{name}`, recorded inside graph {capture.graph} "
                       f"while it is being captured; {hint}")
        self._fail(None, "cudaErrorInvalidValue",  # what CUDA says once the capture has ended (H200)
                   f"synchronize at {op.site} on event `{name}`, last recorded inside graph {capture.graph}, "
                   f"whose capture has ended; {hint}")

    def sync_device(self, op: Op) -> None:
        for capture in self._active.values():
            self._fail(capture, "cudaErrorStreamCaptureUnsupported",
                       f"device synchronize at {op.site} while {self._labels[capture.origin]} is capturing "
                       f"graph {capture.graph} (begun at {capture.site}); synchronize after end_capture")

    def end(self, op: CaptureEnd) -> CapturedGraph:
        label = self._labels[op.stream]
        capture = self._member.get(op.stream)
        if capture is None:
            raise CaptureError("cudaErrorIllegalState",
                               f"end_capture on {label} at {op.site}: it is not capturing; "
                               "call begin_capture on it first")
        if capture.origin != op.stream:
            self._fail(capture, "cudaErrorStreamCaptureUnmatched",
                       f"end_capture on {label} at {op.site}: it was forked into graph {capture.graph}, which "
                       f"was begun on {self._labels[capture.origin]} (at {capture.site}); end it there. The "
                       "capture is now invalid")
        if capture.mode is not CaptureMode.RELAXED and op.thread != capture.thread:
            raise CaptureError("cudaErrorStreamCaptureWrongThread",
                               f"end_capture at {op.site} on host thread {op.thread}, but graph "
                               f"{capture.graph} was begun on thread {capture.thread} in {capture.mode.value} "
                               "mode; end it on the same thread, or begin it with mode='relaxed'")
        # Whatever happens next, the capture is over (CUDA ends an invalidated one too).
        del self._active[capture.graph]
        self.active = bool(self._active)
        for stream in capture.clocks:
            del self._member[stream]
        if capture.error is not None:
            raise CaptureError("cudaErrorStreamCaptureInvalidated",
                               f"end_capture on {label} at {op.site}: graph {capture.graph} was invalidated "
                               f"by an earlier error: {capture.error}")
        origin = capture.clocks[capture.origin]
        unjoined = [node for stream, node in capture.last.items()
                    if stream != capture.origin and origin.get(stream, 0) < node.seq]
        if unjoined:
            lines = "; ".join(f"{self._labels[n.stream]} after `{getattr(n.op, 'name', '?')}` ({n.op.site})"
                              for n in unjoined)
            raise CaptureError("cudaErrorStreamCaptureUnjoined",
                               f"end_capture on {label} at {op.site}: graph {capture.graph} forked work that "
                               f"was never joined back: {lines}. Record an event on each of those streams "
                               f"after its last captured work and make {label} wait on it before end_capture")
        graph = CapturedGraph(capture.graph, capture.origin, tuple(capture.nodes), capture.site, op.site)
        self._graphs[graph.id] = graph
        return graph
