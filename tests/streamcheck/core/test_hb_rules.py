"""The happens-before checker against each CUDA rule of docs/cuda-rules.md, one racy pattern and
its safe twin per rule, built directly from trace records (no device API).

Every case states the race kinds it must report (empty: the twin is safe). A rule the
checker forgot shows up as a missed race; a rule it over-applies shows up as a false
alarm on the safe twin.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from streamcheck.core.hb import (Checker, Race, TraceError, check, format_hazards, format_report, reports_to_dicts,
                                reports_to_json, site_path)
from streamcheck.core.trace import (Alloc, CallSite, Copy, CopyKind, DeviceSync, EventCreate, EventQuery, EventRecord,
                               EventSync, HandOff, Free, HostAccess, ImplicitSync, Launch, Range, StreamCreate,
                               StreamKind, StreamQuery, StreamSync, StreamWait, TakeOver, ThreadJoin, ThreadStart,
                               Trace)

NBYTES = 64


class Prog:
    """Builds a trace by name: streams, events and buffers are referred to by their names.
    An operation's call site is the line of this file that asked for it, as the device
    API records it, so a loop repeats its call sites."""

    def __init__(self):
        self.ops: list = []
        self.ids: dict = {}

    def _id(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids) + 1)

    def _add(self, cls, thread: int = 0, **fields) -> CallSite:
        frame = sys._getframe(2)  # the builder line, above the Prog method
        site = CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        self.ops.append(cls(thread, site, **fields))
        return site

    def _range(self, spec) -> Range:
        name, start, stop = (spec, 0, NBYTES) if isinstance(spec, str) else spec
        return Range(self._id(name), start, stop)

    # objects
    def stream(self, name: str, kind: str = "non_blocking") -> CallSite:
        return self._add(StreamCreate, stream=self._id(name), kind=StreamKind.parse(kind), name=name)

    def legacy(self) -> CallSite:
        return self._add(StreamCreate, stream=self._id("legacy"), kind=StreamKind.LEGACY)

    def event(self, name: str) -> CallSite:
        return self._add(EventCreate, event=self._id(name), name=name)

    def alloc(self, name: str, nbytes: int = NBYTES, stream=None, reuses=()) -> CallSite:
        """`reuses`: freed buffers (names, or (name, start, stop)) whose bytes the allocation gets."""
        return self._add(Alloc, buffer=self._id(name), nbytes=nbytes, name=name,
                         stream=self._id(stream) if stream else None, reuses=tuple(map(self._range, reuses)))

    # work
    def launch(self, stream: str, kernel: str, reads=(), writes=(), thread: int = 0) -> CallSite:
        return self._add(Launch, thread, stream=self._id(stream), name=kernel,
                         reads=tuple(map(self._range, reads)), writes=tuple(map(self._range, writes)))

    def copy(self, stream: str, kind: CopyKind, src=None, dst=None) -> CallSite:
        return self._add(Copy, stream=self._id(stream), kind=kind,
                         src=self._range(src) if src else None, dst=self._range(dst) if dst else None)

    def host(self, reads=(), writes=(), thread: int = 0, name: str = "host access") -> CallSite:
        return self._add(HostAccess, thread, reads=tuple(map(self._range, reads)),
                         writes=tuple(map(self._range, writes)), name=name)

    def free(self, buffer: str, stream=None, thread: int = 0, also=(), pool: str = "", strict: bool = False) -> CallSite:
        return self._add(Free, thread, buffer=self._id(buffer), stream=self._id(stream) if stream else None,
                         also=tuple(self._id(s) for s in also), pool=pool, strict=strict)

    # synchronization
    def record(self, event: str, stream: str) -> CallSite:
        return self._add(EventRecord, event=self._id(event), stream=self._id(stream))

    def wait(self, stream: str, event: str) -> CallSite:
        return self._add(StreamWait, stream=self._id(stream), event=self._id(event))

    def sync(self, stream: str, thread: int = 0) -> CallSite:
        return self._add(StreamSync, thread, stream=self._id(stream))

    def event_sync(self, event: str) -> CallSite:
        return self._add(EventSync, event=self._id(event))

    def device_sync(self) -> CallSite:
        return self._add(DeviceSync)

    def stream_query(self, stream: str, done: bool) -> CallSite:
        return self._add(StreamQuery, stream=self._id(stream), done=done)

    def event_query(self, event: str, done: bool) -> CallSite:
        return self._add(EventQuery, event=self._id(event), done=done)

    def implicit(self, reason: str) -> CallSite:
        return self._add(ImplicitSync, reason=reason)

    def thread_start(self, thread: int, parent=None) -> CallSite:
        return self._add(ThreadStart, thread, parent=parent)

    def thread_join(self, child: int, thread: int = 0) -> CallSite:
        return self._add(ThreadJoin, thread, child=child)

    def hand_off(self, channel: int, thread: int = 0) -> CallSite:
        return self._add(HandOff, thread, channel=channel, what="Event.set")

    def take_over(self, channel: int, thread: int = 0) -> CallSite:
        return self._add(TakeOver, thread, channel=channel, what="Event.wait")

    def races(self) -> list[Race]:
        return check(Trace(list(self.ops)))

    def checker(self) -> Checker:
        checker = Checker()
        for op in self.ops:
            checker.feed(op)
        return checker


def two_streams(kind_a="non_blocking", kind_b="non_blocking", buffers=("x",)) -> Prog:
    p = Prog()
    p.stream("A", kind_a)
    p.stream("B", kind_b)
    for name in buffers:
        p.alloc(name)
    return p


# --- the cases ----------------------------------------------------------------------------
# Each builder returns the program; CASES pairs it with the kinds it must report.

def same_stream_in_order():
    p = two_streams()
    p.launch("A", "produce", writes=["x"])
    p.launch("A", "consume", reads=["x"])
    p.launch("A", "overwrite", writes=["x"])
    return p


def two_streams_no_edge():
    p = two_streams()
    p.launch("A", "produce", writes=["x"])
    p.launch("B", "consume", reads=["x"])
    return p


def record_then_wait():
    p = two_streams()
    p.event("done")
    p.launch("A", "produce", writes=["x"])
    p.record("done", "A")
    p.wait("B", "done")
    p.launch("B", "consume", reads=["x"])
    return p


def wait_on_never_recorded_event():
    p = two_streams()
    p.event("done")
    p.launch("A", "produce", writes=["x"])
    p.wait("B", "done")  # no-op: `done` has never been recorded
    p.record("done", "A")
    p.launch("B", "consume", reads=["x"])
    return p


def wait_then_rerecord():
    p = two_streams()
    p.event("done")
    p.record("done", "A")
    p.launch("A", "produce", writes=["x"])
    p.wait("B", "done")  # sees the first record, before `produce`
    p.record("done", "A")  # too late for the wait above
    p.launch("B", "consume", reads=["x"])
    return p


def rerecord_then_wait():
    p = two_streams()
    p.event("done")
    p.record("done", "A")
    p.launch("A", "produce", writes=["x"])
    p.record("done", "A")  # replaces the first record
    p.wait("B", "done")
    p.launch("B", "consume", reads=["x"])
    return p


def record_before_producer():
    p = two_streams()
    p.event("done")
    p.record("done", "A")
    p.launch("A", "produce", writes=["x"])
    p.wait("B", "done")
    p.launch("B", "consume", reads=["x"])
    return p


def legacy_program(other_kind: str, legacy_first: bool):
    """One access on the legacy stream, one on stream S, no events."""
    p = Prog()
    p.legacy()
    p.stream("S", other_kind)
    p.alloc("x")
    if legacy_first:
        p.launch("legacy", "produce", writes=["x"])
        p.launch("S", "consume", reads=["x"])
    else:
        p.launch("S", "produce", writes=["x"])
        p.launch("legacy", "consume", reads=["x"])
    return p


def blocking_streams_without_legacy():
    # Blocking streams synchronize with the legacy stream only, not with each other.
    return two_streams("blocking", "blocking")


def blocking_streams_no_edge():
    p = blocking_streams_without_legacy()
    p.launch("A", "produce", writes=["x"])
    p.launch("B", "consume", reads=["x"])
    return p


def blocking_streams_joined_through_legacy():
    p = blocking_streams_without_legacy()
    p.legacy()
    p.alloc("y")
    p.launch("A", "produce", writes=["x"])
    p.launch("legacy", "unrelated", writes=["y"])  # waits for `produce`; later B work waits for it
    p.launch("B", "consume", reads=["x"])
    return p


def per_thread_and_blocking_no_legacy():
    p = two_streams("per_thread", "blocking")
    p.launch("A", "produce", writes=["x"])
    p.launch("B", "consume", reads=["x"])
    return p


def host_sync(kind: str):
    p = two_streams()
    p.event("done")
    p.launch("A", "produce", writes=["x"])
    p.record("done", "A")
    if kind == "stream":
        p.sync("A")
    elif kind == "event":
        p.event_sync("done")
    elif kind == "device":
        p.device_sync()
    elif kind == "other stream":
        p.sync("B")
    p.host(reads=["x"], name="read result")
    return p


def sync_then_issue(kind: str):
    # The host issues later work only after the sync returns, so that work is ordered too.
    p = two_streams(buffers=("x", "y"))
    p.event("done")
    p.launch("B", "unrelated", writes=["y"])  # B has seen the host before the sync
    p.launch("A", "produce", writes=["x"])
    p.record("done", "A")
    if kind == "stream":
        p.sync("A")
    elif kind == "event":
        p.event_sync("done")
    elif kind == "device":
        p.device_sync()
    p.launch("B", "consume", reads=["x"])
    return p


def event_sync_recorded_too_early():
    p = two_streams()
    p.event("done")
    p.record("done", "A")
    p.launch("A", "produce", writes=["x"])
    p.event_sync("done")
    p.host(reads=["x"])
    return p


def host_polls(what: str, done: bool, recorded_early: bool = False):
    # A query that returned done orders the host after the work it asked about (the stream's, or
    # the event's captured work), as a synchronize does; one that returned not-done orders nothing.
    p = two_streams()
    p.event("done")
    if recorded_early:
        p.record("done", "A")
    p.launch("A", "produce", writes=["x"])
    if not recorded_early:
        p.record("done", "A")
    if what == "event":
        p.event_query("done", done)
    else:
        p.stream_query("A", done)
    p.host(reads=["x"], name="read result")
    return p


def host_write_then_launch():
    # Work issued after a host access executes after it: issue order is an edge.
    p = two_streams()
    p.host(writes=["x"], name="fill on host")
    p.launch("A", "consume", reads=["x"])
    return p


def host_overwrites_while_stream_reads():
    p = two_streams()
    p.launch("A", "consume", reads=["x"])
    p.host(writes=["x"], name="refill on host")
    return p


def copy_program(kind: CopyKind, waited: bool):
    p = two_streams(buffers=("x", "y"))
    p.event("copied")
    if kind is CopyKind.H2D:  # host -> x on A, then B reads x
        p.copy("A", kind, dst="x")
    elif kind is CopyKind.D2H:  # A reads x into host memory, then B overwrites x
        p.copy("A", kind, src="x")
    else:  # A copies x -> y, then B reads y
        p.copy("A", kind, src="x", dst="y")
    p.record("copied", "A")
    if waited:
        p.wait("B", "copied")
    if kind is CopyKind.H2D:
        p.launch("B", "consume", reads=["x"])
    elif kind is CopyKind.D2H:
        p.launch("B", "overwrite", writes=["x"])
    else:
        p.launch("B", "consume", reads=["y"])
    return p


def byte_ranges(a_range: tuple, b_range: tuple):
    p = two_streams()
    p.launch("A", "fill first part", writes=[("x", *a_range)])
    p.launch("B", "fill second part", writes=[("x", *b_range)])
    return p


def free_program(how: str, strict: bool = True):
    """The strict rule (--strict-free): a free with a use pending on another stream is the race."""
    p = two_streams()
    p.event("done")
    p.launch("A", "produce", writes=["x"])
    if how == "host, no sync":
        p.free("x", strict=strict)
    elif how == "host, after sync":
        p.sync("A")
        p.free("x", strict=strict)
    elif how == "on other stream, no wait":
        p.free("x", stream="B", strict=strict)
    elif how == "on other stream, after wait":
        p.record("done", "A")
        p.wait("B", "done")
        p.free("x", stream="B", strict=strict)
    elif how == "on same stream":
        p.free("x", stream="A", strict=strict)
    return p


def reuse_program(how: str):
    """torch's caching allocator without the strict rule: x is allocated on A and read on B; its
    block goes back to A's pool at the free, and the race is an allocation that gets it before
    B's read is ordered before that allocation."""
    p = two_streams()
    p.event("read")
    p.launch("A", "produce", writes=["x"])
    p.record("read", "A")
    p.wait("B", "read")
    p.launch("B", "consume", reads=[("x", 0, 32)])
    p.free("x", stream="A", pool="torch", also=("B",) if how == "record_stream" else ())
    if how == "nothing reuses":
        return p
    if how == "A waits for B":
        p.record("read", "B")
        p.wait("A", "read")
    elif how == "host syncs B":
        p.sync("B")
    elif how == "A waits too early":  # the wait is issued before the read it should cover
        return _reuse_waits_too_early()
    reused = ("x", 32, 64) if how == "other bytes reused" else "x"
    p.alloc("y", stream="A", reuses=[reused])
    return p


