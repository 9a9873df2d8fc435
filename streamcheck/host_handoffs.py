"""Host threads' hand-offs through the standard library, as happens-before edges.

What orders one host thread after another besides start and join (docs/cuda-rules.md, section 2):
- threading.Event: `set()` hands over; a `wait()` that returned True takes over every `set()`
  of that Event before it (cleared or not: which set woke a wait is not known);
- queue.Queue (LifoQueue, PriorityQueue too): a `put()` hands over; the `get()` that returns
  its item takes it over (the same object queued twice at once: that get takes over both
  puts); `task_done()` hands over, a `join()` that returned takes over;
- a Lock or RLock made with `threading.Lock()` / `threading.RLock()` by the program's own code
  while a listener listens (a Condition made so gets such an RLock): a release hands over, the
  next acquire that succeeded takes over;
- threading.Condition: `notify()` / `notify_all()` hand over, a `wait()` that returned True or
  a `wait_for()` that returned a true value takes over;
- threading.Barrier: arriving in `wait()` hands over; passing takes over what every party of
  that generation (arrivals counted in order, `parties` to a generation) handed over.
A wait that timed out, an acquire that failed, Empty, Full or BrokenBarrierError: no edge. The
primitives behave exactly as without us: same arguments, return values, exceptions, timeouts.

Not followed: locks made before listening began, or through a name bound before it
(`from threading import Lock` at import time) or by the standard library or an installed
package (their internal locks would order threads by the interleaving that happened to run);
threading.Semaphore (its Condition is the standard library's own); queue.SimpleQueue and
concurrent.futures (C types and their own locks).

Who hears them: listeners (`Listener`: a recording, streamcheck/record/adapters/threads.py; a
Device, streamcheck/device/api.py), each of which records core.trace.HandOff / TakeOver into
its own trace. The standard library's classes are patched while at least one listener listens.
"""
from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
import weakref

from .core.trace import USER, HandOff, SiteResolver, TakeOver

_ORIGINAL_RLOCK = threading.RLock  # read at import, before any patch
_channels = itertools.count(1)  # one numbering for every listener: a channel names one hand-off point
# Guards the tables below and the listener list; reentrant: a listener's finalizer (a Device
# collected) may stop it from inside a section that allocates.
_state = threading.RLock()
_listeners: tuple = ()  # weak references to the listeners
_patched: list = []  # (owner, name, original, replacement) while installed

# Calls the standard library makes to its own primitives (Event's Condition, Queue's, Barrier's,
# Thread.start's Event) are not the program's hand-offs.
_OWN_FILES = frozenset((threading.__file__, queue.__file__))
_THREAD_RUN = threading.Thread.run.__code__
# Who made a lock: the program's own code (USER), else it is left alone.
_makers = SiteResolver([os.path.dirname(os.path.abspath(__file__)) + os.sep])

_object_channels = weakref.WeakKeyDictionary()  # Event or Condition -> its channel
_queued = weakref.WeakKeyDictionary()  # Queue -> {id(item): [item, channel of each put in flight]}
_task_channels = weakref.WeakKeyDictionary()  # Queue -> its task_done channel
_barriers = weakref.WeakKeyDictionary()  # Barrier -> [arrivals so far, {generation: [channel, passes]}]


class Listener:
    """Hears hand-offs for one trace. It records a hand-off by a thread it knows (`knows_caller`: one
    that issued work into the trace, or took over from one that did: a thread with nothing in the
    trace hands over nothing of it), and a take-over of a channel one of those handed off through
    (the others order nothing of the trace's); `record(kind, channel, what)` records the operation
    for the calling thread, which it knows from then on."""

    def __init__(self):
        self._handed: set = set()  # channels a known thread handed off through

    def knows_caller(self) -> bool:
        raise NotImplementedError

    def record(self, kind, channel: int, what: str) -> None:
        raise NotImplementedError

    def hand_off(self, channel: int, what: str) -> None:
        if self.knows_caller():
            self._handed.add(channel)
            self.record(HandOff, channel, what)

    def take_over(self, channel: int, what: str) -> None:
        if channel in self._handed:
            self.record(TakeOver, channel, what)


