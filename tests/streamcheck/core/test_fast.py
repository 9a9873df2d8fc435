"""The native checker (core/fast.py over core/native/checker.cpp) against the reference, hb.Checker.

The property: on random traces over every operation the native side models (host threads with
hand-offs, streams of every kind on two devices, events re-recorded, destroyed and created again,
waits before records, host synchronizations and queries, allocations that reuse freed bytes, strict
and pending frees with record_stream, launches, copies and host accesses on overlapping sub-ranges),
both checkers see the same race occurrences in the same order (first operation, second operation,
Race.key: what hb.Checker's on_race is told) and give the same reports, hazards and witnesses. Some
traces hand over to hb.Checker midway (a kernel touching another device's memory, a stream capture,
an operation hb.Checker refuses): the results are the same there too.

Then what each hand-over keeps (unit tests), and the fallback: without the compiled module, or with
STREAMCHECK_NATIVE_CHECKER=0, new_checker() is hb.Checker and notice() says so in one line.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamcheck.core import fast, hb
from streamcheck.core.hb import TraceError, format_report
from streamcheck.core.trace import (Alloc, CallSite, CaptureBegin, CaptureEnd, Copy, CopyKind, DeviceSync, EventCreate,
                                    EventDestroy, EventQuery, EventRecord, EventSync, Free, HandOff, HostAccess,
                                    ImplicitSync, Launch, PeerAccess, Range, StreamCreate, StreamKind, StreamQuery,
                                    StreamSync, StreamWait, TakeOver, ThreadJoin, ThreadStart)
from tests.paths import ROOT
from tests.streamcheck.core.test_hb_rules import CASES, Prog, two_streams

requires_native = pytest.mark.skipif(fast.NativeChecker is None, reason="the native checker is not built here")

NBYTES = 16
SPANS = ((0, 16), (0, 8), (8, 16), (4, 12), (0, 4), (12, 16), (6, 6))  # overlapping sub-ranges, one empty
N_SITES = 5  # call sites per trace: occurrences at the same two sites fold into one report
KIND_SPELLINGS = {  # StreamCreate.kind as a member or as the string a recorder may pass
    StreamKind.LEGACY: (StreamKind.LEGACY,),
    StreamKind.BLOCKING: (StreamKind.BLOCKING, "blocking"),
    StreamKind.NON_BLOCKING: (StreamKind.NON_BLOCKING, "non-blocking"),
    StreamKind.PER_THREAD: (StreamKind.PER_THREAD, "per_thread"),
}
# Operation tags by family; a trace draws a few families (swarm testing: rare combinations get their turn).
FAMILIES = {
    "copies": ("copy",),
    "events": ("record", "wait", "record", "wait", "edestroy"),
    "syncs": ("ssync", "esync", "squery", "equery", "dsync", "implicit"),
    "memory": ("alloc", "free", "free"),
    "host": ("host",),
    "threads": ("thread", "join", "handoff", "takeover", "host", "host"),
}


@st.composite
def traces(draw, max_ops: int = 60):
    """A trace that stays valid as it goes (every id known, every range inside a live buffer),
    with a few operations that make hb.Checker take over when `rare` allows them."""
    def site() -> CallSite:
        return CallSite("prog.py", draw(st.integers(1, N_SITES)))

    two_devices = draw(st.booleans())
    ops = []
    streams = []  # (id, device)
    for device in ((0, 1) if two_devices else (0,)):
        if draw(st.booleans()):
            ops.append(StreamCreate(0, site(), stream=len(streams), kind=StreamKind.LEGACY, device=device,
                                    name="legacy default stream"))
            streams.append((len(streams), device))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from([StreamKind.BLOCKING, StreamKind.NON_BLOCKING, StreamKind.PER_THREAD]))
        device = draw(st.integers(0, 1)) if two_devices else 0
        ops.append(StreamCreate(0, site(), stream=len(streams), kind=draw(st.sampled_from(KIND_SPELLINGS[kind])),
                                device=device, name=f"s{len(streams)}"))
        streams.append((len(streams), device))
    events = list(range(1, draw(st.integers(1, 2)) + 1))
    ops += [EventCreate(0, site(), event=event) for event in events]
    threads, channels = [0], set()
    live, freed, next_buffer = {}, {}, 0  # buffer id -> device
    families = draw(st.sets(st.sampled_from(sorted(FAMILIES))))
    enabled = ["launch"] * 3 + ["alloc"] + [tag for family in sorted(families) for tag in FAMILIES[family]]
    rare = draw(st.integers(0, 3)) == 0  # this trace may hand over midway
    if "threads" in families:  # host threads from the start, each started by one already running
        for child in range(1, draw(st.integers(2, 3))):
            ops.append(ThreadStart(child, site(), parent=draw(st.sampled_from(threads))))
            threads.append(child)
    thread = 0
    for _ in range(draw(st.integers(1, max_ops))):
        tag = draw(st.sampled_from(enabled))
        if tag == "alloc" and len(live) >= 2:  # a few buffers: accesses meet
            tag = "launch"
        if draw(st.integers(0, 2)) == 0:  # a host thread issues a run of operations, then another one does
            thread = draw(st.sampled_from(threads))
        stream, device = draw(st.sampled_from(streams))

        def ranges(max_size: int = 2) -> tuple:
            if not live:
                return ()
            picked = draw(st.lists(st.sampled_from(sorted(live)), max_size=max_size))
            return tuple(Range(b, *draw(st.sampled_from(SPANS))) for b in picked)

        if tag == "launch" and live:
            reads, writes = ranges(), ranges()
            if not rare:  # a kernel touching another device's memory faults (a peer error): hb.Checker's
                reads = tuple(r for r in reads if live[r.buffer] == device)
                writes = tuple(r for r in writes if live[r.buffer] == device)
            ops.append(Launch(thread, site(), stream=stream, name=f"k{len(ops)}", reads=reads, writes=writes))
        elif tag == "copy" and live:
            src, dst = ranges(1), ranges(1)
            ops.append(Copy(thread, site(), stream=stream, kind=CopyKind.D2D, src=src[0] if src else None,
                            dst=dst[0] if dst else None))
        elif tag == "host" and live:
            ops.append(HostAccess(thread, site(), reads=ranges(), writes=ranges()))
        elif tag == "record":
            ops.append(EventRecord(thread, site(), event=draw(st.sampled_from(events)), stream=stream))
        elif tag == "wait":  # perhaps before any record: a no-op
            ops.append(StreamWait(thread, site(), stream=stream, event=draw(st.sampled_from(events))))
        elif tag == "ssync":
            ops.append(StreamSync(thread, site(), stream=stream))
        elif tag == "squery":
            ops.append(StreamQuery(thread, site(), stream=stream, done=draw(st.booleans())))
        elif tag in ("esync", "equery"):
            event = draw(st.sampled_from(events))
            ops.append(EventSync(thread, site(), event=event) if tag == "esync"
                       else EventQuery(thread, site(), event=event, done=draw(st.booleans())))
        elif tag == "dsync":
            ops.append(DeviceSync(thread, site(), device=draw(st.integers(0, 1)) if two_devices else 0))
        elif tag == "edestroy":  # then the same id is created again: a new event, never recorded
            event = draw(st.sampled_from(events))
            ops.append(EventDestroy(thread, site(), event=event))
            ops.append(EventCreate(thread, site(), event=event))
        elif tag == "alloc" or (tag == "free" and not live):
            reuses = ()
            if freed and draw(st.integers(0, 3)):  # a pool hands freed bytes to this allocation
                picked = draw(st.lists(st.sampled_from(sorted(freed)), min_size=1, max_size=2))
                reuses = tuple(Range(b, *draw(st.sampled_from(SPANS[:6]))) for b in picked)
            buffer = next_buffer
            if freed and draw(st.integers(0, 3)) == 0:  # an id handed out again after its free
                buffer = draw(st.sampled_from(sorted(freed)))
                del freed[buffer]
            else:
                next_buffer += 1
            on = draw(st.integers(0, 1)) if two_devices else 0
            pool = draw(st.sampled_from([None] + [s for s, _ in streams]))
            ops.append(Alloc(thread, site(), buffer=buffer, nbytes=NBYTES, device=on, stream=pool, reuses=reuses,
                             name=draw(st.sampled_from(["", f"b{buffer}"]))))  # "": the report names it
            live[buffer] = on
        elif tag == "free" and live:
            buffer = draw(st.sampled_from(sorted(live)))
            on_stream = draw(st.booleans())
            also = tuple(draw(st.lists(st.sampled_from([s for s, _ in streams]), max_size=2)))
            ops.append(Free(thread, site(), buffer=buffer, stream=stream if on_stream else None, also=also,
                            strict=draw(st.booleans()), pool=draw(st.sampled_from(["", "torch"]))))
            freed[buffer] = live.pop(buffer)
        elif tag == "thread" and len(threads) < 4:
            child = len(threads)
            ops.append(ThreadStart(child, site(), parent=thread))
            threads.append(child)
        elif tag == "join" and len(threads) > 1:
            child = draw(st.sampled_from(threads[1:]))
            if child != thread:
                ops.append(ThreadJoin(thread, site(), child=child))
        elif tag == "handoff":
            channel = draw(st.integers(0, 1))
            ops.append(HandOff(thread, site(), channel=channel))
            channels.add(channel)
        elif tag == "takeover":  # mostly where another thread handed off; else nobody did: nothing
            channel = draw(st.sampled_from(sorted(channels))) if channels and draw(st.integers(0, 3)) else 2
            ops.append(TakeOver(thread, site(), channel=channel))
        elif tag == "implicit":
            ops.append(ImplicitSync(thread, site(), reason="first cuBLAS call"))
        if rare and draw(st.integers(0, 20)) == 0:  # what only hb.Checker handles, midway
            ops.append(draw(st.sampled_from([
                CaptureBegin(0, site(), stream=streams[-1][0], graph=1),
                PeerAccess(0, site(), device=0, peer=1),
                Launch(0, site(), stream=99, name="k"),  # TraceError: an unknown stream
                Free(0, site(), buffer=10_000),  # TraceError: an unknown buffer
            ])))
    return ops


def feed_each(op, checkers) -> tuple:
    """Each checker fed `op`: the text of the TraceError each raised, or None."""
    errors = []
    for checker in checkers:
        try:
            assert checker.feed(op) is None
            errors.append(None)
        except TraceError as exc:
            errors.append(str(exc))
    return tuple(errors)


def feed_both(ops) -> tuple:
    """(reference, native, the reference's occurrences, each operation's TraceError text or None for both)."""
    reference, native = hb.Checker(), fast.NativeChecker()
    found = []
    reference.on_race = lambda first, second, key: found.append((first, second, key))
    refused = [feed_each(op, (reference, native)) for op in ops]
    return reference, native, found, refused


def assert_same_results(reference, native) -> None:
    assert [str(e) for e in native.capture_errors] == [str(e) for e in reference.capture_errors]
    assert [str(e) for e in native.peer_errors] == [str(e) for e in reference.peer_errors]
    assert native.distinct_races == reference.distinct_races
    assert [r.to_dict() for r in native.races] == [r.to_dict() for r in reference.races]
    assert [h.to_dict() for h in native.hazards] == [h.to_dict() for h in reference.hazards]
    assert format_report(native.races) == format_report(reference.races)
    for race in reference.races:
        assert native.witness(race) == reference.witness(race)
        assert native.witness(race, latest=True) == reference.witness(race, latest=True)


def assert_agree(ops) -> None:
    """Both checkers fed `ops`: the same TraceErrors word for word, the same occurrences in order,
    the same reports, hazards and witnesses; a clean run never paid a replay, and a racy one without
    hazards replayed only up to its last new race."""
    reference, native, found, refused = feed_both(ops)
    assert all(mine == theirs for theirs, mine in refused)
    stays_native = native.native and not reference.hazards
    if native.native and not found:
        assert native.replayed == 0
    if native.native:
        assert fast.same_occurrences(native.occurrences(), found)
    assert_same_results(reference, native)
    assert native.native == stays_native


@requires_native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(traces(), st.lists(st.integers(0, 60), max_size=3))
def test_reports_read_midway_then_fed_on_agree_at_every_read(ops, reads):
    """A run reads its reports while it is checked (the plugin after each test, a stop test): each
    read replays further, and every read, midway and at the end, gives the reference's reports."""
    reference, native = hb.Checker(), fast.NativeChecker()
    for index, op in enumerate(ops):
        reference_error, native_error = feed_each(op, (reference, native))
        assert native_error == reference_error
        if index in reads:
            assert_same_results(reference, native)
    assert_same_results(reference, native)