def _reuse_waits_too_early():
    p = two_streams()
    p.event("produced")
    p.event("read")
    p.launch("A", "produce", writes=["x"])
    p.record("produced", "A")
    p.wait("B", "produced")
    p.record("read", "B")
    p.wait("A", "read")
    p.launch("B", "consume", reads=["x"])
    p.free("x", stream="A", pool="torch")
    p.alloc("y", stream="A", reuses=["x"])
    return p


def thread_start(parent):
    p = two_streams()
    p.launch("A", "produce", writes=["x"])
    p.sync("A")
    p.thread_start(1, parent=parent)  # after the sync: a child inherits what its parent knows
    p.host(reads=["x"], thread=1, name="worker reads")
    return p


def thread_join(joined: bool):
    p = two_streams()
    p.thread_start(1, parent=0)
    p.host(writes=["x"], thread=1, name="worker fills")
    if joined:
        p.thread_join(1)
    p.launch("A", "consume", reads=["x"])
    return p


def stream_of_other_thread(synced_by: int):
    # A stream sync orders only the thread that called it.
    p = two_streams()
    p.thread_start(1, parent=0)
    p.launch("A", "produce", writes=["x"])
    p.sync("A", thread=synced_by)
    p.host(reads=["x"], thread=1, name="worker reads")
    return p


