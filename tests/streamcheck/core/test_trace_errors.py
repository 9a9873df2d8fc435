"""Traces no CUDA program could produce are rejected with a TraceError that names the
operation, the object and the call site, and says what to do."""
from __future__ import annotations

import pytest

from streamcheck.core.hb import Checker, TraceError, check
from streamcheck.core.trace import (Alloc, CallSite, Copy, CopyKind, DeviceSync, EventCreate, EventDestroy, EventRecord,
                               EventSync, Free, HostAccess, Launch, Range, StreamCreate, StreamKind, StreamSync,
                               StreamWait, ThreadJoin, ThreadStart, Trace)

SETUP = CallSite("setup.py", 1)
BAD = CallSite("user_prog.py", 42, "main")  # the call site every bad operation carries


def setup_ops() -> list:
    """Streams 1 (A) and 2 (B), event 1, buffer 1 of 64 bytes, host thread 1."""
    return [
        StreamCreate(0, SETUP, stream=1, kind=StreamKind.NON_BLOCKING, name="A"),
        StreamCreate(0, SETUP, stream=2, kind=StreamKind.NON_BLOCKING, name="B"),
        EventCreate(0, SETUP, event=1, name="done"),
        Alloc(0, SETUP, buffer=1, nbytes=64, name="x"),
        ThreadStart(1, SETUP, parent=0),
    ]


def whole(buffer: int = 1) -> Range:
    return Range(buffer, 0, 64)


# (id, operations after setup: the last one is bad, words the message must contain)
CASES = [
    # unknown objects
    ("unknown stream: launch", [Launch(0, BAD, stream=7, name="k", writes=(whole(),))], ["unknown stream 7"]),
    ("unknown stream: record", [EventRecord(0, BAD, event=1, stream=7)], ["unknown stream 7"]),
    ("unknown stream: wait", [StreamWait(0, BAD, stream=7, event=1)], ["unknown stream 7"]),
    ("unknown stream: sync", [StreamSync(0, BAD, stream=7)], ["unknown stream 7"]),
    ("unknown stream: free", [Free(0, BAD, buffer=1, stream=7)], ["unknown stream 7"]),
    ("unknown stream: copy", [Copy(0, BAD, stream=7, kind=CopyKind.H2D, dst=whole())], ["unknown stream 7"]),
    ("unknown event: record", [EventRecord(0, BAD, event=9, stream=1)], ["unknown event 9", "EventCreate"]),
    ("unknown event: wait", [StreamWait(0, BAD, stream=1, event=9)], ["unknown event 9"]),
    ("unknown event: sync", [EventSync(0, BAD, event=9)], ["unknown event 9"]),
    ("unknown event: destroy", [EventDestroy(0, BAD, event=9)], ["unknown event 9"]),
    ("unknown buffer: launch read", [Launch(0, BAD, stream=1, name="k", reads=(whole(5),))],
     ["unknown buffer 5", "Alloc"]),
    ("unknown buffer: copy", [Copy(0, BAD, stream=1, kind=CopyKind.D2D, src=whole(), dst=whole(5))],
     ["unknown buffer 5"]),
    ("unknown buffer: host access", [HostAccess(0, BAD, writes=(whole(5),))], ["unknown buffer 5"]),
    ("unknown buffer: free", [Free(0, BAD, buffer=5)], ["unknown buffer 5"]),
    ("unknown thread: launch", [Launch(3, BAD, stream=1, name="k", writes=(whole(),))],
     ["unknown host thread 3", "ThreadStart"]),
    ("unknown thread: host access", [HostAccess(3, BAD, reads=(whole(),))], ["unknown host thread 3"]),
    ("unknown thread: device sync", [DeviceSync(3, BAD)], ["unknown host thread 3"]),
    ("unknown thread: join", [ThreadJoin(0, BAD, child=3)], ["unknown host thread 3"]),
    ("unknown thread: parent", [ThreadStart(2, BAD, parent=3)], ["unknown parent thread 3"]),
    # accesses outside the allocation
    ("out of range: past the end", [Launch(0, BAD, stream=1, name="k", writes=(Range(1, 32, 65),))],
     ["bytes [32, 65)", "outside `x`", "64 bytes", "allocated at setup.py:1"]),
    ("out of range: negative start", [HostAccess(0, BAD, reads=(Range(1, -4, 8),))], ["bytes [-4, 8)", "outside `x`"]),
    ("out of range: reversed", [Copy(0, BAD, stream=1, kind=CopyKind.D2H, src=Range(1, 40, 8))],
     ["bytes [40, 8)", "outside `x`"]),
    # destroyed events
    ("destroyed event: record", [EventDestroy(0, SETUP, event=1), EventRecord(0, BAD, event=1, stream=1)],
     ["event `done` was destroyed"]),
    ("destroyed event: wait", [EventRecord(0, SETUP, event=1, stream=1), EventDestroy(0, SETUP, event=1),
                               StreamWait(0, BAD, stream=2, event=1)], ["event `done` was destroyed"]),
    ("destroyed event: sync", [EventDestroy(0, SETUP, event=1), EventSync(0, BAD, event=1)],
     ["event `done` was destroyed"]),
    ("destroyed event: destroy twice", [EventDestroy(0, SETUP, event=1), EventDestroy(0, BAD, event=1)],
     ["event `done` was destroyed"]),
    # freed buffers
    ("freed buffer: launch", [Free(0, CallSite("free.py", 7), buffer=1),
                              Launch(0, BAD, stream=1, name="k", reads=(whole(),))],
     ["buffer `x` was freed at free.py:7", "use after free"]),
    ("freed buffer: host access", [Free(0, CallSite("free.py", 7), buffer=1, stream=1),
                                   HostAccess(0, BAD, reads=(whole(),))], ["buffer `x` was freed at free.py:7"]),
    ("freed buffer: free twice", [Free(0, CallSite("free.py", 7), buffer=1), Free(0, BAD, buffer=1)],
     ["buffer `x` was freed at free.py:7"]),
    # duplicate creation
    ("duplicate stream", [StreamCreate(0, BAD, stream=2, name="again")], ["stream 2 already exists"]),
    ("second legacy stream", [StreamCreate(0, SETUP, stream=0, kind=StreamKind.LEGACY),
                              StreamCreate(0, BAD, stream=5, kind=StreamKind.LEGACY)],
     ["only one legacy default stream"]),
    ("duplicate event", [EventCreate(0, BAD, event=1, name="again")], ["event 1 (`done`) already exists"]),
    ("duplicate buffer", [Alloc(0, BAD, buffer=1, nbytes=8, name="again")],
     ["buffer 1 (`x`) already allocated at setup.py:1"]),
    ("duplicate thread", [ThreadStart(1, BAD, parent=0)], ["host thread 1 already started"]),
    # malformed records
    ("negative size", [Alloc(0, BAD, buffer=2, nbytes=-1)], ["negative size -1"]),
    ("unknown stream kind", [StreamCreate(0, BAD, stream=3, kind="sideways")],
     ["unknown stream kind 'sideways'", "non_blocking"]),
]