def listen(listener: Listener):
    """Make `listener` hear hand-offs (held weakly); returns a function that stops it. The
    standard library is patched from the first listener on, and restored after the last."""
    ref = weakref.ref(listener)
    global _listeners
    with _state:
        _listeners = _listeners + (ref,)
        if not _patched:
            _install()
    stopped = []

    def stop():
        global _listeners
        with _state:
            if stopped:
                return
            stopped.append(True)
            _listeners = tuple(r for r in _listeners if r is not ref and r() is not None)
            if not _listeners:
                _uninstall()
    return stop


def _heard(method: str, channel: int, what: str) -> None:
    for ref in _listeners:
        listener = ref()
        if listener is not None:
            getattr(listener, method)(channel, what)


def _hand_off(channel: int, what: str) -> None:
    _heard("hand_off", channel, what)


def _take_over(channel: int, what: str) -> None:
    _heard("take_over", channel, what)


def _from_stdlib() -> bool:
    """Whether the wrapper's caller is the standard library's threading or queue module (but not
    Thread.run calling a thread's target: Thread(target=event.set) is the program's call)."""
    code = sys._getframe(2).f_code
    return code.co_filename in _OWN_FILES and code is not _THREAD_RUN


def _channel_of(obj, table) -> int:
    """`obj`'s channel in `table`; a fresh one each time for an object a weak table cannot hold (a
    subclass with __slots__ or without a hash): its hand-offs then order nothing, and it works as ever."""
    with _state:
        try:
            channel = table.get(obj)
            if channel is None:
                channel = table[obj] = next(_channels)
        except TypeError:
            return next(_channels)
        return channel


# --- signals and waits: threading.Event, threading.Condition -------------------------------------
def _signal(what: str):
    """Event.set, Condition.notify(_all): what the thread did before it is handed to the waiter it wakes."""
    def wrap(orig):
        def signal(self, *args, **kwargs):
            if _listeners and not _from_stdlib():
                _hand_off(_channel_of(self, _object_channels), what)
            return orig(self, *args, **kwargs)
        return signal
    return wrap


def _woken_wait(what: str):
    """Event.wait, Condition.wait(_for): a wait that returned true took over what the signal handed off
    (a timed-out one took over nothing)."""
    def wrap(orig):
        def wait(self, *args, **kwargs):
            woken = orig(self, *args, **kwargs)
            if woken and _listeners and not _from_stdlib():
                _take_over(_channel_of(self, _object_channels), what)
            return woken
        return wait
    return wrap


# --- queue.Queue ---------------------------------------------------------------------------------
def _queue_put(orig):
    def put(self, item, block=True, timeout=None):
        if not _listeners:
            return orig(self, item, block, timeout)
        channel = next(_channels)
        with _state:
            try:
                _queued.setdefault(self, {}).setdefault(id(item), [item]).append(channel)
            except TypeError:  # a queue a weak table cannot hold (see _channel_of): not followed
                return orig(self, item, block, timeout)
        _hand_off(channel, "Queue.put")  # before the item can be got
        try:
            return orig(self, item, block, timeout)
        except BaseException:  # Full, or interrupted: nothing was put
            with _state:
                _forget(self, item, channel)
            raise
    return put


def _forget(q, item, channel) -> None:
    in_flight = _in_flight(q)
    entry = in_flight.get(id(item))
    if entry is not None and channel in entry[1:]:
        # By position past the item: list.remove compares with ==, which a tensor answers elementwise.
        del entry[entry.index(channel, 1)]
        if len(entry) == 1:
            del in_flight[id(item)]


def _in_flight(q) -> dict:
    try:
        return _queued.get(q, {})
    except TypeError:
        return {}


def _queue_get(orig):
    def get(self, block=True, timeout=None):
        item = orig(self, block, timeout)
        if _listeners:
            with _state:
                entry = _in_flight(self).get(id(item))
                channels = entry[1:] if entry is not None and entry[0] is item else []
                if channels:
                    _forget(self, item, channels[0])
            for channel in channels:
                _take_over(channel, "Queue.get")
        return item
    return get


def _queue_task_done(orig):
    def task_done(self):
        if _listeners:
            _hand_off(_channel_of(self, _task_channels), "Queue.task_done")
        return orig(self)
    return task_done


def _queue_join(orig):
    def join(self):
        result = orig(self)
        if _listeners:
            _take_over(_channel_of(self, _task_channels), "Queue.join")
        return result
    return join