def hand_off(how: str):
    """Thread 1 fills x, then hands over through channel 7; the main thread launches a reader."""
    p = two_streams()
    p.thread_start(1, parent=0)
    p.host(writes=["x"], thread=1, name="worker fills")
    if how == "take over before the hand-off":
        p.take_over(7)
    p.hand_off(7, thread=1)
    if how == "handed over":
        p.take_over(7)
    elif how == "other channel":
        p.take_over(8)
    elif how == "through a third thread":
        p.thread_start(2, parent=0)
        p.take_over(7, thread=2)
        p.hand_off(9, thread=2)
        p.take_over(9)
    p.launch("A", "consume", reads=["x"])
    return p


def written_after_the_hand_off():
    # A hand-off covers what the thread did before it, not what it does next.
    p = two_streams()
    p.thread_start(1, parent=0)
    p.hand_off(7, thread=1)
    p.host(writes=["x"], thread=1, name="worker fills")
    p.take_over(7)
    p.launch("A", "consume", reads=["x"])
    return p


def concurrent_reads():
    p = two_streams()
    p.stream("C")
    p.host(writes=["x"], name="fill")
    p.launch("A", "read a", reads=["x"])
    p.launch("B", "read b", reads=["x"])
    p.launch("C", "read c", reads=["x"])
    p.host(reads=["x"], name="host read")
    return p


def event_chain(complete: bool):
    p = two_streams()
    p.stream("C")
    p.alloc("t")
    p.event("e1")
    p.event("e2")
    p.launch("A", "produce", writes=["x"])
    p.record("e1", "A")
    if complete:
        p.wait("B", "e1")
    p.launch("B", "middle", writes=["t"])
    p.record("e2", "B")
    p.wait("C", "e2")
    p.launch("C", "consume", reads=["x", "t"])
    return p