SYNCS = (StreamWait, StreamSync, StreamQuery, EventSync, EventQuery, DeviceSync)


def without_zeros(clocks):
    """sync_clocks' answer with each clock's zero components dropped (hb.Checker keeps a stream's
    own 0 from its creation; an owner at 0 orders nothing)."""
    if clocks is None:
        return None
    needed, have, ordered, source = clocks
    return ({k: v for k, v in needed.items() if v}, {k: v for k, v in have.items() if v}, ordered, source)


@requires_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(traces())
def test_the_clocks_a_synchronization_joins_are_the_references(ops):
    """What the sync audit asks before each synchronization (which clock it joins, what it orders,
    whose work it waits for, a thread's owner), answered natively, is hb.Checker's."""
    reference, native = hb.Checker(), fast.NativeChecker()
    for op in ops:
        if isinstance(op, SYNCS):
            assert without_zeros(native.sync_clocks(op)) == without_zeros(reference.sync_clocks(op))
        assert native.thread_owner(op.thread) == reference.thread_owner(op.thread)
        reference_error, native_error = feed_each(op, (reference, native))
        assert native_error == reference_error


def racy_loop(steps: int, late_stream: bool) -> Prog:
    """A race in a loop: each step allocates a new buffer, writes it on A and reads it on another
    stream with no wait (the same sites every step); from the middle on the reader is D, created at
    the start or (`late_stream`) only then."""
    p = Prog()
    p.stream("A")
    p.stream("B")
    if not late_stream:
        p.stream("D")
    for step in range(steps):
        if late_stream and step == steps // 2:
            p.stream("D")
        reader = "B" if step < steps // 2 else "D"
        p.alloc(f"x{step}")
        p.launch("A", "produce", writes=[f"x{step}"])
        p.launch(reader, "consume", reads=[f"x{step}"])
    return p


