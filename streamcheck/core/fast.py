"""The checker real runs use: hb.Checker's rules compiled (native/checker.cpp, built at install as
streamcheck.core._checker_native) where the build succeeded, hb.Checker itself where it did not or
where STREAMCHECK_NATIVE_CHECKER=0. `new_checker()` is the one entry point; `notice()` is the one
line a run prints when it checks in Python.

hb.py stays the reference, and every report is its own:
- the native side models threads and hand-offs, streams of every kind on every device, events,
  waits, host synchronizations and queries, allocations with reuse, frees (strict, pending,
  record_stream), launches, copies and host accesses, check for check as hb.Checker does. Any
  other operation (stream capture, graph launches, peer access, a kernel touching another
  device's memory), any operation hb.Checker refuses (TraceError) and any attribute NativeChecker
  does not answer itself (owner_label, setting on_race, ...) make
  hb.Checker take over: every operation fed so far is replayed into a fresh one, which answers
  everything from then on (the refused operation is fed last, so it raises hb.py's own error).
- the native side keeps each race occurrence as operation indices, a kind, its two actors and its
  buffer's allocation. Reading `races` or `witness` of a run that found one replays the trace
  into hb.Checker only up to the operation where the last new Race.key was first found (a race in
  a loop: its first steps), which builds each report, and folds the later occurrences in (counts,
  stream pairs, buffers) as hb.Checker folds a repeat; so report texts are hb.py's by
  construction, and a clean run never replays. `hazards`, and anything hand-overs need, feed that
  checker the rest and hand over. Every replay asserts the native occurrences equal hb.Checker's
  (on_race: every occurrence, first and second operation and Race.key), in order.
"""
from __future__ import annotations

import bisect
import importlib
import os
from typing import Optional

from . import hb
from .trace import (
    Alloc,
    Copy,
    DeviceSync,
    EventCreate,
    EventDestroy,
    EventQuery,
    EventRecord,
    EventSync,
    Free,
    HandOff,
    HostAccess,
    ImplicitSync,
    Launch,
    StreamCreate,
    StreamKind,
    StreamQuery,
    StreamSync,
    StreamWait,
    TakeOver,
    ThreadJoin,
    ThreadStart,
    built_from,
)

SWITCH = "STREAMCHECK_NATIVE_CHECKER"  # "0": check in Python (hb.Checker)

_NATIVE = __package__ + "._checker_native"
_SOURCE = "checker.cpp"
try:
    _checker_native = importlib.import_module(_NATIVE)
except ImportError as exc:
    _checker_native = None
    if isinstance(exc, ModuleNotFoundError) and exc.name == _NATIVE:  # the install could not compile it
        _MISSING = (f"{_NATIVE} is not built; reinstall streamcheck where a C++ compiler and Python's headers "
                    "are found (pip install -e .)")
    else:
        _MISSING = f"{_NATIVE} does not load: {exc}; reinstall streamcheck (pip install -e .)"
else:
    if not built_from(_checker_native, _SOURCE):  # an editable install not rebuilt since checker.cpp changed
        _checker_native = None
        _MISSING = (f"{_NATIVE} was built from another version of {_SOURCE}; reinstall streamcheck "
                    "(pip install -e .)")
if _checker_native is not None:
    # The operation classes in the order of checker.cpp's OpType, the stream kinds in its StreamKindIndex's.
    _checker_native.configure(
        (ThreadStart, ThreadJoin, HandOff, TakeOver, StreamCreate, EventCreate, EventDestroy, EventRecord,
         StreamWait, StreamSync, EventSync, StreamQuery, EventQuery, DeviceSync, Alloc, Free, Launch, Copy,
         HostAccess, ImplicitSync),
        (StreamKind.LEGACY, StreamKind.PER_THREAD, StreamKind.BLOCKING, StreamKind.NON_BLOCKING),
        StreamKind.parse)


# Take an immutable, acyclic trace record (an operation, a Range) off the cyclic GC's lists, and return it: the
# GC's collections otherwise walk every record of a long trace again and again. Where the module is not built,
# the record stays tracked.
untrack = _checker_native.untrack if _checker_native is not None else (lambda record: record)


def unavailable() -> Optional[str]:
    """Why this process checks in Python (hb.Checker), or None when new_checker() gives the native one."""
    if os.environ.get(SWITCH) == "0":
        return f"{SWITCH}=0"
    if _checker_native is None:
        return _MISSING
    return None


def notice() -> str:
    """The one line a run prints when it checks in Python; "" when the native checker runs."""
    why = unavailable()
    return f"streamcheck: native checker unavailable ({why}): using the Python checker" if why else ""