def implicit_sync(reason: str, host_reader: bool):
    p = two_streams()
    p.launch("A", "produce", writes=["x"])
    p.implicit(reason)
    if host_reader:
        p.host(reads=["x"])
    else:
        p.launch("B", "consume", reads=["x"])
    return p


IMPLICIT_REASONS = ["first cuBLAS call", "lazy kernel loading", "memory-pool growth (cudaMalloc)",
                    "synchronous copy from pageable memory"]

CASES = [
    # Operations on one stream execute in issue order.
    pytest.param(same_stream_in_order, [], id="stream-order-safe"),
    pytest.param(two_streams_no_edge, ["RAW"], id="stream-order-two-streams-racy"),
    # record(event, stream) captures the work so far; wait_event orders later work after it.
    pytest.param(record_then_wait, [], id="record-wait-safe"),
    pytest.param(wait_on_never_recorded_event, ["RAW"], id="wait-never-recorded-is-noop-racy"),
    pytest.param(wait_then_rerecord, ["RAW"], id="wait-sees-state-at-wait-call-racy"),
    pytest.param(rerecord_then_wait, [], id="rerecord-before-wait-safe"),
    pytest.param(record_before_producer, ["RAW"], id="record-before-producer-racy"),
    # Legacy default stream and blocking / per-thread / non-blocking streams.
    pytest.param(lambda: legacy_program("blocking", True), [], id="legacy-then-blocking-safe"),
    pytest.param(lambda: legacy_program("blocking", False), [], id="blocking-then-legacy-safe"),
    pytest.param(lambda: legacy_program("non_blocking", True), ["RAW"], id="legacy-then-nonblocking-racy"),
    pytest.param(lambda: legacy_program("non_blocking", False), ["RAW"], id="nonblocking-then-legacy-racy"),
    pytest.param(lambda: legacy_program("per_thread", True), [], id="legacy-then-per-thread-safe"),
    pytest.param(lambda: legacy_program("per_thread", False), [], id="per-thread-then-legacy-safe"),
    pytest.param(blocking_streams_no_edge, ["RAW"], id="two-blocking-streams-racy"),
    pytest.param(per_thread_and_blocking_no_legacy, ["RAW"], id="per-thread-and-blocking-racy"),
    pytest.param(blocking_streams_joined_through_legacy, [], id="blocking-joined-through-legacy-safe"),
    # Host synchronization.
    pytest.param(lambda: host_sync("none"), ["RAW"], id="host-read-without-sync-racy"),
    pytest.param(lambda: host_sync("stream"), [], id="stream-sync-safe"),
    pytest.param(lambda: host_sync("event"), [], id="event-sync-safe"),
    pytest.param(lambda: host_sync("device"), [], id="device-sync-safe"),
    pytest.param(lambda: host_sync("other stream"), ["RAW"], id="sync-of-other-stream-racy"),
    pytest.param(lambda: sync_then_issue("none"), ["RAW"], id="issue-without-host-sync-racy"),
    pytest.param(lambda: sync_then_issue("stream"), [], id="stream-sync-orders-later-issue-safe"),
    pytest.param(lambda: sync_then_issue("event"), [], id="event-sync-orders-later-issue-safe"),
    pytest.param(lambda: sync_then_issue("device"), [], id="device-sync-orders-later-issue-safe"),
    pytest.param(event_sync_recorded_too_early, ["RAW"], id="event-sync-recorded-too-early-racy"),
    pytest.param(lambda: host_polls("event", True), [], id="event-query-done-safe"),
    pytest.param(lambda: host_polls("event", False), ["RAW"], id="event-query-not-done-racy"),
    pytest.param(lambda: host_polls("event", True, recorded_early=True), ["RAW"], id="event-query-recorded-too-early-racy"),
    pytest.param(lambda: host_polls("stream", True), [], id="stream-query-done-safe"),
    pytest.param(lambda: host_polls("stream", False), ["RAW"], id="stream-query-not-done-racy"),
    pytest.param(host_write_then_launch, [], id="host-write-then-launch-safe"),
    pytest.param(host_overwrites_while_stream_reads, ["WAR"], id="host-overwrite-during-read-racy"),
    # Async copies are accesses on their stream.
    pytest.param(lambda: copy_program(CopyKind.H2D, False), ["RAW"], id="copy-H2D-racy"),
    pytest.param(lambda: copy_program(CopyKind.H2D, True), [], id="copy-H2D-safe"),
    pytest.param(lambda: copy_program(CopyKind.D2H, False), ["WAR"], id="copy-D2H-racy"),
    pytest.param(lambda: copy_program(CopyKind.D2H, True), [], id="copy-D2H-safe"),
    pytest.param(lambda: copy_program(CopyKind.D2D, False), ["RAW"], id="copy-D2D-racy"),
    pytest.param(lambda: copy_program(CopyKind.D2D, True), [], id="copy-D2D-safe"),
    # Byte ranges: only overlapping bytes conflict.
    pytest.param(lambda: byte_ranges((0, 32), (32, 64)), [], id="disjoint-halves-safe"),
    pytest.param(lambda: byte_ranges((0, 40), (24, 64)), ["WAW"], id="overlapping-ranges-racy"),
    pytest.param(lambda: byte_ranges((16, 17), (0, 64)), ["WAW"], id="one-byte-inside-racy"),
    # A zero-length access (an empty slice) touches no byte, even inside another stream's range.
    pytest.param(lambda: byte_ranges((16, 16), (0, 64)), [], id="zero-length-inside-safe"),
    # Freeing memory still in use on another stream is a race.
    pytest.param(lambda: free_program("host, no sync"), ["FREE"], id="host-free-without-sync-racy"),
    pytest.param(lambda: free_program("host, after sync"), [], id="host-free-after-sync-safe"),
    pytest.param(lambda: free_program("on other stream, no wait"), ["FREE"], id="stream-free-racy"),
    pytest.param(lambda: free_program("on other stream, after wait"), [], id="stream-free-after-wait-safe"),
    pytest.param(lambda: free_program("on same stream"), [], id="stream-free-same-stream-safe"),
    # A free is not a reuse: the race is the allocation that gets the bytes too early.
    pytest.param(lambda: free_program("host, no sync", strict=False), [], id="host-free-not-reused-hazard"),
    pytest.param(lambda: free_program("on other stream, no wait", strict=False), [], id="stream-free-not-reused-hazard"),
    pytest.param(lambda: reuse_program("reused at once"), ["FREE"], id="reuse-before-the-read-is-ordered-racy"),
    pytest.param(lambda: reuse_program("A waits for B"), [], id="reuse-after-the-allocating-stream-waits-safe"),
    pytest.param(lambda: reuse_program("host syncs B"), [], id="reuse-after-the-host-synchronized-safe"),
    pytest.param(lambda: reuse_program("record_stream"), [], id="reuse-after-record-stream-safe"),
    pytest.param(lambda: reuse_program("other bytes reused"), [], id="reuse-of-other-bytes-safe"),
    pytest.param(lambda: reuse_program("A waits too early"), ["FREE"], id="reuse-after-a-wait-issued-too-early-racy"),
    # Host threads: each has its own clock.
    pytest.param(lambda: thread_start(None), ["RAW"], id="thread-without-parent-racy"),
    pytest.param(lambda: thread_start(0), [], id="thread-with-parent-safe"),
    pytest.param(lambda: thread_join(False), ["RAW"], id="thread-not-joined-racy"),
    pytest.param(lambda: thread_join(True), [], id="thread-joined-safe"),
    pytest.param(lambda: stream_of_other_thread(0), ["RAW"], id="sync-by-other-thread-racy"),
    pytest.param(lambda: stream_of_other_thread(1), [], id="sync-by-same-thread-safe"),
    # Host threads' hand-offs (threading.Event, queue.Queue, locks, Condition, Barrier).
    pytest.param(lambda: hand_off("none"), ["RAW"], id="no-hand-off-racy"),
    pytest.param(lambda: hand_off("handed over"), [], id="hand-off-then-take-over-safe"),
    pytest.param(lambda: hand_off("take over before the hand-off"), ["RAW"], id="take-over-before-hand-off-racy"),
    pytest.param(lambda: hand_off("other channel"), ["RAW"], id="take-over-of-other-channel-racy"),
    pytest.param(lambda: hand_off("through a third thread"), [], id="hand-off-relayed-by-third-thread-safe"),
    pytest.param(written_after_the_hand_off, ["RAW"], id="write-after-hand-off-racy"),
    # Concurrent reads never race.
    pytest.param(concurrent_reads, [], id="concurrent-reads-safe"),
    # Event chains are transitive: A -> B -> C.
    pytest.param(lambda: event_chain(True), [], id="event-chain-A-B-C-safe"),
    pytest.param(lambda: event_chain(False), ["RAW"], id="event-chain-broken-racy"),
    # Things that behave like a sync but are not one.
    *[pytest.param(lambda r=r: implicit_sync(r, False), ["RAW"], id=f"implicit-{r.split()[0]}-stream-racy")
      for r in IMPLICIT_REASONS],
    *[pytest.param(lambda r=r: implicit_sync(r, True), ["RAW"], id=f"implicit-{r.split()[0]}-host-racy")
      for r in IMPLICIT_REASONS],
]