@requires_native
@pytest.mark.parametrize("late_stream", [False, True])
def test_a_racy_loops_reports_replay_only_its_first_step(late_stream):
    """The report of a race found again every step is built from the operations up to its first
    occurrence; the later ones are folded in (count, stream pairs, buffers), as hb.Checker folds
    them. A reader created after that point is named by a whole replay."""
    ops = racy_loop(40, late_stream).ops
    reference, native, found, _ = feed_both(ops)
    [race] = native.races
    assert race.count == 40 and len(race.buffers) == 40
    assert race.streams == (("stream A", "stream B"), ("stream A", "stream D"))
    assert_same_results(reference, native)
    if late_stream:
        assert native.replayed == len(ops) and not native.native
    else:
        assert native.replayed == 6 and native.native  # three streams, x0, produce, consume
        assert native.witness(race, latest=True) == (ops[-2], ops[-1])


@requires_native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(traces())
def test_the_native_checker_finds_the_references_occurrences_reports_and_hazards(ops):
    assert_agree(ops)


@requires_native
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(traces(max_ops=400))
def test_long_traces_agree_too(ops):
    assert_agree(ops)


# --- each rule, racy and safe ----------------------------------------------------------------------

def recreated_event(wait_on_new: bool) -> Prog:
    """An event destroyed and created again under its id is a new, never-recorded one: a wait on it
    orders nothing (the old record is gone)."""
    p = two_streams()
    p.event("e")
    p.launch("A", "produce", writes=["x"])
    p.record("e", "A")
    if wait_on_new:
        p._add(EventDestroy, event=p._id("e"))
        p.event("e")
    p.wait("B", "e")
    p.launch("B", "consume", reads=["x"])
    return p


