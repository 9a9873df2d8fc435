"""Race-directed confirmation on the sim (streamcheck/proofs/confirm.py): every racy pattern of the rule
tests that the device API can express strikes when its first access is held until the second has
run, and the report shows the stale value; every safe twin has nothing to confirm.

Kernels write distinct constants, so a stale read is visible as a value."""
import threading

import numpy as np
import pytest

from streamcheck.proofs.confirm import Confirmation, confirm, confirm_races
from streamcheck.core.schedule import Confirm, ScheduleError, Target
from streamcheck.device import Device
from tests.streamcheck.device.backends.test_sim_rules import decode_steps, legacy_consumer, three_writes


def put(value, name="produce"):
    def kernel(x):
        x[...] = value
    kernel.__name__ = name
    return kernel


def copy_into(dst, src):
    dst[...] = src


def setup(dev, kind_a="non_blocking", kind_b="non_blocking"):
    a, b = dev.stream("A", kind_a), dev.stream("B", kind_b)
    x = dev.alloc((4,), "float32", name="x", fill=0.0)
    y = dev.alloc((4,), "float32", name="y", fill=-1.0)
    return a, b, x, y


def produce(dev, x, stream, value=1.0):
    dev.launch(put(value), (x,), stream=stream, writes=[x], name="produce")


def consume(dev, y, x, stream):
    dev.launch(copy_into, (y, x), stream=stream, reads=[x], writes=[y], name="consume")


# --- the programs: (racy, safe twin) -------------------------------------------------------------

def two_streams(dev, joined=False):
    a, b, x, y = setup(dev)
    produce(dev, x, a)
    if joined:
        b.wait_event(a.record())
    consume(dev, y, x, b)
    return dev.get(y, stream=b)


def wait_on_never_recorded(dev, recorded_first=False):
    a, b, x, y = setup(dev)
    e = dev.event("done")
    produce(dev, x, a)
    if recorded_first:
        e.record(a)
    b.wait_event(e)
    e.record(a)
    consume(dev, y, x, b)
    return dev.get(y, stream=b)


def wait_then_rerecord(dev, rerecord_before_wait=False):
    a, b, x, y = setup(dev)
    e = dev.event("done")
    e.record(a)
    produce(dev, x, a)
    if rerecord_before_wait:
        e.record(a)
    b.wait_event(e)
    e.record(a)
    consume(dev, y, x, b)
    return dev.get(y, stream=b)


def legacy_first(dev, kind="non_blocking"):
    s = dev.stream("S", kind)
    x = dev.alloc((4,), "float32", name="x", fill=0.0)
    y = dev.alloc((4,), "float32", name="y", fill=-1.0)
    produce(dev, x, dev.legacy)
    consume(dev, y, x, s)
    return dev.get(y, stream=s)


def blocking_streams(dev, through_legacy=False):
    a, b, x, y = setup(dev, "blocking", "blocking")
    produce(dev, x, a)
    if through_legacy:
        dev.launch(lambda: None, (), stream=dev.legacy, name="unrelated")
    consume(dev, y, x, b)
    return dev.get(y, stream=b)


def host_read(dev, sync="none"):
    a, b, x, y = setup(dev)
    produce(dev, x, a)
    if sync == "stream":
        a.synchronize()
    elif sync == "other stream":
        b.synchronize()
    return dev.host_read(x)


def issue_after_sync(dev, sync=False):
    a, b, x, y = setup(dev)
    produce(dev, x, a)
    if sync:
        a.synchronize()
    consume(dev, y, x, b)
    return dev.get(y, stream=b)


def event_sync_too_early(dev, after_producer=False):
    a, b, x, y = setup(dev)
    e = dev.event("done")
    if not after_producer:
        e.record(a)
    produce(dev, x, a)
    if after_producer:
        e.record(a)
    e.synchronize()
    return dev.host_read(x)


def host_overwrite(dev, synced=False):
    a, b, x, y = setup(dev)
    consume(dev, y, x, a)
    if synced:
        a.synchronize()
    dev.host_write(x, 5.0)
    return dev.get(y, stream=a)


