"""streamcheck/host_handoffs.py: which calls of the standard library's thread primitives are
hand-offs (and which are not: timeouts, failed acquires, the library's own internal calls), and
that every primitive behaves exactly as without it (return values, exceptions, timeouts)."""
from __future__ import annotations

import queue
import subprocess
import sys
import textwrap
import threading

import pytest

from streamcheck import host_handoffs


class Heard:
    """A listener: (kind, channel, what, thread name) of every hand-off it hears."""

    def __init__(self):
        self.heard = []

    def hand_off(self, channel, what):
        self.heard.append(("off", channel, what, threading.current_thread().name))

    def take_over(self, channel, what):
        self.heard.append(("over", channel, what, threading.current_thread().name))

    def calls(self):
        return [(kind, what, thread) for kind, _, what, thread in self.heard]

    def edges(self):
        """(what handed off, what took it over, by which threads): the pairs sharing a channel."""
        offs = [h for h in self.heard if h[0] == "off"]
        overs = [h for h in self.heard if h[0] == "over"]
        return [(a[2], b[2], a[3], b[3]) for a in offs for b in overs if a[1] == b[1]]


@pytest.fixture
def listener():
    heard = Heard()
    stop = host_handoffs.listen(heard)
    yield heard
    stop()


def run(target, name="worker"):
    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_an_event_set_is_taken_over_by_a_wait_that_returned_true(listener):
    ev = threading.Event()
    run(ev.set)  # a thread whose target is the primitive itself: the program's call
    assert ev.wait(5) is True
    assert listener.edges() == [("Event.set", "Event.wait", "worker", "MainThread")]


def test_a_wait_that_timed_out_takes_nothing_over_and_returns_false(listener):
    ev = threading.Event()
    assert ev.wait(0.01) is False
    # This thread's only: under pytest-xdist, execnet's own threads set events of theirs meanwhile.
    assert [h for h in listener.heard if h[3] == threading.current_thread().name] == []


def test_the_standard_librarys_own_use_of_its_primitives_is_not_heard(listener):
    run(lambda: None)  # Thread.start waits on an Event the child sets
    q = queue.Queue(maxsize=1)
    q.put(1)  # Queue's Conditions: only the put and the get are heard
    assert q.get() == 1
    assert listener.calls() == [("off", "Queue.put", "MainThread"), ("over", "Queue.get", "MainThread")]


def test_a_get_takes_over_the_put_of_the_item_it_returns(listener):
    q = queue.Queue()
    first, second = object(), object()
    run(lambda: q.put(first), name="one")
    run(lambda: q.put_nowait(second), name="two")
    assert q.get() is first
    assert listener.edges() == [("Queue.put", "Queue.get", "one", "MainThread")]
    assert q.get_nowait() is second
    assert ("Queue.put", "Queue.get", "two", "MainThread") in listener.edges()


def test_queue_timeouts_and_refusals_raise_as_ever_and_order_nothing(listener):
    q = queue.Queue(maxsize=1)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)
    q.put("a")
    with pytest.raises(queue.Full):
        q.put("b", timeout=0.01)
    assert q.get() == "a" and q.qsize() == 0
    # The refused put of "b" was heard but no get returns it: it orders nothing.
    assert listener.edges() == [("Queue.put", "Queue.get", "MainThread", "MainThread")]


def test_task_done_is_taken_over_by_join(listener):
    q = queue.Queue()
    q.put(1)

    def consume():
        q.get()
        q.task_done()
    run(consume)
    q.join()
    assert ("Queue.task_done", "Queue.join", "worker", "MainThread") in listener.edges()


def test_a_programs_lock_hands_over_at_release_and_a_failed_acquire_orders_nothing(listener):
    lock = threading.Lock()
    with lock:
        assert lock.locked() and lock.acquire(False) is False and lock.acquire(timeout=0.01) is False
    run(lambda: lock.acquire() and lock.release())
    # This test's threads only: under pytest-xdist, execnet's threads take and give back locks execnet made
    # (a program's locks to the standard library's eye) while the test runs.
    ours = [c for c in listener.calls() if c[2] in ("MainThread", "worker")]
    assert ours == [("over", "Lock.acquire", "MainThread"), ("off", "Lock.release", "MainThread"),
                    ("over", "Lock.acquire", "worker"), ("off", "Lock.release", "worker")]
    with pytest.raises(RuntimeError):
        threading.Lock().release()  # releasing an unlocked lock: the same error as ever


def test_locks_the_standard_library_makes_are_its_own(listener):
    assert type(threading.Lock()) is not type(threading.Event()._cond._lock)
    q = queue.Queue()
    q.put(1)
    q.get()
    assert [what for _, what, _ in listener.calls()] == ["Queue.put", "Queue.get"]


