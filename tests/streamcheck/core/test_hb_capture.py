"""The checker and CUDA stream capture (docs/cuda-rules.md: every forked stream must be joined back
before end_capture), built from trace records like test_hb_rules.py.

A captured graph's internal races strike on every launch, so they are reported at capture
time; captured work does not execute, so it cannot race with what the host does meanwhile;
a launch is one unit of work on its stream. What CUDA refuses during capture is collected
in `Checker.capture_errors` with CUDA's error name.
"""
from __future__ import annotations

import pytest

from streamcheck.core.capture import CaptureError, CaptureTracker
from streamcheck.core.hb import Checker, TraceError
from streamcheck.core.trace import CaptureBegin, CaptureEnd, CaptureMode, GraphLaunch, Trace
from tests.streamcheck.core.test_hb_rules import Prog


class CaptureProg(Prog):
    def begin(self, stream: str, graph: int = 1, mode: str = "global", thread: int = 0):
        return self._add(CaptureBegin, thread, stream=self._id(stream), graph=graph, mode=CaptureMode.parse(mode))

    def end(self, stream: str, graph: int = 1, thread: int = 0):
        return self._add(CaptureEnd, thread, stream=self._id(stream), graph=graph)

    def graph_launch(self, stream: str, graph: int = 1):
        return self._add(GraphLaunch, stream=self._id(stream), graph=graph)

    def checker(self) -> Checker:
        checker = Checker()
        for op in Trace(list(self.ops)):
            checker.feed(op)
        return checker


def flashnorm_step(p: CaptureProg, join_mm: bool, join_back: bool = True) -> dict:
    """One FlashNorm step captured on `main`: fork to A (matmul writes Y) and B (RMS writes r),
    post-scale on main reads Y and r. `join_mm=False` is the talk's bug inside a graph: main
    waits for A only after the post-scale, so the capture still ends without error."""
    sites = {}
    p.begin("main")
    p.record("fork", "main")
    p.wait("A", "fork")
    p.wait("B", "fork")
    sites["matmul"] = p.launch("A", "matmul", reads=["x", "W"], writes=["Y"])
    p.record("mm_done", "A")
    p.launch("B", "rms", reads=["x"], writes=["r"])
    p.record("rms_done", "B")
    p.wait("main", "rms_done")
    if join_mm:
        p.wait("main", "mm_done")
    sites["post_scale"] = p.launch("main", "post_scale", reads=["Y", "r"], writes=["out"])
    if join_back and not join_mm:
        p.wait("main", "mm_done")  # joined too late for the post-scale, in time for end_capture
    sites["end"] = p.end("main")
    return sites


def capture_unjoined_fork(p: CaptureProg, graph: int = 1) -> None:
    """main forks A, A runs `matmul`, main ends the capture without joining A back."""
    p.begin("main", graph=graph)
    p.record("fork", "main")
    p.wait("A", "fork")
    p.launch("A", "matmul", writes=["Y"])
    p.end("main", graph=graph)


def setup(kind: str = "non_blocking") -> CaptureProg:
    p = CaptureProg()
    for name in ("main", "A", "B", "L"):
        p.stream(name, kind)
    for name in ("fork", "mm_done", "rms_done", "launched"):
        p.event(name)
    for name in ("x", "W", "Y", "r", "out"):
        p.alloc(name)
    return p


# --- races inside a graph --------------------------------------------------------------------

def test_correct_graph_is_clean_and_launches_cleanly():
    p = setup()
    flashnorm_step(p, join_mm=True)
    for _ in range(3):
        p.graph_launch("main")
    checker = p.checker()
    assert checker.races == [] and checker.capture_errors == []


def test_implicit_join_inside_a_graph_is_reported_at_capture():
    p = setup()
    sites = flashnorm_step(p, join_mm=False)
    checker = p.checker()
    assert checker.capture_errors == []
    (race,) = checker.races
    assert (race.kind, race.buffer) == ("RAW", "Y")
    assert (race.first.site, race.second.site) == (sites["matmul"], sites["post_scale"])
    assert race.first.actor == "stream A" and race.second.actor == "stream main"
    assert "inside CUDA graph 1" in race.missing_edge and "every launch" in race.missing_edge
    assert "stream main never waited for an event recorded on stream A" in race.missing_edge


def test_a_race_inside_a_graph_is_reported_once_however_often_it_is_launched():
    p = setup()
    flashnorm_step(p, join_mm=False)
    for _ in range(5):
        p.graph_launch("main")
    assert [r.count for r in p.checker().races] == [1]