def upload_then_read(dev, waited=False):
    a, b, x, y = setup(dev)
    dev.upload(x, np.full(4, 3.0, dtype=np.float32), stream=a)
    if waited:
        b.wait_event(a.record())
    consume(dev, y, x, b)
    return dev.get(y, stream=b)


def download_then_overwrite(dev, waited=False):
    a, b, x, y = setup(dev)
    out = dev.download(x, stream=a)
    if waited:
        b.wait_event(a.record())
    produce(dev, x, b, 6.0)
    dev.synchronize()
    return out


def copy_between_streams(dev, waited=False):
    a, b, x, y = setup(dev)
    produce(dev, x, a, 8.0)
    if waited:
        b.wait_event(a.record())
    dev.copy(y, x, stream=b)
    return dev.get(y, stream=b)


def overlapping_writes(dev, disjoint=False):
    a, b, x, y = setup(dev)
    dev.launch(put(1.0), (x[0:2] if disjoint else x[0:3],), stream=a, writes=[x[0:2] if disjoint else x[0:3]],
               name="fill first part")
    dev.launch(put(2.0), (x[2:4] if disjoint else x[1:4],), stream=b, writes=[x[2:4] if disjoint else x[1:4]],
               name="fill second part")
    dev.synchronize()
    return dev.host_read(x)


def event_chain(dev, complete=False):
    a, b, x, y = setup(dev)
    c = dev.stream("C")
    produce(dev, x, a)
    b.wait_event(a.record())
    dev.launch(lambda: None, (), stream=b, name="relay")
    if complete:
        c.wait_event(b.record())
    consume(dev, y, x, c)
    return dev.get(y, stream=c)


def free_in_use(dev, waited=False):
    a, b, x, y = setup(dev)
    produce(dev, x, a)
    if waited:
        b.wait_event(a.record())
    dev.free(x, stream=b)
    dev.synchronize()


def reused_in_use(dev, waited=False, first_reads=False):
    """x's bytes handed to a new allocation on B (a caching allocator's reuse) while A's use of x
    may still be pending: A's write clobbers the new owner's, or A's read sees what it wrote."""
    a, b, x, y = setup(dev)
    if first_reads:
        consume(dev, y, x, a)
    else:
        produce(dev, x, a)
    if waited:
        b.wait_event(a.record())
    dev.free(x, stream=b)
    z = dev.alloc((4,), "float32", name="z", reuse=x, stream=b)
    produce(dev, z, b, 7.0)
    dev.synchronize()
    return dev.host_read(z), dev.host_read(y)


def decode(dev, **kwargs):
    return decode_steps(dev, **kwargs)


PAIRS = [
    # (id, racy program, its safe twin, the kinds the racy one reports)
    ("two-streams", two_streams, lambda d: two_streams(d, joined=True), ["RAW"]),
    ("wait-before-record", wait_on_never_recorded, lambda d: wait_on_never_recorded(d, True), ["RAW"]),
    ("wait-then-rerecord", wait_then_rerecord, lambda d: wait_then_rerecord(d, True), ["RAW"]),
    ("legacy-consumer", lambda d: legacy_consumer(d, "non_blocking"), lambda d: legacy_consumer(d, "blocking"),
     ["RAW"]),
    ("legacy-producer", legacy_first, lambda d: legacy_first(d, "blocking"), ["RAW"]),
    ("blocking-streams", blocking_streams, lambda d: blocking_streams(d, True), ["RAW"]),
    ("host-read-without-sync", host_read, lambda d: host_read(d, "stream"), ["RAW"]),
    ("sync-of-other-stream", lambda d: host_read(d, "other stream"), lambda d: host_read(d, "stream"), ["RAW"]),
    ("issue-without-host-sync", issue_after_sync, lambda d: issue_after_sync(d, True), ["RAW"]),
    ("event-sync-recorded-too-early", event_sync_too_early, lambda d: event_sync_too_early(d, True), ["RAW"]),
    ("host-overwrite-during-read", host_overwrite, lambda d: host_overwrite(d, True), ["WAR"]),
    ("copy-H2D", upload_then_read, lambda d: upload_then_read(d, True), ["RAW"]),
    ("copy-D2H", download_then_overwrite, lambda d: download_then_overwrite(d, True), ["WAR"]),
    ("copy-D2D", copy_between_streams, lambda d: copy_between_streams(d, True), ["RAW"]),
    ("overlapping-ranges", overlapping_writes, lambda d: overlapping_writes(d, True), ["WAW"]),
    ("event-chain", event_chain, lambda d: event_chain(d, True), ["RAW"]),
    ("decode-missing-join", lambda d: decode(d, join=False), decode, ["RAW"]),
    ("decode-missing-war-edge", lambda d: decode(d, war=False), decode, ["WAR"]),
    ("wait-sees-state-at-wait", lambda d: three_writes(d, False), lambda d: three_writes(d, True), ["RAW"]),
]


