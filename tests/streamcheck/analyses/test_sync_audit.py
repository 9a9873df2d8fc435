"""The sync audit on device-API programs run on the sim: one program per verdict, the
over-synchronized patterns people ship, and what Audit.format() / to_dict() say.

Each program records its own trace (Device("sim").trace); where the audit proposes a change, the
test makes that change in the program and checks the run is race-free, or checks the audit's
minimal set as a whole by core.hb.check on the edited trace.
"""
from __future__ import annotations

import json
import re

import pytest

from streamcheck.analyses.sync_audit import Verdict, audit, edit
from streamcheck.core import trace as T
from streamcheck.core.hb import check
from streamcheck.device import Device


def fill(out):
    out[...] = 1


def copy(src, dst):
    dst[...] = src


def site_of(device, name):
    """Where the program launched kernel `name` (its first launch)."""
    return next(op.site for op in device.trace if type(op) is T.Launch and op.name == name)


def same_place(site, other) -> bool:
    return (site.file, site.line) == (other.file, other.line)


def only(result):
    assert len(result.findings) == 1, result.format()
    return result.findings[0]


def cover_of(result, finding):
    """The finding a "covered: #n" reason names, or None."""
    match = re.match(r"covered: #(\d+) ", finding.reason)
    return result.findings[int(match.group(1)) - 1] if match else None


def assert_covers_hold(ops, result):
    """A sync covered by another: removing both makes a race that removing the cover alone does
    not (else the cover, necessary on its own, explains nothing about this one)."""
    for finding in result.findings:
        cover = cover_of(result, finding)
        if cover is not None:
            alone = {race.key for race in check(edit(ops, remove={cover.sync.key}))}
            both = {race.key for race in check(edit(ops, remove={finding.sync.key, cover.sync.key}))}
            assert both - alone, f"#{finding.number} is not what #{cover.number} covers\n{result.format()}"


def minimal_trace(ops, result):
    """The trace with the audit's removable syncs removed (no replaced ones in these programs)."""
    assert not result.replaced, result.format()
    by_number = {f.number: f for f in result.findings}
    return edit(ops, remove={by_number[n].sync.key for n in result.removed})


def assert_minimal_set_holds(device, result):
    """The minimal set checked as a whole: race-free, and every kept sync needed in it."""
    ops = list(device.trace)
    assert not check(minimal_trace(ops, result)), result.format()
    by_number = {f.number: f for f in result.findings}
    for number in result.keep:
        kept = by_number[number].sync.key
        assert check(edit(minimal_trace(ops, result), remove={kept})), f"#{number} is not needed\n{result.format()}"


# --- a host synchronize that only orders two streams --------------------------------------

def host_sync_before_consumer(device_side: bool):
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    if device_side:  # what the audit tells the user to write instead
        b.wait_event(a.record(d.event("produced")))
    else:
        a.synchronize()
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
    return d


def test_a_host_synchronize_before_a_consumer_on_another_stream_can_be_a_device_side_wait():
    d = host_sync_before_consumer(device_side=False)
    result = audit(d.trace)
    finding = only(result)
    assert finding.verdict is Verdict.DEVICE_SIDE
    assert finding.sync.kind == "stream synchronize" and finding.sync.host_blocking
    (replacement,) = finding.replacement
    assert replacement.record_on == "stream A" and replacement.wait_on == "stream B"
    assert "`producer`" in replacement.after and "`consumer`" in replacement.before
    assert str(site_of(d, "consumer")) in replacement.before
    (race,) = finding.prevents
    assert (race.kind, race.buffer) == ("RAW", "x")
    assert result.replaced == (1,) and result.keep == () and result.removed == ()
    assert "(1 as a device-side wait instead of a host synchronize)" in result.summary()
    assert "replace with: record an event on stream A after `producer`" in result.format()

    # Doing what it says: the program without the host synchronize is race-free, and the
    # audit of that program calls the new wait necessary, for the same race.
    fixed = host_sync_before_consumer(device_side=True)
    assert not fixed.races
    wait = only(audit(fixed.trace))
    assert wait.verdict is Verdict.NECESSARY and wait.sync.kind == "wait_event"
    assert [(r.kind, r.buffer) for r in wait.prevents] == [("RAW", "x")]


# --- redundant synchronizations ------------------------------------------------------------