# --- locks ---------------------------------------------------------------------------------------
class _FollowedLock:
    """A lock of the program's: every release hands over, every acquire that succeeded takes
    over. Anything else (locked, _at_fork_reinit, an RLock's _is_owned) is the lock's own."""

    def __init__(self, lock, kind: str):
        self._lock, self._kind = lock, kind
        self._channel = next(_channels)

    def acquire(self, blocking=True, timeout=-1):
        acquired = self._lock.acquire(blocking, timeout)
        if acquired and _listeners:
            _take_over(self._channel, f"{self._kind}.acquire")
        return acquired

    def release(self):
        if _listeners:
            _hand_off(self._channel, f"{self._kind}.release")  # before another thread can acquire
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()

    def __getattr__(self, name):
        if name == "_lock":  # not set yet (a copy being made): no lock to forward to
            raise AttributeError(name)
        return getattr(self._lock, name)

    def __repr__(self):
        return repr(self._lock)


class _FollowedRLock(_FollowedLock):
    """An RLock: a Condition over it releases and re-acquires it through these when it waits."""

    def _release_save(self):
        if _listeners:
            _hand_off(self._channel, "RLock.release")
        return self._lock._release_save()

    def _acquire_restore(self, state):
        self._lock._acquire_restore(state)
        if _listeners:
            _take_over(self._channel, "RLock.acquire")

    def _is_owned(self):
        return self._lock._is_owned()


def _made_by_program() -> bool:
    return _makers.kind_of(sys._getframe(2).f_code.co_filename) == USER


def _followed(follower, kind: str):
    """threading.Lock / RLock: a lock the program makes is followed; the libraries' are their own."""
    def wrap(orig):
        def factory(*args, **kwargs):
            lock = orig(*args, **kwargs)
            return follower(lock, kind) if _made_by_program() else lock
        return factory
    return wrap


# --- threading.Condition -------------------------------------------------------------------------
def _condition_init(orig):
    def __init__(self, lock=None):
        if lock is None and _made_by_program():  # its own lock is the program's
            lock = _FollowedRLock(_ORIGINAL_RLOCK(), "RLock")
        orig(self, lock)
    return __init__


def _barrier_wait(orig):
    def wait(self, timeout=None):
        if not _listeners or _from_stdlib():
            return orig(self, timeout)
        with _state:
            arrivals, generations = _barriers.setdefault(self, [0, {}])
            generation = arrivals // self.parties
            _barriers[self][0] = arrivals + 1
            passage = generations.setdefault(generation, [next(_channels), 0])
        _hand_off(passage[0], "Barrier.wait")
        index = orig(self, timeout)  # BrokenBarrierError: no edge
        _take_over(passage[0], "Barrier.wait")
        with _state:
            passage[1] += 1
            if passage[1] == self.parties:  # every party passed: the generation is done
                generations.pop(generation, None)
        return index
    return wait


# (owner, attribute, wrap): what is patched while anyone listens.
_PATCHES = (
    (threading.Event, "set", _signal("Event.set")),
    (threading.Event, "wait", _woken_wait("Event.wait")),
    (queue.Queue, "put", _queue_put),
    (queue.Queue, "get", _queue_get),
    (queue.Queue, "task_done", _queue_task_done),
    (queue.Queue, "join", _queue_join),
    (threading, "Lock", _followed(_FollowedLock, "Lock")),
    (threading, "RLock", _followed(_FollowedRLock, "RLock")),
    (threading.Condition, "__init__", _condition_init),
    (threading.Condition, "notify", _signal("Condition.notify")),
    (threading.Condition, "notify_all", _signal("Condition.notify_all")),
    (threading.Condition, "wait", _woken_wait("Condition.wait")),
    (threading.Condition, "wait_for", _woken_wait("Condition.wait_for")),
    (threading.Barrier, "wait", _barrier_wait),
)


def _install() -> None:
    for owner, name, wrap in _PATCHES:
        original = owner.__dict__[name]
        replacement = wrap(original)
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            try:
                setattr(replacement, attr, getattr(original, attr))
            except (AttributeError, TypeError):
                pass
        setattr(owner, name, replacement)
        _patched.append((owner, name, original, replacement))


def _uninstall() -> None:
    while _patched:
        owner, name, original, replacement = _patched.pop()
        if owner.__dict__.get(name) is replacement:  # else the program rebound it: its own stays
            setattr(owner, name, original)