def device_sync_of(device: int) -> Prog:
    """A device synchronize orders the host after that device's streams only."""
    p = Prog()
    p._add(StreamCreate, stream=p._id("A"), kind=StreamKind.NON_BLOCKING, name="A", device=1)
    p._add(Alloc, buffer=p._id("x"), nbytes=64, name="x", device=1)
    p.launch("A", "produce", writes=["x"])
    p._add(DeviceSync, device=device)
    p.host(reads=["x"])
    return p


def freed_twice_under_one_id(second_use: bool) -> Prog:
    """Buffer id x freed with a use pending, allocated again under the same id and freed again: the
    second free replaces the pending uses only if it has some of its own."""
    p = two_streams()
    p.launch("B", "use", reads=["x"])
    p.free("x", stream="A")
    p.alloc("x")
    if second_use:
        p.launch("B", "use again", reads=["x"])
    p.free("x", stream="A")
    p.alloc("y", stream="A", reuses=["x"])
    return p


def partly_reused(covering: bool) -> Prog:
    """An allocation that gets some of the freed bytes races with the pending use of those; the rest
    stays pending, and a free some of whose bytes went to an allocation is no hazard."""
    p = two_streams()
    p.launch("B", "use", reads=[("x", 0, 32)])
    p.free("x", stream="A")
    p.alloc("y", stream="A", reuses=[("x", 0, 64) if covering else ("x", 32, 64)])
    return p