def test_a_synchronize_after_a_copy_the_host_never_reads_is_redundant():
    d = Device("sim")
    a = d.stream("A")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), stream=a, writes=[x], name="fill")
    d.copy(y, x, stream=a)
    a.synchronize()
    result = audit(d.trace)
    finding = only(result)
    assert finding.verdict is Verdict.REDUNDANT and finding.prevents == ()
    assert result.removed == (1,) and result.needed == 0
    assert_minimal_set_holds(d, result)


def double_wait():
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    done = a.record(d.event("done"))
    b.wait_event(done)
    b.wait_event(done)
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
    return d


def test_a_double_wait_keeps_exactly_one():
    d = double_wait()
    result = audit(d.trace)
    first, second = result.findings
    assert first.verdict is second.verdict is Verdict.REDUNDANT
    # Each names the other: the earlier is covered by the later, the later implied by the earlier.
    assert first.reason.startswith("covered: #2")
    assert second.reason.startswith("implied: ") and "#1" in second.reason
    assert_covers_hold(list(d.trace), result)
    assert len(result.keep) == 1 and len(result.removed) == 1
    assert result.summary().startswith("1 of 2 synchronizations are needed")
    assert_minimal_set_holds(d, result)


def test_a_wait_implied_through_a_third_stream_is_redundant_and_names_the_wait_that_implies_it():
    d = Device("sim")
    a, b, c = d.stream("A"), d.stream("B"), d.stream("C")
    x, y, z = d.alloc(4, name="x"), d.alloc(4, name="y"), d.alloc(4, name="z")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    a_done = a.record(d.event("a_done"))
    b.wait_event(a_done)
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="middle")
    c.wait_event(b.record(d.event("b_done")))
    c.wait_event(a_done)  # already implied: A -> B -> C
    d.launch(copy, (y, z), stream=c, reads=[x, y], writes=[z], name="consumer")
    result = audit(d.trace)
    verdicts = [(f.verdict, f.sync.what) for f in result.findings]
    assert verdicts == [(Verdict.NECESSARY, "stream B waits on event `a_done` (recorded on stream A)"),
                        (Verdict.NECESSARY, "stream C waits on event `b_done` (recorded on stream B)"),
                        (Verdict.REDUNDANT, "stream C waits on event `a_done` (recorded on stream A)")]
    assert result.findings[2].reason.startswith("implied: what it waits for was already ordered by #2 ")
    assert result.keep == (1, 2) and result.removed == (3,)
    assert_minimal_set_holds(d, result)


def test_a_device_synchronize_implied_by_two_host_syncs_names_both_the_latest_first():
    """A device synchronize waits for every stream; here the setup's synchronize ordered A and
    the step's host read ordered B, so the reason names both, the host read first (not just the
    first stream it looked at)."""
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), stream=a, writes=[x], name="setup")
    d.synchronize()  # #1: the host reads x next
    assert d.host_read(x).tolist() == [1, 1, 1, 1]
    d.launch(fill, (y,), stream=b, writes=[y], name="step")
    assert d.get(y, stream=b).tolist() == [1, 1, 1, 1]  # #2: the host read syncs B
    d.synchronize()  # #3: A and B are both ordered already
    result = audit(d.trace)
    assert [f.verdict for f in result.findings] == [Verdict.HOST_NEEDED, Verdict.HOST_NEEDED, Verdict.REDUNDANT]
    reason = result.findings[2].reason
    assert reason.startswith("implied: what it waits for was already ordered by #2 (the host synchronizes stream B")
    assert " and #1 (the host synchronizes " in reason, reason
    assert result.removed == (3,)


def host_sync_then_work_then_read(work: int, steps: int = 3):
    """Each step: A produces x; the host synchronizes A (a device-side wait would do); B copies x
    to y, then `work` more kernels on B; the host reads y (it must block there)."""
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y, z = d.alloc(4, name="x"), d.alloc(4, name="y"), d.alloc(4, name="z")
    for _ in range(steps):
        d.launch(fill, (x,), stream=a, writes=[x], name="producer")
        a.synchronize()
        d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
        for _ in range(work):
            d.launch(fill, (z,), stream=b, writes=[z], name="more")
        assert d.get(y, stream=b).tolist() == [1, 1, 1, 1]
    return d