@pytest.mark.parametrize("build, kinds", CASES)
def test_cuda_rule(build, kinds):
    p = build()
    races = p.races()
    assert sorted(r.kind for r in races) == sorted(kinds), format_report(races)


# A device synchronize orders the host after all device work, but not after another host
# thread's own accesses: those cases need a join or a hand-off, tested above.
HOST_THREAD_RACES = ("thread-not-joined-racy", "no-hand-off-racy", "take-over-before-hand-off-racy",
                     "take-over-of-other-channel-racy", "write-after-hand-off-racy")
DEVICE_SYNC_FIXES = [c for c in CASES if c.values[1] and c.id not in HOST_THREAD_RACES]


@pytest.mark.parametrize("build", [c.values[0] for c in DEVICE_SYNC_FIXES], ids=[c.id for c in DEVICE_SYNC_FIXES])
def test_racy_pattern_becomes_safe_with_device_sync_before_last_op(build):
    """In every racy case the race is with the last operation, and a device synchronize by
    the thread that issues it (a stronger edge than any event) removes it."""
    p = build()
    last = p.ops.pop()
    p._add(DeviceSync, last.thread)
    p.ops.append(last)
    assert p.races() == [], format_report(p.races())


# --- report content ---------------------------------------------------------------------------

def flashnorm_bug(steps: int = 1) -> tuple[Prog, dict]:
    """The talk's bug: post-scale on B reads the matmul output without waiting for A."""
    p = Prog()
    sites = {"A": p.stream("A"), "B": p.stream("B"), "out": p.alloc("out", 4096), "rms": p.alloc("rms", 8),
             "y": p.alloc("y", 4096)}
    p.event("rms done")
    p.event("post done")
    for _ in range(steps):
        p.wait("A", "post done")  # the WAR edge: the next matmul waits for the last post-scale
        sites["matmul"] = p.launch("A", "matmul", writes=[("out", 0, 4096)])
        sites["rms kernel"] = p.launch("B", "rms", writes=[("rms", 0, 8)])
        p.record("rms done", "B")
        p.wait("B", "rms done")
        sites["post_scale"] = p.launch("B", "post_scale", reads=[("out", 0, 4096), ("rms", 0, 8)],
                                       writes=[("y", 0, 4096)])
        p.record("post done", "B")
    return p, sites