@pytest.mark.parametrize("ops, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_trace_is_rejected_with_a_clear_error(ops, words):
    checker = Checker()
    for op in setup_ops() + ops[:-1]:
        checker.feed(op)
    with pytest.raises(TraceError) as info:
        checker.feed(ops[-1])
    message = str(info.value)
    assert message.startswith(f"{type(ops[-1]).__name__} at user_prog.py:42"), message
    for word in words:
        assert word in message, message


def test_trace_error_is_a_value_error():
    with pytest.raises(ValueError):
        check(Trace([Launch(0, BAD, stream=1, name="k")]))


def test_unknown_record_type_is_rejected():
    class Mystery:
        thread, site = 0, BAD

    with pytest.raises(TraceError, match=r"unknown operation Mystery at user_prog.py:42"):
        Checker().feed(Mystery())


def test_rejected_operation_leaves_no_trace():
    """A launch with one bad range is rejected whole: its good write is not recorded, so it
    cannot race with what follows, and the stream's clock did not move."""
    checker = Checker()
    for op in setup_ops():
        checker.feed(op)
    with pytest.raises(TraceError):
        checker.feed(Launch(0, BAD, stream=2, name="half bad", writes=(whole(), Range(1, 0, 99))))
    checker.feed(Launch(0, SETUP, stream=1, name="reader", reads=(whole(),)))
    assert checker.races == []


def test_ids_may_be_reused_after_free_and_destroy():
    """A freed buffer id or a destroyed event id can be handed out again (CUDA recycles
    handles); the new object starts with no history."""
    checker = Checker()
    for op in setup_ops():
        checker.feed(op)
    checker.feed(Launch(0, SETUP, stream=1, name="writer", writes=(whole(),)))
    checker.feed(StreamSync(0, SETUP, stream=1))
    checker.feed(Free(0, SETUP, buffer=1))
    checker.feed(Alloc(0, SETUP, buffer=1, nbytes=16, name="y"))
    checker.feed(Launch(0, SETUP, stream=2, name="reader", reads=(Range(1, 0, 16),)))
    checker.feed(EventDestroy(0, SETUP, event=1))
    checker.feed(EventCreate(0, SETUP, event=1, name="fresh"))
    checker.feed(StreamWait(0, SETUP, stream=2, event=1))  # never recorded: a no-op, not an error
    assert checker.races == []
    assert checker.buffer_name(1) == "y"
    with pytest.raises(TraceError, match=r"bytes \[0, 64\) are outside `y` \(16 bytes"):
        checker.feed(Launch(0, BAD, stream=2, name="k", reads=(whole(),)))