@pytest.mark.parametrize("work, little", [(0, True), (6, False)])
def test_a_replaced_host_synchronize_says_how_far_the_host_gets_before_it_blocks_again(work, little):
    result = audit(host_sync_then_work_then_read(work).trace)
    replaced, read = result.findings
    assert (replaced.verdict, read.verdict) == (Verdict.DEVICE_SIDE, Verdict.HOST_NEEDED)
    assert result.replaced == (1,) and result.keep == (2,)
    issued = f"{work + 1} operation{'s' if work else ''}"  # the consumer and the extra kernels
    assert replaced.gain.startswith(f"after it the host issues {issued} (median of 3 occurrences) "
                                    "before #2 blocks it again"), replaced.gain
    assert ("little to gain" in replaced.gain) is little
    assert f"      gain: {replaced.gain}" in result.format(width=10_000)
    assert result.to_dict()["findings"][0]["gain"] == replaced.gain and read.gain == ""


def test_a_replaced_host_synchronize_the_host_never_blocks_after_has_no_gain_line():
    result = audit(host_sync_before_consumer(device_side=False).trace)
    assert only(result).verdict is Verdict.DEVICE_SIDE and only(result).gain == ""


# --- what the host itself needs; queries ---------------------------------------------------

@pytest.mark.parametrize("how", ["get", "synchronize then host_read"])
def test_a_host_read_of_what_the_gpu_wrote_needs_the_host_to_block(how):
    d = Device("sim")
    a = d.stream("A")
    x = d.alloc(4, name="x")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    if how == "get":
        value = d.get(x, stream=a)
    else:
        a.synchronize()
        value = d.host_read(x)
    assert value.tolist() == [1, 1, 1, 1]
    result = audit(d.trace)
    finding = only(result)
    assert finding.verdict is Verdict.HOST_NEEDED
    assert finding.sync.kind == ("host read" if how == "get" else "stream synchronize")
    (what,) = finding.host_bytes
    assert what.startswith("reads `x` bytes [0, 16) at ") and "which `producer` on stream A" in what
    assert result.keep == (1,)
    assert "      the host reads `x` bytes [0, 16) at " in result.format()


def test_a_busy_loop_on_query_is_checked_and_its_query_is_timing_dependent():
    d = Device("sim", policy="delay", streams=["A"], steps=4)  # A's work waits: the loop polls
    a = d.stream("A")
    x = d.alloc(4, name="x")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    polls = 1
    while not a.query():
        polls += 1
    assert d.host_read(x).tolist() == [1, 1, 1, 1]
    assert polls > 1 and not d.races  # a done query orders the host read: no race, none flagged
    result = audit(d.trace)
    finding = only(result)  # the not-done polls ordered nothing: not synchronizations
    assert finding.verdict is Verdict.TIMING and finding.sync.kind == "query"
    assert result.keep == (1,) and result.removed == ()


def test_the_caching_allocators_record_stream_query_is_named_as_the_allocators_and_kept():
    # An emulated torch program: a block used on a side stream (record_stream), freed, then a same-size
    # allocation on its stream. torch's allocator queries its record_stream event before reusing it.
    import torch

    from streamcheck.emulation.torch_cuda import Emulation

    d = Device("sim")
    with Emulation(d):
        side = torch.cuda.Stream()
        for _ in range(2):
            x = torch.ones(256, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x * 2
            x.record_stream(side)
            del x
        torch.cuda.current_stream().wait_stream(side)
        assert y.tolist() == [2.0] * 256
    result = audit(d.trace)
    allocator = [f for f in result.findings if "record_stream" in f.sync.what]
    assert len(allocator) == 1
    finding = allocator[0]
    assert finding.verdict is Verdict.TIMING and "the host polled" not in finding.sync.what
    assert finding.sync.what.startswith("torch's caching allocator found its record_stream event on stream s1 passed")
    assert "not the program's synchronization" in finding.reason and finding.number in result.keep
    assert "the caching allocator's own query (record_stream), not the program's" in result.format()


# --- necessary waits -----------------------------------------------------------------------

def test_a_captured_fork_and_join_are_needed_because_without_either_cuda_refuses_the_capture():
    d = Device("sim")
    origin, a = d.stream("origin"), d.stream("A")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    origin.begin_capture()
    fork = d.event()
    fork.record(origin)
    a.wait_event(fork)
    d.launch(fill, (x,), stream=a, writes=[x], name="fill")
    join = d.event()
    join.record(a)
    origin.wait_event(join)
    d.launch(copy, (x, y), stream=origin, reads=[x], writes=[y], name="use")
    graph = origin.end_capture()
    for _ in range(3):  # launches of a graph the edited trace could not capture are not fed
        graph.launch(origin)
    origin.synchronize()
    assert d.host_read(y).tolist() == [1, 1, 1, 1] and not d.races
    result = audit(d.trace)
    fork_wait, join_wait, _ = result.findings
    assert fork_wait.sync.captured and join_wait.sync.captured
    assert fork_wait.verdict is Verdict.NECESSARY and join_wait.verdict is Verdict.NECESSARY
    assert fork_wait.reason.startswith("without it CUDA refuses the capture: cudaErrorStreamCaptureIsolation")
    assert join_wait.reason.startswith("without it CUDA refuses the capture: cudaErrorStreamCaptureUnjoined")
    assert {fork_wait.number, join_wait.number} <= set(result.keep)


def test_a_necessary_wait_names_the_race_kind_the_buffer_and_both_call_sites():
    d = host_sync_before_consumer(device_side=True)
    finding = only(audit(d.trace))
    assert finding.verdict is Verdict.NECESSARY and finding.reason.startswith("removing it alone makes ")
    (race,) = finding.prevents
    assert (race.kind, race.buffer, race.start, race.stop) == ("RAW", "x", 0, 16)
    assert same_place(race.first.site, site_of(d, "producer")) and race.first.actor == "stream A"
    assert same_place(race.second.site, site_of(d, "consumer")) and race.second.actor == "stream B"


def test_the_implicit_join_of_a_blocking_stream_with_the_legacy_stream_can_be_necessary():
    # Legacy-stream semantics order the consumer after the producer: no wait is written, and
    # without the join (the stream non-blocking) the consumer reads `x` too early.
    d = Device("sim")
    b = d.stream("B", kind="blocking")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), writes=[x], name="producer")  # the legacy default stream
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
    assert not d.races
    result = audit(d.trace)
    finding = only(result)
    assert finding.sync.kind == "legacy join"
    assert finding.verdict is Verdict.NECESSARY, result.format()
    assert [(r.kind, r.buffer) for r in finding.prevents] == [("RAW", "x")]
    assert result.keep == (1,)