@pytest.mark.parametrize("racy, kinds", [pytest.param(p[1], p[3], id=p[0]) for p in PAIRS])
def test_every_racy_pattern_is_confirmed_with_the_stale_value(racy, kinds):
    results = confirm_races(racy)
    assert [c.race.kind for c in results] == kinds
    for c in results:
        assert c.confirmed, c.format()
        assert c.got != c.expected and not (np.isnan(c.got) and np.isnan(c.expected))
        line = c.format()
        assert line.startswith("confirmed on the sim: ")
        assert f"= {c.got!r}, the sequential run " in line and f"{c.expected!r} (held `" in line
        assert "; replay: Device(\"sim\", policy='replay:" in line


@pytest.mark.parametrize("safe", [pytest.param(p[2], id=p[0]) for p in PAIRS]
                         + [pytest.param(lambda d: free_in_use(d, True), id="free-after-wait")])
def test_every_safe_twin_has_nothing_to_confirm(safe):
    assert confirm_races(safe) == ()


def test_the_missing_join_line_shows_the_previous_steps_value():
    (c,) = confirm_races(lambda d: decode(d, join=False))
    assert (c.reader.split(" at ")[0], c.element, c.got, c.expected) == ("`consume` on stream B", "x[0]", 0.0, 1.0)
    assert "held `produce` on stream A at test_sim_rules.py:" in c.format()


def test_a_war_race_shows_what_the_reader_read_after_the_overwrite():
    (c,) = confirm_races(host_overwrite)
    assert c.reader.startswith("`consume` on stream A") and (c.element, c.got, c.expected) == ("x[0]", 5.0, 0.0)
    assert "until `host write` on host thread 0 at" in c.held


def test_a_waw_race_shows_the_bytes_after_both_writes():
    (c,) = confirm_races(overlapping_writes)
    assert c.reader == "" and (c.element, c.got, c.expected) == ("x[1]", 1.0, 2.0)
    assert c.format().startswith("confirmed on the sim: after both writes x[1] = 1.0, the sequential run left 2.0")


def test_the_replay_line_repeats_the_stale_read():
    (c,) = confirm_races(two_streams)
    policy = c.replay.split("policy=")[1].rstrip(")").strip("'")
    np.testing.assert_array_equal(two_streams(Device("sim", policy=policy)), [0.0] * 4)
    np.testing.assert_array_equal(two_streams(Device("sim", policy="sequential")), [1.0] * 4)


def test_a_free_nothing_reuses_is_no_race_but_a_hazard():
    assert confirm_races(free_in_use) == ()
    dev = Device("sim", policy="sequential")
    free_in_use(dev)
    assert dev.races == [] and [h.race.first.name for h in dev.hazards] == ["produce"]
    assert "1 free hazard" in dev.report()


def test_a_strict_free_race_is_not_claimed_since_nothing_got_its_bytes():
    from streamcheck.proofs.confirm import confirm

    reference = Device("sim", policy="sequential", strict_free=True)
    free_in_use(reference)
    reference.synchronize()
    [race] = reference.races
    c = confirm(free_in_use, race, reference=reference)
    assert race.kind == "FREE" and not c.confirmed and "no allocation got the freed bytes" in c.why


