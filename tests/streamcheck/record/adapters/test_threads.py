"""The threads adapter (streamcheck/record/adapters/threads.py) under a recording, on the CPU with the
fake GPU of test_recorder: a thread fills x on stream S1 and synchronizes it, hands over, and the
main thread launches a reader of x on S2. With the hand-off the reader is ordered after the fill;
each primitive's racy twin leaves the hand-off out (the main thread polls a plain flag, the same order
in fact, nothing the checker can see) and the race is reported. What the patched primitives return
and raise is what they do unpatched (tests/streamcheck/test_host_handoffs.py)."""
from __future__ import annotations

import threading
import time

import pytest

from streamcheck.core import trace as T
from streamcheck.core.hb import format_report
from streamcheck.record import recorder as R
from streamcheck.record.adapters import threads
from streamcheck.record.adapters.patching import Patcher
from tests.streamcheck.device.test_device_api import HAND_OFFS, hand_off_by, nothing
from tests.streamcheck.record.test_recorder import FakeArray, FakeGpu, FakeStream, launch

S1, S2 = FakeStream(0x10), FakeStream(0x20)


@pytest.fixture
def recording(monkeypatch):
    """A recording with the threads adapter installed, as instrument() installs it; undone after."""
    rec = R.Recorder(FakeGpu())
    monkeypatch.setattr(R, "current", rec)
    patcher = Patcher(rec.unpatched)
    threads.install(rec, patcher)
    for patch in threads.patches():
        patcher.apply(patch)
    yield rec
    patcher.restore()


def fill_and_read(rec, handed_over: bool, primitive: str):
    x = FakeArray(0x1000, 64)
    rec.alloc(0x1000, 64, stream=S1)
    enter, give, take = hand_off_by(primitive) if handed_over else (nothing, nothing, nothing)
    filled = []

    def worker():
        enter()
        launch(rec, "fill", S1, writes=(x,))
        rec.stream_sync(S1, lambda: None)
        filled.append(True)  # the racy twin's only order: a plain flag
        give()

    thread = threading.Thread(target=worker)
    thread.start()
    while not filled:
        time.sleep(0.001)
    take()
    launch(rec, "read", S2, reads=(x,))
    thread.join()
    return rec.races


@pytest.mark.parametrize("primitive", HAND_OFFS)
def test_a_hand_off_orders_the_reader_after_the_fill(recording, primitive):
    assert fill_and_read(recording, True, primitive) == [], format_report(recording.races)
    kinds = {type(op) for op in recording.trace.ops}
    assert {T.HandOff, T.TakeOver} <= kinds


@pytest.mark.parametrize("primitive", HAND_OFFS)
def test_without_the_hand_off_the_reader_races_with_the_fill(recording, primitive):
    [race] = fill_and_read(recording, False, primitive)
    assert race.kind == "RAW" and (race.first.name, race.second.name) == ("fill", "read")


def test_hand_offs_are_heard_only_while_recording(monkeypatch):
    rec = R.Recorder(FakeGpu())
    monkeypatch.setattr(R, "current", rec)
    patcher = Patcher(rec.unpatched)
    threads.install(rec, patcher)
    threading.Event().set()
    patcher.restore()
    threading.Event().set()  # after the recording stopped
    assert [op.what for op in rec.trace.ops if isinstance(op, T.HandOff)] == ["Event.set"]


@pytest.mark.parametrize("synchronizes", [True, False])
def test_a_workers_device_synchronize_then_its_join_orders_the_joiner(recording, synchronizes):
    x = FakeArray(0x2000, 64)
    recording.alloc(0x2000, 64, stream=S1)

    def worker():
        launch(recording, "fill", S1, writes=(x,))
        if synchronizes:
            recording.device_sync(lambda: None)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()  # the only order between the worker's synchronize and the reader: the join
    launch(recording, "read", S2, reads=(x,))
    if synchronizes:
        assert recording.races == [], format_report(recording.races)
    else:  # a join orders the host, not the worker's stream
        [race] = recording.races
        assert race.kind == "RAW" and (race.first.name, race.second.name) == ("fill", "read")