# --- syncs needed together -----------------------------------------------------------------

def host_sync_then_wait():
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    done = a.record(d.event("done"))
    a.synchronize()  # the host waits for A ...
    b.wait_event(done)  # ... and B waits for A too: either orders the consumer
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
    return d


@pytest.mark.parametrize("program", [double_wait, host_sync_then_wait])
def test_two_syncs_redundant_alone_are_not_removable_together(program):
    d = program()
    ops = list(d.trace)
    result = audit(ops)
    first, second = result.findings
    assert first.verdict is second.verdict is Verdict.REDUNDANT
    assert not check(edit(ops, remove={first.sync.key})) and not check(edit(ops, remove={second.sync.key}))
    both = check(edit(ops, remove={first.sync.key, second.sync.key}))
    assert [(r.kind, r.buffer) for r in both] == [("RAW", "x")]
    assert len(result.keep) == 1 and result.needed == 1
    assert_minimal_set_holds(d, result)


def test_a_host_synchronize_covered_by_a_later_wait_says_so():
    # Removing both makes a race, so the host synchronize does order shared bytes: its reason
    # must name the wait that covers it, not say it orders nothing.
    d = host_sync_then_wait()
    result = audit(d.trace)
    first = result.findings[0]
    assert first.sync.kind == "stream synchronize"
    assert first.reason.startswith("covered: #2 "), first.reason
    assert_covers_hold(list(d.trace), result)


def test_the_minimal_set_drops_the_host_synchronize_and_keeps_the_device_side_wait():
    # Of two orderings of the same stream pair, the one that does not block the host stays
    # (DESIGN: a host sync whose only purpose is to order two streams becomes a device-side wait).
    result = audit(host_sync_then_wait().trace)
    assert [f.sync.kind for f in result.findings] == ["stream synchronize", "wait_event"]
    assert result.removed == (1,) and result.keep == (2,), result.format()


# --- runs without syncs, runs with races ---------------------------------------------------

def test_a_run_without_any_synchronization_says_so():
    d = Device("sim")
    a = d.stream("A")
    x = d.alloc(4, name="x")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    result = audit(d.trace)
    assert result.findings == () and result.needed == 0
    assert result.summary() == "no synchronization in this run"
    assert "no synchronization in this run" in result.format()
    assert result.to_dict()["total"] == 0 and result.to_dict()["findings"] == []


def test_a_run_with_a_race_already_says_the_races_come_first():
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")  # no wait: a race
    a.synchronize()
    result = audit(d.trace)
    assert [(r.kind, r.buffer) for r in result.races] == [("RAW", "x")]
    assert "the run has 1 race already; fix those first" in result.format().splitlines()[1]
    assert result.to_dict()["races_first"] == 1