def test_an_rlock_is_reentrant_and_its_condition_hands_over_through_notify_and_the_lock(listener):
    cond = threading.Condition()
    ready = []

    def notifier():
        with cond:
            ready.append(1)
            cond.notify_all()

    with cond:
        with cond:  # reentrant, as an RLock is
            thread = threading.Thread(target=notifier, name="notifier")
            thread.start()
            assert cond.wait_for(lambda: ready, timeout=5)
    thread.join()
    edges = listener.edges()
    assert ("Condition.notify_all", "Condition.wait_for", "notifier", "MainThread") in edges
    assert ("RLock.release", "RLock.acquire", "notifier", "MainThread") in edges
    with cond:
        assert cond.wait(0.01) is False  # timed out: the same answer, no Condition edge
    assert [c for c in listener.calls() if c[1] == "Condition.wait"] == []


def test_passing_a_barrier_takes_over_every_partys_arrival_of_that_generation(listener):
    barrier = threading.Barrier(2)
    run_in = threading.Thread(target=lambda: [barrier.wait(5), barrier.wait(5)], name="party")
    run_in.start()
    indices = {barrier.wait(5), barrier.wait(5)}
    run_in.join()
    assert indices <= {0, 1}
    ours = ("party", "MainThread")  # under pytest-xdist, execnet's threads hand off events of their own
    offs = [h for h in listener.heard if h[0] == "off" and h[3] in ours]
    assert len({h[1] for h in offs}) == 2  # two generations, two channels
    assert ("Barrier.wait", "Barrier.wait", "party", "MainThread") in listener.edges()
    before = len(listener.heard)
    broken = threading.Barrier(2)
    with pytest.raises(threading.BrokenBarrierError):
        broken.wait(0.01)  # nobody came: broken, as ever, and no edge taken over
    assert [h for h in listener.heard[before:] if h[0] == "over" and h[3] in ours] == []


def test_the_standard_library_is_restored_after_the_last_listener_stops():
    # In a fresh interpreter: in this one, a Device an earlier test left alive (a traceback pytest
    # keeps, a fixture's cache) still listens, so the library stays patched, as it should.
    code = textwrap.dedent("""
        import queue, threading
        from streamcheck import host_handoffs

        class Heard:
            def __init__(self):
                self.calls = []
            def hand_off(self, channel, what):
                self.calls.append(what)
            def take_over(self, channel, what):
                self.calls.append(what)

        originals = (threading.Event.set, queue.Queue.get, threading.Lock, threading.Condition.__init__)
        first, second = Heard(), Heard()
        stop_first, stop_second = host_handoffs.listen(first), host_handoffs.listen(second)
        assert threading.Event.set is not originals[0]
        stop_first()
        threading.Event().set()
        assert first.calls == [] and second.calls == ["Event.set"], (first.calls, second.calls)
        stop_second()
        assert (threading.Event.set, queue.Queue.get, threading.Lock, threading.Condition.__init__) == originals
        print("restored")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "restored\n", proc.stderr


def test_primitives_a_weak_table_cannot_hold_work_as_ever_and_order_nothing(listener):
    class UnhashableQueue(queue.Queue):
        __hash__ = None

    class UnhashableEvent(threading.Event):
        __hash__ = None

    q, ev = UnhashableQueue(), UnhashableEvent()
    q.put(1)
    assert q.get() == 1
    ev.set()
    assert ev.wait(1) is True
    assert listener.edges() == []


def test_a_queue_holding_one_object_twice_hands_over_each_put_to_a_get():
    heard = Heard()
    stop = host_handoffs.listen(heard)
    try:
        q = queue.Queue()
        item = object()
        run(lambda: q.put(item), name="one")
        run(lambda: q.put(item), name="two")
        channel = {h[3]: h[1] for h in heard.heard if h[0] == "off" and h[2] == "Queue.put"}
        assert q.get() is item
        first = {h[1] for h in heard.heard if h[0] == "over" and h[3] == "MainThread"}
        assert channel["one"] in first
        before = len(heard.heard)
        assert q.get() is item
        second = {h[1] for h in heard.heard[before:] if h[0] == "over" and h[3] == "MainThread"}
        assert channel["two"] in second  # the second put is still in flight for the second get
        assert q.empty()
    finally:
        stop()


def test_condition_notify_of_one_waiter_hands_over_as_notify_all_does(listener):
    cond = threading.Condition()
    ready = []

    def notifier():
        with cond:
            ready.append(1)
            cond.notify()

    with cond:
        thread = threading.Thread(target=notifier, name="notifier")
        thread.start()
        assert cond.wait_for(lambda: ready, timeout=5)
    thread.join()
    assert ("Condition.notify", "Condition.wait_for", "notifier", "MainThread") in listener.edges()