def test_report_names_everything_a_user_needs():
    p, sites = flashnorm_bug()
    [race] = p.races()
    assert race.kind == "RAW"
    assert (race.buffer, race.buffer_site, race.start, race.stop) == ("out", sites["out"], 0, 4096)
    assert (race.first.actor, race.first.name, race.first.site, race.first.write) == (
        "stream A", "matmul", sites["matmul"], True)
    assert (race.second.actor, race.second.name, race.second.site, race.second.write) == (
        "stream B", "post_scale", sites["post_scale"], False)
    # Reports name files relative to the root (the rootdir under pytest): two ops.py of two packages stay apart.
    where = {name: site_path(site) for name, site in sites.items()}
    assert where["matmul"].startswith(os.path.relpath(__file__) + ":")
    assert race.missing_edge == (
        f"stream B never waited for an event recorded on stream A after `matmul` ({where['matmul']})")
    assert "record an event on stream A after `matmul`" in race.hint
    assert "stream B wait on it" in race.hint and where["post_scale"] in race.hint
    text = format_report([race])
    for piece in ("RAW race on `out` bytes [0, 4096)", f"allocated at {where['out']}",
                  f"stream A: `matmul` writes at {where['matmul']}",
                  f"stream B: `post_scale` reads at {where['post_scale']}", race.missing_edge, race.hint):
        assert piece in text


def test_report_range_is_the_overlap():
    [race] = byte_ranges((0, 40), (24, 64)).races()
    assert (race.start, race.stop) == (24, 40)
    assert race.first.name == "fill first part" and race.second.name == "fill second part"


def test_wait_before_record_has_its_own_wording():
    p = wait_on_never_recorded_event()
    [race] = p.races()
    wait_site = site_path(p.ops[5].site)
    assert isinstance(p.ops[5], StreamWait)
    assert race.missing_edge.startswith(f"stream B waited on event `done` at {wait_site} before it was ever recorded")
    assert "a wait on a never-recorded event is a no-op" in race.missing_edge
    assert race.hint.startswith("issue the wait after the record")


def test_wait_before_rerecord_has_its_own_wording():
    [race] = wait_then_rerecord().races()
    assert "before it was re-recorded on stream A after `produce`" in race.missing_edge
    assert "the state the event had at the wait call" in race.missing_edge
    assert race.hint.startswith("issue the wait after the record")


def test_record_too_early_has_its_own_wording():
    p = record_before_producer()
    [race] = p.races()
    record_site = site_path(p.ops[4].site)
    assert isinstance(p.ops[4], EventRecord)
    assert race.missing_edge.startswith(
        f"stream B waited on event `done`, but it was recorded on stream A (at {record_site}) before `produce`")
    assert race.hint.startswith("record the event after `produce`")


def test_non_blocking_with_legacy_says_why():
    [race] = legacy_program("non_blocking", False).races()
    assert race.first.actor == "stream S" and race.second.actor == "legacy default stream"
    assert "a non-blocking stream never synchronizes with the legacy default stream" in race.missing_edge


def test_host_read_without_sync_says_synchronize():
    [race] = host_sync("none").races()
    assert race.second.actor == "host thread 0" and race.second.name == "read result"
    assert "without synchronizing with stream A after `produce`" in race.missing_edge
    assert race.hint.startswith("call stream A.synchronize()")


def test_free_race_names_the_free():
    [race] = free_program("on other stream, no wait", strict=True).races()
    assert race.kind == "FREE"
    assert (race.second.actor, race.second.name, race.second.write) == ("stream B", "free", True)
    assert (race.start, race.stop) == (0, NBYTES)


def test_a_reuse_race_names_the_use_the_free_and_the_allocation_that_got_the_bytes():
    p = reuse_program("reused at once")
    [race] = p.races()
    assert (race.kind, race.first.name, race.second.name, race.second.actor) == ("FREE", "consume", "free", "stream A")
    assert (race.buffer, race.start, race.stop) == ("x", 0, 32)  # the bytes the pending read uses
    alloc_site = next(op.site for op in p.ops if isinstance(op, Alloc) and op.reuses)
    assert f"the allocation at {site_path(alloc_site)} on stream A got these bytes" in race.missing_edge
    assert race.hint.startswith("call tensor.record_stream(stream B) after `consume`")
    assert p.checker().hazards == []  # reported as the race, not again as a hazard


def test_a_reuse_race_with_a_host_threads_use_names_the_thread_in_the_fix():
    p = two_streams()
    p.thread_start(1, parent=0)
    p.host(writes=["x"], thread=1, name="fill")
    p.free("x", stream="A")
    p.alloc("y", stream="B", reuses=["x"])
    [race] = p.races()
    assert (race.kind, race.first.actor, race.first.name) == ("FREE", "host thread 1", "fill")
    assert race.hint.startswith("hand over from thread 1 after `fill`")
    assert "; or make stream B wait for host thread 1 before the allocation at " in race.hint