def test_graph_order_is_transitive_through_a_chain_of_streams():
    p = setup()
    p.begin("main")
    p.record("fork", "main")
    p.wait("A", "fork")
    p.launch("A", "produce", writes=["Y"])
    p.record("mm_done", "A")
    p.wait("B", "mm_done")
    p.record("rms_done", "B")
    p.wait("main", "rms_done")
    p.launch("main", "consume", reads=["Y"])
    p.end("main")
    assert p.checker().races == []


# --- captured work does not execute ------------------------------------------------------------

def test_host_writes_during_capture_do_not_race_with_captured_kernels():
    p = setup()
    p.begin("main")
    p.launch("main", "reads_x", reads=["x"])
    p.host(writes=["x"])  # the kernel has not run: nothing to race with
    p.end("main")
    assert p.checker().races == []


def test_graph_launch_races_like_one_kernel_on_its_stream():
    p = setup()
    flashnorm_step(p, join_mm=True)
    p.graph_launch("L")
    consumer = p.launch("B", "reads_out", reads=["out"])  # B never waits for L
    (race,) = p.checker().races
    assert (race.kind, race.buffer, race.second.site) == ("RAW", "out", consumer)
    assert race.first.actor == "stream L" and race.first.name == "post_scale"


def test_graph_launch_is_ordered_by_an_event_recorded_after_it():
    p = setup()
    flashnorm_step(p, join_mm=True)
    p.graph_launch("L")
    p.record("launched", "L")
    p.wait("B", "launched")
    p.launch("B", "reads_out", reads=["out"])
    p.host(writes=["x"])  # ... but the host never synchronized with L
    (race,) = p.checker().races  # the graph's reads of x: one report, as for one kernel
    assert (race.kind, race.buffer, race.first.actor) == ("WAR", "x", "stream L")
    assert "host thread 0 wrote the memory" in race.missing_edge


def test_graph_launch_after_host_sync_is_safe_for_the_host():
    p = setup()
    flashnorm_step(p, join_mm=True)
    p.graph_launch("L")
    p.sync("L")
    p.host(reads=["out"], writes=["x"])
    assert p.checker().races == []


def test_launching_a_graph_that_was_never_captured_is_a_trace_error():
    p = setup()
    p.graph_launch("main", graph=7)
    with pytest.raises(TraceError, match="unknown graph 7"):
        p.checker()


# --- what CUDA refuses ---------------------------------------------------------------------------

def codes(p: CaptureProg) -> list:
    return [e.code for e in p.checker().capture_errors]


def test_unjoined_fork_names_the_stream_and_its_last_kernel():
    p = setup()
    capture_unjoined_fork(p)
    (error,) = p.checker().capture_errors
    assert error.code == "cudaErrorStreamCaptureUnjoined"
    assert "stream A after `matmul`" in str(error) and "wait on it before end_capture" in str(error)


def test_a_fork_with_no_work_needs_no_join():
    p = setup()
    p.begin("main")
    p.record("fork", "main")
    p.wait("A", "fork")
    p.end("main")
    assert codes(p) == []


def test_waiting_inside_a_capture_on_an_event_recorded_outside_is_isolation():
    p = setup()
    p.record("fork", "A")
    p.begin("main")
    p.wait("main", "fork")
    p.end("main")
    assert codes(p) == ["cudaErrorStreamCaptureIsolation", "cudaErrorStreamCaptureInvalidated"]


def test_waiting_on_a_never_recorded_event_inside_a_capture_is_a_no_op():
    p = setup()
    p.begin("main")
    p.wait("main", "fork")
    p.end("main")
    assert codes(p) == []


def test_a_race_after_a_wait_on_an_event_last_recorded_inside_a_capture_names_the_missing_wait():
    """B waited on `e` before any record; `e` was then recorded only inside a capture, which records
    nothing on the device: the race's wording must not take that record for one that covers `produce`."""
    p = CaptureProg()
    p.stream("A")
    p.stream("B")
    p.alloc("x")
    p.event("e")
    p.launch("A", "produce", writes=["x"])
    p.wait("B", "e")
    p.begin("A")
    p.record("e", "A")
    p.end("A")
    p.launch("B", "consume", reads=["x"])
    [race] = p.checker().races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "produce", "consume")
    assert race.missing_edge.startswith("stream B never waited for an event recorded on stream A after `produce`")


def test_two_captures_cannot_be_merged_and_both_are_invalidated():
    p = setup()
    p.begin("main", graph=1)
    p.begin("L", graph=2)
    p.record("fork", "main")
    p.wait("L", "fork")
    p.end("L", graph=2)
    p.end("main", graph=1)
    assert codes(p) == ["cudaErrorStreamCaptureMerge"] + ["cudaErrorStreamCaptureInvalidated"] * 2