@pytest.mark.parametrize("first_reads", [False, True], ids=["held-write-clobbers-new-owner", "held-read-sees-new-owner"])
def test_a_reuse_free_race_is_confirmed_by_the_values(first_reads):
    (c,) = confirm_races(lambda d: reused_in_use(d, first_reads=first_reads))
    assert c.race.kind == "FREE" and c.confirmed, c.format()
    if first_reads:  # A's read of x, held past the reuse, sees what the new owner wrote
        assert c.reader.startswith("`consume` on stream A") and (c.got, c.expected) == (7.0, 0.0)
    else:  # A's write, held past the new owner's, is what z holds at the end
        assert (c.got, c.expected) == (1.0, 7.0) and c.element.startswith("x[")


def test_a_reuse_after_the_allocating_stream_waited_is_clean():
    dev = Device("sim", policy="sequential")
    reused_in_use(dev, waited=True)
    assert dev.races == [] and dev.hazards == []


def test_a_synchronize_that_does_not_wait_for_the_first_access_leaves_the_hold_in_place():
    def racy(dev):
        a, b, x, y = setup(dev)
        produce(dev, x, a)
        a.synchronize()
        produce(dev, x, a, 2.0)  # the race's first access (the second write)...
        dev.event("done").synchronize()  # a never-recorded event: returns at once, waits for nothing
        consume(dev, y, x, b)  # ...and its second
        b.synchronize()
        return dev.host_read(y)

    (c,) = confirm_races(racy)
    assert c.confirmed and (c.got, c.expected) == (1.0, 2.0)


def test_a_host_synchronize_that_waits_for_the_first_access_makes_it_not_confirmed():
    # A thread the device never saw start is unordered with the main thread, so the main
    # thread's synchronize orders nothing for it: a race. In the rerun that synchronize waits
    # for the held `produce`, so the hold cannot outlast it, and the program must not hang.
    def program(dev):
        a, b, x, y = setup(dev)
        produce(dev, x, a)
        a.synchronize()
        t = threading.Thread(target=consume, args=(dev, y, x, b))
        t.start()
        t.join()
        return dev.get(y, stream=b)

    (c,) = confirm_races(program)
    assert c.race.kind == "RAW" and not c.confirmed
    assert c.why.startswith("a host synchronize between them held the host: it waited for `produce` on stream A")


def test_the_second_access_never_issued_in_the_rerun_is_said():
    calls = []

    def program(dev):
        calls.append(1)
        a, b, x, y = setup(dev)
        produce(dev, x, a)
        if len(calls) != 3:  # runs 1 and 2 (the references) read; run 3, the directed rerun, does not
            consume(dev, y, x, b)

    reference = Device("sim", policy="sequential")
    program(reference)
    (race,) = reference.races
    c = confirm(program, race, reference=reference)
    assert len(calls) == 3
    assert not c.confirmed and c.why.startswith("the second access was never issued in the rerun (`consume` on "
                                                "stream B at test_confirm.py:")


def _races_of(program):
    dev = Device("sim", policy="sequential")
    program(dev)
    return dev.races


def test_a_program_whose_race_sites_differ_between_runs_is_not_claimed():
    calls = []

    def program(dev):
        calls.append(1)
        a, b, x, y = setup(dev)
        produce(dev, x, a)
        if len(calls) == 1:
            consume(dev, y, x, b)

    (race,) = _races_of(program)
    c = confirm(program, race)  # its own sequential run no longer has the race
    assert not c.confirmed and "not deterministic between runs" in c.why and "not claimed" in c.why


def test_over_the_cap_races_are_listed_as_not_attempted():
    def program(dev):
        a, b, x, y = setup(dev)
        produce(dev, x, a)
        consume(dev, y, x, b)
        produce(dev, y, a, 3.0)

    results = confirm_races(program, max_races=1)
    assert len(results) == 2 and results[0].confirmed
    assert not results[1].confirmed and results[1].why == "not attempted (over the cap of 1 races per test)"


def test_bad_input_is_refused_early():
    (race,) = _races_of(two_streams)
    with pytest.raises(TypeError, match="program must be a callable"):
        confirm("two_streams", race)
    with pytest.raises(TypeError, match="race must be a streamcheck Race"):
        confirm(two_streams, "RAW")
    with pytest.raises(ScheduleError, match="unknown schedule policy"):
        confirm(two_streams, race, policy="fast")
    with pytest.raises(ValueError, match="max_races must be an integer >= 0"):
        confirm_races(two_streams, max_races=-1)