def test_a_torch_free_on_the_host_is_worded_as_any_host_free():
    """The record_stream wording names the stream whose next allocation gets the block: a free on the
    host has none, so it reads as a host free."""
    p = two_streams()
    p.launch("A", "use", reads=["x"])
    p.free("x", pool="torch", strict=True)
    [race] = p.races()
    assert (race.kind, race.second.actor) == ("FREE", "host thread 0")
    assert race.missing_edge.startswith("host thread 0 freed the memory at ")
    assert race.hint.startswith("call stream A.synchronize()")


def test_a_free_nothing_reuses_is_a_hazard_with_the_record_stream_fix():
    p = reuse_program("nothing reuses")
    checker = p.checker()
    assert checker.races == []
    [hazard] = checker.hazards
    race = hazard.race
    assert (race.kind, race.first.name, race.second.name) == ("FREE", "consume", "free")
    assert "no allocation got these bytes in this run" in race.missing_edge
    assert race.hint.startswith("call tensor.record_stream(stream B) after `consume`")
    text = format_hazards(checker.hazards)
    assert text.startswith("streamcheck: 1 free hazard (not races in this run")
    assert "\nFREE hazard on `x` bytes [0, 32)" in text
    assert hazard.to_dict()["hazard"] is True and hazard.to_dict()["kind"] == "FREE"
    assert format_hazards([]) == ""


def test_a_strict_free_is_the_race_itself_and_no_hazard():
    checker = free_program("host, no sync", strict=True).checker()
    assert [r.kind for r in checker.races] == ["FREE"] and checker.hazards == []
    checker = free_program("host, no sync", strict=False).checker()
    assert checker.races == [] and len(checker.hazards) == 1


def test_hazards_fold_repeats_of_one_free_site():
    p = two_streams()
    for k in range(3):
        p.alloc(f"x{k}")
        p.launch("A", "produce", writes=[f"x{k}"])
        p.free(f"x{k}")
    [hazard] = p.checker().hazards
    assert hazard.race.count == 3


def test_a_prefetch_loader_that_waits_before_each_allocation_is_clean():
    """The pattern of issue 37: each batch allocated on the prefetch stream P (getting the previous
    batch's block), read on the compute stream C; P waits for C before each allocation instead of
    record_stream. The last batch's free is reused by nothing: a hazard, not a race."""
    p = Prog()
    p.stream("P")
    p.stream("C")
    p.event("consumed")
    previous = None
    for k in range(3):
        if previous is not None:
            p.record("consumed", "C")
            p.wait("P", "consumed")
        p.alloc(f"batch{k}", stream="P", reuses=[previous] if previous else [])
        p.launch("P", "load", writes=[f"batch{k}"])
        p.event(f"loaded{k}")
        p.record(f"loaded{k}", "P")
        p.wait("C", f"loaded{k}")
        p.launch("C", "train step", reads=[f"batch{k}"])
        p.free(f"batch{k}", stream="P", pool="torch")
        previous = f"batch{k}"
    checker = p.checker()
    assert checker.races == [], format_report(checker.races)
    [hazard] = checker.hazards
    assert hazard.race.buffer == "batch2"


def test_an_allocation_may_reuse_only_freed_bytes():
    p = two_streams()
    p.alloc("y", reuses=["x"])  # x is alive
    with pytest.raises(TraceError, match="reuses .* of a live buffer"):
        p.races()


def test_the_sync_audit_sees_a_reuse_race_end_at_the_allocation():
    """on_race gets the allocation as the second operation: a wait issued between the free and
    the allocation is what orders the pair."""
    p = reuse_program("reused at once")
    pairs = []
    checker = Checker()
    checker.on_race = lambda first, second, key: pairs.append((type(second).__name__, key[0]))
    for op in p.ops:
        checker.feed(op)
    assert pairs == [("Alloc", "FREE")]


def caching_allocator_reuse(record_stream: bool):
    """torch's caching allocator: x is allocated on A, read on side stream B, freed on the host;
    the block goes back to A's pool at once unless x.record_stream(B) was called."""
    p = two_streams()
    p.launch("A", "produce", writes=["x"])
    p.event("produced")
    p.record("produced", "A")
    p.wait("B", "produced")
    p.launch("B", "copy to host", reads=["x"])
    p.free("x", stream="A", also=("B",) if record_stream else (), pool="torch", strict=True)
    return p


@pytest.mark.parametrize("record_stream", [False, True])
def test_caching_allocator_reuse_needs_record_stream(record_stream):
    races = caching_allocator_reuse(record_stream).races()
    if record_stream:
        assert races == []  # the free waits for what B issued before it
        return
    [race] = races
    assert (race.kind, race.first.name, race.second.name) == ("FREE", "copy to host", "free")
    assert "caching allocator may hand the freed block to the next allocation on stream A" in race.missing_edge
    assert race.hint.startswith("call tensor.record_stream(stream B) after `copy to host`")


def test_record_stream_orders_only_work_issued_before_the_free():
    p = caching_allocator_reuse(True)
    p.launch("B", "late reader", reads=["x"])  # after the free: no record_stream can cover it
    with pytest.raises(TraceError, match="freed"):
        p.races()


def test_race_with_other_host_thread_names_the_thread():
    [race] = thread_join(False).races()
    assert race.first.actor == "host thread 1" and race.first.name == "worker fills"
    assert "never synchronized with thread 1" in race.missing_edge