@pytest.mark.parametrize("how", ["stream", "device", "event"])
def test_synchronizing_during_capture_is_unsupported(how):
    p = setup()
    p.begin("main")
    p.record("fork", "main")
    {"stream": lambda: p.sync("main"), "device": p.device_sync, "event": lambda: p.event_sync("fork")}[how]()
    p.end("main")
    first = {"stream": "cudaErrorStreamCaptureUnsupported", "device": "cudaErrorStreamCaptureUnsupported",
             "event": "cudaErrorCapturedEvent"}[how]
    assert codes(p) == [first, "cudaErrorStreamCaptureInvalidated"]


def test_synchronizing_a_stream_outside_the_capture_is_fine():
    p = setup()
    p.begin("main")
    p.sync("A")
    p.end("main")
    assert codes(p) == []


def test_legacy_stream_cannot_be_captured_nor_used_while_a_blocking_stream_captures():
    p = setup(kind="blocking")
    p.legacy()
    p.begin("legacy", graph=1)
    p.begin("main", graph=2)
    p.launch("legacy", "legacy_work", writes=["x"])
    p.end("main", graph=2)
    assert codes(p) == ["cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureImplicit",
                        "cudaErrorStreamCaptureInvalidated"]


def test_legacy_stream_is_fine_while_only_non_blocking_streams_capture():
    p = setup()
    p.legacy()
    p.begin("main")
    p.launch("legacy", "legacy_work", writes=["x"])
    p.end("main")
    assert codes(p) == []


@pytest.mark.parametrize("mode, refused", [("global", True), ("thread_local", True), ("relaxed", False)])
def test_end_capture_on_another_thread(mode, refused):
    p = setup()
    p.thread_start(1, parent=0)
    p.begin("main", mode=mode)
    p.end("main", thread=1)
    assert codes(p) == (["cudaErrorStreamCaptureWrongThread"] if refused else [])


def test_end_capture_on_a_forked_stream_is_unmatched_and_on_a_stream_not_capturing_illegal():
    p = setup()
    p.begin("main")
    p.record("fork", "main")
    p.wait("A", "fork")
    p.end("A")  # invalidates the capture (measured: tests/streamcheck/core/test_capture_rules_gpu.py)
    p.end("B")
    p.end("main")
    assert codes(p) == ["cudaErrorStreamCaptureUnmatched", "cudaErrorIllegalState",
                        "cudaErrorStreamCaptureInvalidated"]


def test_an_event_recorded_in_an_ended_capture_is_refused_until_recorded_again():
    p = setup()
    p.begin("main")
    p.record("fork", "main")
    p.end("main")
    p.launch("main", "produce", writes=["x"])
    p.wait("B", "fork")  # refused: the record executed nothing, B is not ordered after `produce`
    p.event_sync("fork")  # refused too
    p.launch("B", "consume", reads=["x"])
    p.record("fork", "main")  # an ordinary record makes it usable again
    p.wait("A", "fork")
    p.launch("A", "consume_again", reads=["x"])
    checker = p.checker()
    assert [e.code for e in checker.capture_errors] == ["cudaErrorInvalidValue"] * 2
    (race,) = checker.races
    assert (race.kind, race.second.name) == ("RAW", "consume")


def test_the_checker_recovers_after_a_refused_capture():
    p = setup()
    capture_unjoined_fork(p, graph=1)  # refused: no graph
    p.begin("main", graph=2)
    p.launch("main", "work", writes=["Y"])
    p.end("main", graph=2)
    p.graph_launch("main", graph=2)
    p.launch("main", "after", reads=["Y"])
    checker = p.checker()
    assert [e.code for e in checker.capture_errors] == ["cudaErrorStreamCaptureUnjoined"]
    assert checker.races == []


def test_tracker_raises_where_the_checker_collects():
    tracker = CaptureTracker()
    p = setup()
    capture_unjoined_fork(p)
    begin, record, wait, launch, end = p.ops[-5:]
    for sid in (1, 2):
        tracker.stream_created(sid, "non_blocking", f"s{sid}")
    tracker.begin(begin)
    assert tracker.record(record) is True
    assert tracker.wait(wait, recorded_outside=False) is True
    node = tracker.node(launch, launch.stream)
    assert (node.stream, node.seq, node.clock) == (2, 1, {2: 1})
    with pytest.raises(CaptureError, match="cudaErrorStreamCaptureUnjoined"):
        tracker.end(end)
    assert not tracker.active and tracker.capturing(1) is None