def host_ordered_reuse(synchronized: bool) -> Prog:
    """A pool allocation on A is ordered after what its host thread knows (here, B's work once the
    host synchronized B), not only after A's own work."""
    p = two_streams()
    p.launch("B", "use", reads=["x"])
    p.free("x", stream="A")
    if synchronized:
        p.sync("B")
    p.alloc("y", stream="A", reuses=["x"])
    return p


PAIRS = [pytest.param(build, arg, id=f"{build.__name__}-{arg}")
         for build in (recreated_event, freed_twice_under_one_id, partly_reused, host_ordered_reuse)
         for arg in (False, True)] + [pytest.param(device_sync_of, d, id=f"device_sync_of-{d}") for d in (0, 1)]




@requires_native
@pytest.mark.parametrize("build, kinds", CASES)
def test_every_rule_of_the_references_rule_tests_agrees(build, kinds):
    assert_agree(build().ops)


@requires_native
@pytest.mark.parametrize("build, arg", PAIRS)
def test_the_rules_the_rule_tests_hold_elsewhere_agree(build, arg):
    assert_agree(build(arg).ops)


# --- hand-overs ---------------------------------------------------------------------------------

SITE = CallSite("prog.py", 1)


def racy_prefix() -> list:
    """Two non-blocking streams writing one buffer with no wait between them: a WAW race."""
    return [StreamCreate(0, SITE, stream=1, kind=StreamKind.NON_BLOCKING, name="a"),
            StreamCreate(0, SITE, stream=2, kind=StreamKind.NON_BLOCKING, name="b"),
            Alloc(0, SITE, buffer=0, nbytes=8, name="x"),
            Launch(0, CallSite("prog.py", 2), stream=1, name="k1", writes=(Range(0, 0, 8),)),
            Launch(0, CallSite("prog.py", 3), stream=2, name="k2", writes=(Range(0, 0, 8),))]


@requires_native
def test_a_capture_midway_hands_over_with_the_same_races_before_and_after():
    ops = racy_prefix() + [
        CaptureBegin(0, SITE, stream=1, graph=7),
        Launch(0, CallSite("prog.py", 4), stream=1, name="captured", writes=(Range(0, 0, 8),)),
        CaptureEnd(0, SITE, stream=1, graph=7),
        Launch(0, CallSite("prog.py", 5), stream=2, name="k3", reads=(Range(0, 0, 4),)),
    ]
    reference, native, found, _ = feed_both(ops)
    assert not native.native
    assert fast.handover_notice(native).startswith(
        "streamcheck: checked in Python from operation 6 on, a CaptureBegin the native checker leaves to it")
    assert len(reference.races) == 2  # WAW before the capture, RAW after it
    assert_same_results(reference, native)
    assert native.has_graph(7) and native.captured_graph(7) == reference.captured_graph(7)


@requires_native
def test_an_operation_the_reference_refuses_raises_its_error_and_checking_goes_on():
    ops = racy_prefix() + [Launch(0, SITE, stream=9, name="k", writes=(Range(0, 0, 8),)),
                           Launch(0, CallSite("prog.py", 6), stream=1, name="k4", reads=(Range(0, 0, 8),))]
    reference, native, _, refused = feed_both(ops)
    assert refused[-2][0] == refused[-2][1] and "unknown stream 9" in refused[-2][0]
    assert not native.native
    assert_same_results(reference, native)


@requires_native
def test_a_clean_run_stays_native_and_answers_without_the_reference():
    ops = racy_prefix()[:4] + [
        EventCreate(0, SITE, event=1),
        EventRecord(0, SITE, event=1, stream=1),
        StreamWait(0, SITE, stream=2, event=1),
        Launch(0, SITE, stream=2, name="k2", reads=(Range(0, 0, 8),)),
    ]
    native = fast.NativeChecker()
    for op in ops:
        native.feed(op)
    assert (native.races, native.hazards, native.distinct_races, native.capture_errors) == ([], [], 0, [])
    assert native.on_race is None and native.capturing(1) is None
    native.on_race = None  # nothing to call: no hand-over
    assert native.native
    assert fast.handover_notice(native) == ""