# --- the report ----------------------------------------------------------------------------

def test_format_and_to_dict_say_the_same():
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    for _ in range(3):  # a decode loop: one line, seen three times
        d.launch(fill, (x,), stream=a, writes=[x], name="producer")
        b.wait_event(a.record(d.event("produced")))
        d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
        d.synchronize()
        d.synchronize()  # twice: either one orders the host read, one is needed
        d.host_read(y)
    result = audit(d.trace)
    data = json.loads(json.dumps(result.to_dict()))
    # Occurrences are counted, with the lines of code beside them.
    assert data["summary"] == result.summary() == "6 of 9 synchronizations are needed, at 2 of 3 sites; removable: #3"
    assert (data["needed"], data["total"], data["sites"], data["keep"], data["removed"]) == (6, 9, 3, [1, 2], [3])
    assert [(f["kind"], f["verdict"], f["count"]) for f in data["findings"]] == [
        ("wait_event", "necessary", 3), ("device synchronize", "redundant", 3),
        ("device synchronize", "redundant", 3)]
    assert data["findings"][0]["prevents"][0]["buffer"] == "x"
    assert data["findings"][1]["reason"].startswith("covered: #3 ")
    assert data["findings"][2]["reason"].startswith("implied: what it waits for was already ordered by #2 ")
    text = result.format()
    assert text.splitlines()[0] == "streamcheck sync audit (this run: these inputs, this control flow)"
    assert "  minimal sufficient set: 6 of 9 synchronizations are needed, at 2 of 3 sites; removable: #3" in text
    assert "    keep: #1, #2" in text
    # #2 is redundant alone, but the set keeps it: the table must not offer it for removal.
    assert data["findings"][1]["kept"] == [1, 2, 3] and data["findings"][2]["removed"] == [1, 2, 3]
    assert re.search(r"^  2  kept by the set  ", text, re.M), text
    assert f"  #2 redundant alone: {data['findings'][1]['reason']}" in text
    for f in (data["findings"][0], data["findings"][2]):
        assert f"  #{f['number']} {f['verdict']}: {f['reason']}" in text
    assert_covers_hold(list(d.trace), result)


def test_the_minimal_set_applied_to_the_trace_is_race_free_and_each_kept_sync_needed():
    def fill(y):
        y[:] = 1

    def copy(x, y):
        y[:] = x

    dev = Device("sim")
    a, b = dev.stream("A"), dev.stream("B")
    x, y = dev.alloc((4,), name="x", fill=0), dev.alloc((4,), name="y", fill=0)
    dev.launch(fill, [x], stream=a, writes=[x], name="produce")
    a.synchronize()  # replaced by a device-side wait
    dev.launch(copy, [x, y], stream=b, reads=[x], writes=[y], name="consume")
    dev.get(y, stream=b)
    dev.synchronize()  # removable
    ops = list(dev.trace)
    result = audit(ops)
    assert result.replaced and result.removed, result.format()
    assert check(result.apply(ops)) == [], result.format()
    for number in result.keep + result.replaced:
        assert check(result.apply(ops, drop=(number,))), f"#{number} is not needed\n{result.format()}"


# --- reasons name the real cause (issue 31 §2) ---------------------------------------------

def test_a_sync_whose_bytes_only_its_own_stream_touches_again_orders_no_shared_bytes():
    """One other synchronization, and nothing of another stream or the host reads the bytes: the
    reason is that it orders no shared bytes, not a cover by "the other synchronizations"."""
    d = Device("sim")
    a = d.stream("A")
    x = d.alloc(4, name="x")
    d.launch(fill, (x,), stream=a, writes=[x], name="first")
    a.synchronize()
    d.launch(fill, (x,), stream=a, writes=[x], name="second")  # stream order orders it anyway
    d.synchronize()
    result = audit(d.trace)
    assert [f.verdict for f in result.findings] == [Verdict.REDUNDANT, Verdict.REDUNDANT], result.format()
    for finding in result.findings:
        assert finding.reason.startswith("it orders no shared bytes: "), finding.reason
    assert result.removed == (1, 2)