def test_race_with_other_host_thread_names_the_hand_offs_that_order_threads():
    [race] = hand_off("none").races()
    for primitive in ("join it", "threading.Event", "queue.Queue", "Lock", "Condition", "Barrier"):
        assert primitive in race.hint
    assert "hand over from thread 1 after `worker fills`" in race.hint


def test_repeated_race_is_one_report_with_a_count():
    p, _ = flashnorm_bug(steps=5)
    races = p.races()
    assert len(races) == 1, format_report(races)
    assert races[0].count == 5
    assert "(seen 5x)" in format_report(races)


def test_races_seen_so_far_are_readable_while_feeding():
    p, _ = flashnorm_bug(steps=3)
    checker = Checker()
    counts = []
    for op in p.ops:
        checker.feed(op)
        counts.append(sum(r.count for r in checker.races))
    assert counts[-1] == 3
    assert counts == sorted(counts)  # reports only accumulate


def test_json_round_trips():
    p, sites = flashnorm_bug(steps=2)
    races = p.races() + free_program("host, no sync", strict=True).races()
    data = json.loads(reports_to_json(races))
    assert data == reports_to_dicts(races) == [r.to_dict() for r in races]
    first = data[0]
    assert first["kind"] == "RAW" and first["buffer"] == "out" and first["count"] == 2
    # Paths relative to the working directory (tests/streamcheck/pictures/test_export.py checks site_path itself).
    assert first["first"] == {"actor": "stream A", "name": "matmul", "site": site_path(sites["matmul"]), "write": True,
                              "function": "flashnorm_bug", "innermost": None, "stack": []}
    assert first["second"]["site"] == site_path(sites["post_scale"])
    # Keyed as the text words it.
    assert (first["missing_edge"], first["fix"]) == (races[0].missing_edge, races[0].hint) and "hint" not in first
    assert (first["streams"], first["buffers"]) == ([["stream A", "stream B"]], ["out"])
    assert data[1]["kind"] == "FREE"
    assert [Race.from_dict(d).to_dict() for d in data] == data  # what a reader of the file rebuilds


def test_a_report_lists_the_stream_pairs_and_buffers_it_folds():
    """One line issues the same two kernels for several stream pairs and buffers: one report (same
    kind, same two sites), which names every pair and counts the buffers past the first few."""
    p = Prog()
    for name in "ABCD":
        p.stream(name)
    for k in range(6):
        src, dst = ("A", "B") if k % 2 == 0 else ("C", "D")
        p.alloc(f"x{k}")
        p.launch(src, "produce", writes=[f"x{k}"])
        p.launch(dst, "consume", reads=[f"x{k}"])
    [race] = p.races()
    assert race.count == 6
    assert race.streams == (("stream A", "stream B"), ("stream C", "stream D"))
    assert race.buffers == tuple(f"x{k}" for k in range(6))
    text = race.format()
    assert "  folds 2 stream pairs: stream A -> stream B; stream C -> stream D\n" in text
    assert "  folds 6 buffers: `x0`, `x1`, `x2`, `x3` and 2 more (6 in all)\n" in text


def test_a_report_of_one_pair_and_one_buffer_lists_no_folds():
    [race] = flashnorm_bug(steps=3)[0].races()
    assert race.count == 3 and "folds" not in race.format()


def test_host_free_fix_offers_the_stream_ordered_free_first():
    """The device API's free takes a stream: freeing on the stream that still uses the memory
    orders the reuse after it without blocking the host, so that is the first fix offered."""
    [race] = free_program("host, no sync", strict=True).races()
    assert race.kind == "FREE" and race.second.actor == "host thread 0"
    assert race.hint.startswith("free it on stream A instead: device.free(x, stream=<stream A>) at ")
    assert "; or call stream A.synchronize()" in race.hint


def test_no_races_report():
    assert format_report(record_then_wait().races()) == "streamcheck: no races found"
    assert json.loads(reports_to_json([])) == []


def test_a_legacy_stream_synchronize_waits_for_blocking_streams_even_without_work_of_its_own():
    # Measured on an H200 (docs/cuda-rules.md): cudaStreamSynchronize(0) waited for a blocking
    # stream's pending spin while the legacy stream had nothing; for a non-blocking one it did not.
    from streamcheck.device import Device

    def write(y):
        y[:] = 1

    for kind, races in (("blocking", 0), ("non_blocking", 1)):
        dev = Device("sim", policy="delay", seed=0)
        s = dev.stream("S", kind=kind)
        y = dev.alloc((4,), name="y", fill=0)
        dev.launch(write, [y], stream=s, writes=[y], name="write")
        dev.legacy.synchronize()
        value = dev.host_read(y)
        assert len(dev.races) == races, dev.report()
        if not races:
            assert (value == 1).all()  # the sim drained the blocking stream too


def test_a_block_reused_on_another_stream_than_its_free_races_with_the_frees_own_streams_use():
    """CuPy's pool across threads (issue 37): x is used on A and freed on A (stream-ordered, safe for
    A's next allocation), then handed to an allocation on B, whose work is not ordered after A's."""
    p = two_streams()
    p.launch("A", "use", reads=["x"])
    p.free("x", stream="A", pool="cupy")
    checker = p.checker()
    assert checker.races == [] and checker.hazards == []  # A's own use: ordered for A's pool
    p.alloc("y", stream="B", reuses=["x"])
    [race] = p.races()
    assert (race.kind, race.first.name, race.first.actor) == ("FREE", "use", "stream A")
    p.ops.pop()
    p.alloc("y", stream="A", reuses=["x"])
    assert p.races() == []