@requires_native
def test_what_only_the_reference_answers_hands_over_first():
    ops = racy_prefix()
    reference, native = hb.Checker(), fast.NativeChecker()
    for op in ops:
        reference.feed(op)
        native.feed(op)
    assert native.distinct_races == 1 and native.native  # counted natively
    wait = StreamWait(0, SITE, stream=2, event=1)
    reference.feed(EventCreate(0, SITE, event=1))
    native.feed(EventCreate(0, SITE, event=1))
    assert native.thread_owner(0) == reference.thread_owner(0)
    assert native.sync_clocks(wait) is reference.sync_clocks(wait) is None  # answered natively
    assert native.native
    assert native.owner_label(1) == reference.owner_label(1)
    assert not native.native
    seen = []
    native.on_race = lambda first, second, key: seen.append(key)
    native.feed(Launch(0, CallSite("prog.py", 7), stream=1, name="k5", writes=(Range(0, 0, 8),)))
    assert seen == [("WAW", ("prog.py", 3, ""), ("prog.py", 7, ""))]


@requires_native
def test_setting_on_race_hands_over_and_the_callback_sees_later_occurrences_only():
    native = fast.NativeChecker()
    ops = racy_prefix()
    for op in ops[:-1]:
        native.feed(op)
    seen = []
    native.on_race = lambda first, second, key: seen.append((first, second))
    native.feed(ops[-1])
    assert seen == [(ops[3], ops[4])]


# --- where it is missing or turned off --------------------------------------------------------

def test_the_switch_turns_the_native_checker_off_and_says_so(monkeypatch):
    monkeypatch.setenv(fast.SWITCH, "0")
    assert type(fast.new_checker()) is hb.Checker
    assert fast.notice() == ("streamcheck: native checker unavailable (STREAMCHECK_NATIVE_CHECKER=0): "
                             "using the Python checker")


def _fresh_process(program: str) -> list:
    """The lines `program` prints in a fresh interpreter, the native checker's switch unset."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(fast.SWITCH, None)
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT,
                          check=True).stdout.splitlines()


def test_without_the_compiled_module_the_python_checker_runs_and_one_line_says_why():
    program = ("import sys\n"
               "sys.modules['streamcheck.core._checker_native'] = None  # as if it were never built\n"
               "from streamcheck.core import fast, hb\n"
               "print(type(fast.new_checker()) is hb.Checker)\n"
               "print(fast.notice())\n")
    out = _fresh_process(program)
    assert out[0] == "True"
    assert out[1].startswith("streamcheck: native checker unavailable (streamcheck.core._checker_native ")
    assert out[1].endswith("): using the Python checker") and "pip install -e ." in out[1]


def test_a_build_of_another_checker_cpp_is_refused_for_the_python_checker():
    """An editable install not rebuilt after checker.cpp changed: its module carries the old source's hash."""
    program = ("import sys, types\n"
               "stale = types.ModuleType('streamcheck.core._checker_native')\n"
               "stale.SOURCE_SHA256 = '0' * 64\n"
               "sys.modules[stale.__name__] = stale\n"
               "from streamcheck.core import fast, hb\n"
               "print(type(fast.new_checker()) is hb.Checker)\n"
               "print(fast.notice())\n")
    out = _fresh_process(program)
    assert out == ["True", "streamcheck: native checker unavailable (streamcheck.core._checker_native was built from "
                   "another version of checker.cpp; reinstall streamcheck (pip install -e .)): using the Python checker"]


def test_the_install_built_the_native_checker():
    """CI installs with a compiler (pip install -e '.[test]'): a build that silently failed fails here.
    Where no compiler is at hand, STREAMCHECK_NATIVE_CHECKER=0 says the Python checker is meant."""
    if os.environ.get(fast.SWITCH) == "0":
        pytest.skip("STREAMCHECK_NATIVE_CHECKER=0: the Python checker is asked for")
    assert fast.unavailable() is None and fast.notice() == ""
    assert type(fast.new_checker()) is fast.NativeChecker
