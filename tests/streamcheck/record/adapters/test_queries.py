"""Polling as the recorder sees it, on the CPU with a fake GPU: a query that returned done orders
the host like a synchronize, one that returned not-done orders nothing (CuPy's `.done`, torch's
`Stream.query()` / `Event.query()`), and the sync audit reads the recorded run."""
from __future__ import annotations

from streamcheck.record.adapters import cupy_streams, torch_runtime
from streamcheck.analyses.sync_audit import Verdict, audit
from streamcheck.core import trace as T
from tests.streamcheck.record.test_recorder import FakeArray, FakeStream, rec  # noqa: F401 (rec: the fixture)


def _write_then_read(rec, poll):
    a = FakeStream(0x10)
    rec.gpu.current = a
    alloc = rec.alloc(0x1000, 256)
    y = FakeArray(0x1000, 256)
    rec.launch("produce", lambda: None, stream=a, writes=[y])
    poll(a)
    rec.host_read("ndarray.get", y, rec.gpu.legacy, False, lambda: None)  # a read the poll must order
    return alloc


def test_a_query_that_returned_done_orders_the_host(rec):
    _write_then_read(rec, lambda a: rec.stream_query(a, lambda: True))
    (query,) = [op for op in rec.trace.ops if type(op) is T.StreamQuery]
    assert query.done is True
    assert rec.races == []


def test_a_query_that_returned_not_done_orders_nothing(rec):
    _write_then_read(rec, lambda a: rec.stream_query(a, lambda: False))
    (race,) = rec.races
    assert race.kind == "RAW" and race.first.name == "produce"


class FakeEvent:
    """An event object as CuPy's: the recorder keeps its id on it."""


def _event_polled(rec, done: bool, recorded_after_produce: bool = True) -> list:
    """produce on stream A, event `e` recorded on A after it (or before it was issued), the host
    polls e.query() (which answers `done`) and reads what produce wrote; the queries recorded."""
    e = FakeEvent()
    if not recorded_after_produce:
        rec.event_record(e, FakeStream(0x10), lambda: None)

    def poll(a):
        if recorded_after_produce:
            rec.event_record(e, a, lambda: None)
        rec.event_query(e, lambda: done)

    _write_then_read(rec, poll)
    return [op for op in rec.trace.ops if type(op) is T.EventQuery]


def test_an_event_query_that_returned_done_orders_the_host_after_the_events_work(rec):
    (query,) = _event_polled(rec, True)
    assert query.done is True
    assert rec.races == []


def test_an_event_query_that_returned_not_done_orders_nothing(rec):
    (query,) = _event_polled(rec, False)
    assert query.done is False
    (race,) = rec.races
    assert race.kind == "RAW" and race.first.name == "produce"


def test_an_event_query_orders_only_the_work_the_event_captured(rec):
    # Recorded before produce was issued: done says nothing about produce.
    (query,) = _event_polled(rec, True, recorded_after_produce=False)
    assert query.done is True
    (race,) = rec.races
    assert race.kind == "RAW" and race.first.name == "produce"


def test_a_busy_loop_is_checked_not_flagged(rec):
    answers = iter([False, False, True])
    _write_then_read(rec, lambda a: [None for _ in iter(lambda: rec.stream_query(a, lambda: next(answers)), True)])
    queries = [op.done for op in rec.trace.ops if type(op) is T.StreamQuery]
    assert queries == [False, False, True]
    assert rec.races == []
    (finding,) = [f for f in audit(rec.trace).findings if f.sync.kind == "query"]
    assert finding.verdict is Verdict.TIMING and finding.sync.count == 1


def test_cupy_done_properties_record_queries(rec):
    # CuPy's Event and Stream keep `done` as a property; the adapter wraps its getter.
    stream_done = cupy_streams._stream_done(property(lambda self: self.answer))
    event_done = cupy_streams._event_done(property(lambda self: self.answer))

    class Stream:
        ptr = 0x20
        answer = True
        done = stream_done

    class Event:
        answer = False
        done = event_done

    assert Stream().done is True and Event().done is False
    kinds = [(type(op), op.done) for op in rec.trace.ops if type(op) in (T.StreamQuery, T.EventQuery)]
    assert kinds == [(T.StreamQuery, True), (T.EventQuery, False)]


def test_torch_queries_are_recorded_by_handle(rec):
    rec.state["torch"] = torch_runtime.TorchState()  # what install() sets up for a torch recording

    class TorchEvent:
        cuda_event = 0xE1

        def query(self):
            return True

    class TorchStream:
        ptr = 0x30

        def query(self):
            return False

    TorchEvent.query = torch_runtime._event_query(TorchEvent.query)
    TorchStream.query = torch_runtime._stream_query(TorchStream.query)
    assert TorchEvent().query() is True and TorchStream().query() is False
    (event_query,) = [op for op in rec.trace.ops if type(op) is T.EventQuery]
    (stream_query,) = [op for op in rec.trace.ops if type(op) is T.StreamQuery]
    assert event_query.done and event_query.event == rec.event_handle(0xE1)  # the id torch's callbacks use
    assert not stream_query.done and stream_query.stream == rec.sid(0x30)


def test_a_blocking_host_read_records_its_cause_and_the_audit_names_it(rec):
    a = FakeStream(0x10)
    rec.gpu.current = a
    rec.alloc(0x1000, 256)
    y = FakeArray(0x1000, 256)
    rec.launch("sample", lambda: None, stream=a, writes=[y])
    rec.host_read("aten._local_scalar_dense", y, a, True, lambda: None)  # torch's .item()
    (sync,) = [op for op in rec.trace.ops if type(op) is T.StreamSync]
    assert sync.cause == "aten._local_scalar_dense"
    (finding,) = audit(rec.trace).findings
    assert finding.sync.kind == "host read" and finding.verdict is Verdict.HOST_NEEDED
    assert "aten._local_scalar_dense" in finding.sync.what