def test_a_read_after_a_write_is_shared_bytes_and_a_sync_covered_only_by_two_others_together_says_so():
    """Audit rule: "orders no shared bytes" counts a read after a write (a read-write pair), not
    only two writes. The host synchronize is redundant alone and with either wait gone; with
    both gone, B reads `x` unordered: it does order shared bytes."""
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x"), d.alloc(4, name="y")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    done = a.record(d.event("done"))
    a.synchronize()
    b.wait_event(done)
    b.wait_event(done)
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")  # reads what A wrote
    ops = list(d.trace)
    result = audit(ops)
    first = result.findings[0]
    assert first.sync.kind == "stream synchronize" and first.verdict is Verdict.REDUNDANT
    assert first.reason.startswith("covered by the later synchronizations together: removing it with all 2 of them "
                                   "makes a race"), first.reason
    assert check(edit(ops, remove={f.sync.key for f in result.findings}))  # all three gone: the RAW


def test_a_double_waits_kept_first_wait_does_not_read_as_redundant_in_the_table():
    d = double_wait()
    result = audit(d.trace)
    kept, = result.keep
    rows = {line.split()[0]: line for line in result.format(width=10_000).splitlines()[1:4]}
    assert re.match(rf"^  {kept}  kept by the set  wait_event ", rows[str(kept)]), rows
    assert f"  #{kept} redundant alone: " in result.format(width=10_000)


def test_an_event_recreated_each_step_is_replaced_by_a_wait_on_each_steps_own_event():
    """A loop that creates its event each step and synchronizes it: the device-side replacement
    waits on the event of that occurrence (waiting on the first step's would order nothing
    later), and says so."""
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    y = d.alloc(4, name="y", fill=0)
    for step in range(3):
        x = d.alloc(4, name=f"x{step}", fill=0)
        d.launch(fill, (x,), stream=a, writes=[x], name="producer")
        produced = d.event("produced")
        produced.record(a)
        produced.synchronize()
        d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
    assert not d.races
    ops = list(d.trace)
    result = audit(ops)
    (finding,) = result.findings
    assert finding.at == (Verdict.DEVICE_SIDE,) * 3, result.format()
    (replacement,) = finding.replacement
    assert replacement.describe().startswith("make stream B wait on event `produced` (the one that occurrence "
                                             "synchronizes: a new one each time)")
    assert result.replaced == (1,) and check(result.apply(ops)) == []


def test_a_wait_needed_at_its_first_occurrence_only_is_not_implied():
    """Audit rule: "implied" (redundant without a re-check) needs every occurrence of a site to
    add no order. The wait on an event recorded once adds order at the first step only; later
    steps' waits are implied, the first is needed."""
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x", fill=0), d.alloc(4, name="y", fill=0)
    d.launch(fill, (x,), stream=a, writes=[x], name="setup")
    ready = a.record(d.event("ready"))
    for _ in range(3):
        b.wait_event(ready)
        d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
    result = audit(d.trace)
    (finding,) = result.findings
    assert finding.verdict is Verdict.NECESSARY, result.format()
    assert finding.at == (Verdict.NECESSARY, Verdict.REDUNDANT, Verdict.REDUNDANT)
    assert finding.where == "at the first of 3 occurrences: wait once, at the first step"
    assert [(r.kind, r.buffer) for r in finding.prevents] == [("RAW", "x")]
    assert finding.kept == (1,) and finding.removed_at == (2, 3)


def test_device_side_is_offered_only_once_the_trace_with_the_replacement_wait_checks_clean():
    """Audit rule: "device-side suffices" is re-checked with the replacement in the trace. Here
    B is capturing a graph when the host synchronizes A: the replacement wait would be a graph
    edge on an event recorded outside the capture, which orders no executed work, so the
    launched graph's consumer still races with the producer. The host synchronize stays."""
    d = Device("sim")
    a, b = d.stream("A"), d.stream("B")
    x, y = d.alloc(4, name="x", fill=0), d.alloc(4, name="y", fill=0)
    b.begin_capture(mode="relaxed")
    d.launch(fill, (x,), stream=a, writes=[x], name="producer")
    a.synchronize()
    d.launch(copy, (x, y), stream=b, reads=[x], writes=[y], name="consumer")
    b.end_capture().launch(b)
    assert not d.races
    result = audit(d.trace)
    finding = only(result)
    assert finding.verdict is Verdict.NECESSARY and finding.replacement == (), result.format()
    assert [(r.kind, r.buffer) for r in finding.prevents] == [("RAW", "x")]
    assert "its device-side replacement, checked in the trace, does not order every one" in finding.reason
    assert result.keep == (1,) and result.replaced == ()