def handover_notice(checker) -> str:
    """The one line a run prints where the native checker handed the rest of its feed to the Python
    one (an operation it does not take: a stream capture, a graph, peer access); "" otherwise."""
    where = getattr(checker, "handed_over", None)  # (hb.Checker, or no checker: none)
    if where is None:
        return ""
    index, kind = where
    return (f"streamcheck: checked in Python from operation {index + 1:,} on, a {kind} the native checker leaves to "
            "it (it leaves stream captures, CUDA graphs, peer access, and records it cannot place)")


def new_checker():
    """A checker for a real run: NativeChecker where it is built, else hb.Checker (same races, same reports)."""
    return hb.Checker() if unavailable() else NativeChecker()


if _checker_native is not None:
    class NativeChecker(_checker_native.Checker):
        """hb.Checker's interface over the compiled core (`feed` is the C++ one): what the native side
        knows it answers, anything else hands over to hb.Checker (see the module's docstring)."""

        def __init__(self) -> None:
            self._keys: dict = {}  # Race.key of every occurrence seen so far -> the index of its first
            self._seconds: list = []  # per occurrence seen so far: the operation being fed when it was found
            self._folds: list = []  # per occurrence seen so far: (Race.key, its two owners, its buffer's name)
            self._names: dict = {}  # allocating operation's index -> the buffer's name in reports
            self._last_new = -1  # the operation at which the latest new Race.key was first found
            self._keyed = 0  # how many occurrences _keys has seen
            self._prefix: Optional[hb.Checker] = None  # hb.Checker fed the first _prefix_fed operations
            self._prefix_fed = 0
            # (index, type name) of the operation the compiled core did not take, where hb.Checker then
            # took over the feed (handover_notice); None while it checks, or where a read handed over.
            self.handed_over: Optional[tuple] = None

        def _key_all(self) -> None:
            """Race.key of the occurrences found since the last call (a stop test reads
            distinct_races per operation, so this is incremental)."""
            count = self._occurrence_count
            if count == self._keyed:
                return
            ops, keys, seconds, folds, names = self._ops, self._keys, self._seconds, self._folds, self._names
            places: dict = {}  # id(site) -> site.place: a recording has one CallSite per call path

            def place(site):
                found = places.get(id(site))
                if found is None:
                    found = places[id(site)] = site.place
                return found
            for index, (first, second, key_second, kind, first_owner, second_owner, alloc) in enumerate(
                    self._occurrences(self._keyed), self._keyed):
                key = (kind, place(ops[first].site), place(ops[key_second].site))
                if key not in keys:
                    keys[key] = index
                    self._last_new = second
                seconds.append(second)
                name = names.get(alloc)
                if name is None:
                    name = names[alloc] = hb.buffer_name(ops[alloc].buffer, ops[alloc].name)
                folds.append((key, first_owner, second_owner, name))
            self._keyed = count

        def _feed_prefix(self, stop: int) -> hb.Checker:
            """hb.Checker fed the operations before `stop`, kept and fed further by later calls: the
            reports of the races first found there are its own, as is everything it is asked after
            the whole trace (_switch)."""
            prefix = self._prefix
            if prefix is None:
                prefix = self._prefix = hb.Checker()
            start, ops = self._prefix_fed, self._ops
            if stop <= start:
                return prefix
            if __debug__:  # the native occurrences must be hb.Checker's, in order (python -O skips this)
                self._key_all()
                lo, hi = bisect.bisect_left(self._seconds, start), bisect.bisect_left(self._seconds, stop)
                native, found = self.occurrences(lo, hi), []
                prefix.on_race = lambda first, second, key: found.append((first, second, key))
            try:
                for index in range(start, stop):
                    prefix.feed(ops[index])
            finally:
                prefix.on_race = None
                self._prefix_fed = stop
            assert same_occurrences(native, found), _difference(native, found, ops)
            return prefix

        def _switch(self, pending: bool = False) -> hb.Checker:
            """Hand everything over to hb.Checker fed the same operations (the prefix checker, fed the
            rest; called by feed, with `pending`, for an operation the native side does not check:
            it is fed last, and raises what hb.Checker raises for it)."""
            reference = self._reference
            if reference is not None:
                return reference
            ops = self._ops
            if pending:
                self.handed_over = (len(ops) - 1, type(ops[-1]).__name__)
            try:
                self._feed_prefix(len(ops) - 1 if pending else len(ops))
            finally:
                reference, self._prefix = self._prefix, None
                self._take_ops()
                self._hand_over(reference)
            if pending:
                reference.feed(ops[-1])
            return reference

        def _reports(self) -> tuple:
            """(hb.Checker fed through the first occurrence of every Race.key so far, the later
            occurrences as its `folded` takes them): a racy run's reports without replaying the whole
            trace in Python (a race in a loop is found first in its first steps)."""
            self._key_all()
            prefix = self._feed_prefix(max(self._prefix_fed, self._last_new + 1))
            return prefix, self._folds[bisect.bisect_left(self._seconds, self._prefix_fed):]

        def occurrences(self, start: int = 0, stop: Optional[int] = None) -> Optional[list]:
            """Race occurrences [start:stop] as hb.Checker's on_race would have been told them, in order:
            (first operation, second operation, Race.key). None once hb.Checker took over."""
            ops = self._ops
            if ops is None:
                return None
            self._key_all()
            found = self._occurrences(start) if stop is None else self._occurrences(start, stop)
            return [(ops[first], ops[second], fold[0])
                    for (first, second, *_), fold in zip(found, self._folds[start:])]

        def __getattr__(self, name: str):
            # Only what the class does not define gets here: hb.Checker's other attributes.
            if name.startswith("__"):
                raise AttributeError(name)
            return getattr(self._switch(), name)

        @property
        def races(self) -> list:
            reference = self._reference
            if reference is not None:
                return reference.races
            if not self._occurrence_count:
                return []
            prefix, later = self._reports()
            try:
                return prefix.folded(later)
            except IndexError:  # an actor created after the prefix (owner_label): the whole replay names it
                return self._switch().races

        @property
        def hazards(self) -> list:
            reference = self._reference
            if reference is None:
                if not self._has_hazards():
                    return []
                reference = self._switch()
            return reference.hazards

        def witness(self, race, latest: bool = False) -> Optional[tuple]:
            reference = self._reference
            if reference is not None:
                return reference.witness(race, latest)
            if not self._occurrence_count:
                return None
            prefix, _ = self._reports()
            first = prefix.witness(race)
            if first is None or not latest:
                return first
            key, folds = race.key, self._folds
            for index in range(len(folds) - 1, self._keys[key], -1):
                if folds[index][0] == key:  # its latest occurrence, as _Seen.latest
                    first_op, _, key_second, *_ = self._occurrences(index, index + 1)[0]
                    return self._ops[first_op], self._ops[key_second]
            return first  # seen once

        @property
        def distinct_races(self) -> int:
            reference = self._reference
            if reference is not None:
                return reference.distinct_races
            self._key_all()
            return len(self._keys)

        @property
        def on_race(self):
            reference = self._reference
            return reference.on_race if reference is not None else None

        @on_race.setter
        def on_race(self, callback) -> None:
            if callback is None and self._reference is None:
                return  # nothing to call: stay native
            self._switch().on_race = callback

        def sync_clocks(self, op):
            """hb.Checker.sync_clocks, less the clocks' zero components (an owner at 0 orders nothing)."""
            reference = self._reference
            return reference.sync_clocks(op) if reference is not None else self._sync_clocks(op)

        def thread_owner(self, thread: int) -> Optional[int]:
            reference = self._reference
            return reference.thread_owner(thread) if reference is not None else self._thread_owner(thread)

        # What the native side never has: capture and peer-access errors, captures and graphs (their
        # operations hand over first).
        @property
        def capture_errors(self) -> list:
            reference = self._reference
            return reference.capture_errors if reference is not None else []

        @property
        def peer_errors(self) -> list:
            reference = self._reference
            return reference.peer_errors if reference is not None else []

        def capturing(self, stream: int) -> Optional[int]:
            reference = self._reference
            return reference.capturing(stream) if reference is not None else None

        def has_graph(self, graph_id: int) -> bool:
            reference = self._reference
            return reference.has_graph(graph_id) if reference is not None else False

        def captured_graph(self, graph_id: int):
            reference = self._reference
            return reference.captured_graph(graph_id) if reference is not None else None

        @property
        def replayed(self) -> int:
            """How many operations were replayed into hb.Checker (for reports, or at a hand-over; 0: none)."""
            return self._prefix_fed

        @property
        def native(self) -> bool:
            """Whether the compiled core still checks (False once hb.Checker took over)."""
            return self._reference is None
else:
    NativeChecker = None


def same_occurrences(mine: list, theirs: list) -> bool:
    """Whether two lists of (first op, second op, Race.key) name the same operations (by identity:
    two equal records are still two operations) and keys, in the same order."""
    return len(mine) == len(theirs) and all(
        a is c and b is d and key == other for (a, b, key), (c, d, other) in zip(mine, theirs))


def _difference(native: list, found: list, ops: list) -> str:
    """Where the native checker's occurrences and hb.Checker's part, for the assertion."""
    index = {id(op): i for i, op in enumerate(ops)}
    mine, theirs = ([(index[id(a)], index[id(b)], key) for a, b, key in side] for side in (native, found))
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return f"native checker and hb.Checker differ at race occurrence {i}: {a} != {b} (operation indices, key)"
    return (f"native checker found {len(mine)} race occurrences, hb.Checker {len(theirs)}; the first "
            f"{min(len(mine), len(theirs))} agree")