def test_the_directed_rerun_follows_the_original_policy_otherwise():
    (race,) = _races_of(lambda d: decode(d, join=False))
    for policy, params in [("random", {}), ("pct", {}), ("delay", {"streams": ["B"], "steps": 2})]:
        c = confirm(lambda d: decode(d, join=False), race, policy=policy, seed=3, **params)
        assert c.confirmed and c.got != c.expected, (policy, c.format())


def test_the_confirm_policy_holds_only_the_named_occurrence():
    # Three launches of one site on A; hold the second (occurrence 1) until B's launch ran.
    dev_site = {}

    def program(dev):
        a, b = dev.stream("A"), dev.stream("B")
        x = dev.alloc((3,), "float32", name="x", fill=0.0)
        for i in range(3):
            dev.launch(put(float(i + 1)), (x[i:i + 1],), stream=a, writes=[x[i:i + 1]], name="step")
            dev_site.setdefault("a", dev.trace.ops[-1].site)
        dev.launch(lambda: None, (), stream=b, name="other")
        dev_site.setdefault("b", dev.trace.ops[-1].site)
        return x

    probe = Device("sim")
    program(probe)
    first = Target(1, "stream A", "step", dev_site["a"], 1)
    second = Target(2, "stream B", "other", dev_site["b"], 0)
    order = []
    policy = Confirm(first, second, observe=lambda op, role: order.append((op.name, role)))
    dev = Device("sim", policy=policy)
    program(dev)
    dev.synchronize()
    launches = [entry for entry in order if entry[0] in ("step", "other")]
    assert launches == [("step", None), ("other", "second"), ("step", "first"), ("step", None)]
    assert policy.second_before_first and policy.first_held
    assert "confirm(hold `step` on stream A at" in dev.schedule.policy and "(occurrence 2)" in dev.schedule.policy
    assert dev.schedule.seed_args() is None  # built, not named: the replay string repeats it


def test_after_a_host_synchronize_released_the_first_access_later_occurrences_run_unheld():
    # The raced occurrence is 0; a.synchronize() makes it run (the sim never holds what the host
    # waits for). The next launch from the same site is another occurrence: not held for B.
    sites = {}

    def program(dev):
        a, b = dev.stream("A"), dev.stream("B")
        x = dev.alloc((2,), "float32", name="x", fill=0.0)
        for i in range(2):
            dev.launch(put(float(i + 1)), (x[i:i + 1],), stream=a, writes=[x[i:i + 1]], name="step")
            sites.setdefault("a", dev.trace.ops[-1].site)
            if i == 0:
                a.synchronize()
        dev.launch(lambda: None, (), stream=b, name="other")
        sites.setdefault("b", dev.trace.ops[-1].site)

    program(Device("sim"))
    order = []
    policy = Confirm(Target(1, "stream A", "step", sites["a"], 0), Target(2, "stream B", "other", sites["b"], 0),
                     observe=lambda op, role: order.append((op.name, role)))
    dev = Device("sim", policy=policy)
    program(dev)
    dev.synchronize()
    launches = [entry for entry in order if entry[0] in ("step", "other")]
    assert launches == [("step", "first"), ("step", None), ("other", "second")]


def host_rewrites_pending_copy(dev, synchronized=False):
    """The host overwrites the source of a copy still pending on A (a pinned staging buffer):
    the host's write happens after the call that records it returns, as an emulated operator's."""
    a, _, x, y = setup(dev)  # x holds 0.0
    dev.copy(y, x, stream=a)  # A reads x when it gets there
    if synchronized:
        a.synchronize()
    dev.host_access(writes=[x], name="host rewrite")
    x.storage[...] = 5.0  # the host's own write, after the call
    dev.synchronize()
    return dev.host_read(y)


def test_a_host_write_race_is_confirmed_by_holding_the_device_side_past_the_hosts_write():
    (c,) = confirm_races(host_rewrites_pending_copy)
    assert c.race.kind == "WAR" and c.race.second.actor == "host thread 0"
    assert c.confirmed and (c.got, c.expected) == (5.0, 0.0), c.format()
    assert confirm_races(lambda d: host_rewrites_pending_copy(d, synchronized=True)) == ()
