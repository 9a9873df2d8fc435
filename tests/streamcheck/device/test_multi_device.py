"""Several devices on the sim: the CUDA rules across devices (events cross them, each device has its
own legacy stream, a device synchronize waits for its own device), peer access and peer copies,
and collectives on comm streams, through three public bug classes, each with its fixed twin.

Every racy program is reported by the checker and made to strike: under a delay of the producer's
stream the values read differ from the sequential run's. Every twin is reported clean and reads
the sequential values under the same delay. Kernels write distinct values, so a stale read shows.
"""
import json

import numpy as np
import pytest

from streamcheck.device.backends import BUILT_IN
from streamcheck.device.backends.sim import SimBackend
from streamcheck.core.hb import Checker, PeerAccessError, TraceError, check
from streamcheck.core.trace import (Alloc, CallSite, CopyKind, DeviceSync, EventCreate, EventRecord, HostAccess,
                                    Launch, PeerAccess, Range, StreamCreate, StreamKind, StreamWait, Trace,
                                    op_to_dict)
from streamcheck.device import Device, DeviceError
from tests.streamcheck.proofs.test_confirm import copy_into, put

RANKS = 2


def strikes(program, streams, steps=8):
    """(sequential values, values under a delay of `streams`, the delayed run's races)."""
    want = program(Device("sim", devices=RANKS, policy="sequential"))
    dev = Device("sim", devices=RANKS, policy="delay", streams=streams, steps=steps)
    return want, program(dev), dev.races


def assert_racy(program, streams, buffer):
    want, got, races = strikes(program, streams)
    assert any(r.buffer == buffer for r in races), [r.format() for r in races]
    assert not all(np.array_equal(w, g) for w, g in zip(want, got)), (want, got)  # it struck
    return races


def assert_safe(program, streams):
    want, got, races = strikes(program, streams)
    assert races == []
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


# --- 1. a gradient post-hook on a side stream, the reduce-scatter on the comm stream ---------------
# DDP/FSDP's reducer runs the reduce-scatter on its comm stream after making it wait for the
# *current* stream; a post-hook that ran on a side stream (the current stream when it was
# registered) wrote the gradient there, so the reduce-scatter may read it before it is written.

def post_hook_reduce_scatter(dev, fixed=False):
    current = [dev.legacy_stream(k) for k in range(RANKS)]
    side = [dev.stream("side", device=k) for k in range(RANKS)]
    comm = [dev.stream("comm", device=k) for k in range(RANKS)]
    grads = [dev.alloc((4,), device=k, name=f"grad{k}", fill=0.0) for k in range(RANKS)]
    shards = [dev.alloc((2,), device=k, name=f"shard{k}", fill=-1.0) for k in range(RANKS)]
    for k in range(RANKS):
        dev.launch(put(k + 1.0, "post_hook"), (grads[k],), stream=side[k], writes=[grads[k]])
        if fixed:  # the hook's stream is joined into the current stream before the reducer runs
            current[k].wait_event(side[k].record())
    work = dev.reduce_scatter(shards, grads, comm, wait_for=current)
    work.wait(current)
    return [dev.get(shards[k], stream=current[k]) for k in range(RANKS)]


def test_post_hook_on_a_side_stream_races_with_the_reduce_scatter():
    races = assert_racy(post_hook_reduce_scatter, ["side"], "grad0")
    race = next(r for r in races if r.buffer == "grad0")
    assert race.kind == "RAW"
    assert race.first.describe().startswith("stream side (cuda:0): `post_hook` writes")
    assert race.second.describe().startswith("stream comm (cuda:0): `reduce_scatter` reads")


def test_post_hook_joined_into_the_current_stream_is_safe():
    assert_safe(lambda dev: post_hook_reduce_scatter(dev, fixed=True), ["side"])
    got = post_hook_reduce_scatter(Device("sim", devices=RANKS))
    np.testing.assert_array_equal(got, [[3.0, 3.0], [3.0, 3.0]])  # really reduced: 1 + 2 on each shard


# --- 2. an event re-recorded for the next replay before the wait for the previous copy -------------
# A pipelined MoE dispatch: each step the copy stream fills the send buffer and records `ready`,
# the comm stream waits on `ready` and runs the all-to-all. Issuing the wait before this step's
# record makes it wait on the previous replay's record: the all-to-all may send stale rows.

def pipelined_all_to_all(dev, fixed=False, steps=3):
    copy = [dev.stream("copy", device=k) for k in range(RANKS)]
    comm = [dev.stream("comm", device=k) for k in range(RANKS)]
    ready = [dev.event(f"ready{k}") for k in range(RANKS)]
    send = [dev.alloc((2,), device=k, name=f"send{k}", fill=0.0) for k in range(RANKS)]
    recv = [dev.alloc((2,), device=k, name=f"recv{k}", fill=-1.0) for k in range(RANKS)]
    out = [dev.alloc((steps, 2), device=k, name=f"out{k}", fill=-1.0) for k in range(RANKS)]
    for k in range(RANKS):
        ready[k].record(copy[k])  # the previous replay's last record
    for t in range(steps):
        for k in range(RANKS):
            if not fixed:  # the bug: this wait sees the record of step t-1
                comm[k].wait_event(ready[k])
            dev.launch(put(10.0 * t + k, "fill_send"), (send[k],), stream=copy[k], writes=[send[k]])
            ready[k].record(copy[k])
            if fixed:
                comm[k].wait_event(ready[k])
        dev.all_to_all(recv, send, comm)
        for k in range(RANKS):
            dev.launch(copy_into, (out[k][t:t + 1], recv[k]), stream=comm[k], reads=[recv[k]],
                       writes=[out[k][t:t + 1]], name="keep")
            copy[k].wait_event(comm[k].record())  # the next fill waits until this step's send is out
    dev.synchronize()
    return [dev.host_read(out[k]) for k in range(RANKS)]


def test_wait_issued_before_the_record_lets_the_all_to_all_send_stale_rows():
    races = assert_racy(pipelined_all_to_all, ["copy"], "send0")
    race = next(r for r in races if r.buffer == "send0" and r.kind == "RAW")
    assert "waited on event `ready0`" in race.missing_edge and "re-recorded" in race.missing_edge


def test_wait_issued_after_the_record_is_safe():
    assert_safe(lambda dev: pipelined_all_to_all(dev, fixed=True), ["copy"])
    got = pipelined_all_to_all(Device("sim", devices=RANKS), fixed=True)
    # all_to_all: rank k's row t holds chunk k of each rank's send: (10t + 0, 10t + 1) on both ranks.
    np.testing.assert_array_equal(got[0], [[0, 1], [10, 11], [20, 21]])
    np.testing.assert_array_equal(got[1], got[0])


# --- 3. a collective on a library-internal stream -----------------------------------------------
# NCCL runs on ProcessGroupNCCL's own stream. A checker that cannot see it would put the
# all-reduce on the current stream (missing the race when the wait is left out) or see a read of
# its output with no edge (a false race when it is there). Here the collective is on its comm
# stream and torch's work.wait() is an ordinary event wait: reported only when the wait is missing.

def all_reduce_then_read(dev, wait=True):
    current = [dev.legacy_stream(k) for k in range(RANKS)]
    nccl = [dev.stream("nccl", device=k) for k in range(RANKS)]
    buckets = [dev.alloc((3,), device=k, name=f"bucket{k}", fill=float(k + 1)) for k in range(RANKS)]
    results = [dev.alloc((3,), device=k, name=f"result{k}", fill=-1.0) for k in range(RANKS)]
    work = dev.all_reduce(buckets, nccl, wait_for=current)
    if wait:
        work.wait(current)
    for k in range(RANKS):
        dev.launch(copy_into, (results[k], buckets[k]), stream=current[k], reads=[buckets[k]],
                   writes=[results[k]], name="optimizer_step")
    return [dev.get(results[k], stream=current[k]) for k in range(RANKS)]


def test_reading_the_all_reduce_output_without_work_wait_races():
    # Both ranks race at the same lines: one report (seen 2x), for the first rank.
    races = assert_racy(lambda dev: all_reduce_then_read(dev, wait=False), ["nccl"], "bucket0")
    race = next(r for r in races if r.buffer == "bucket0")
    assert race.count == 2 and race.kind == "RAW"
    assert race.first.actor == "stream nccl (cuda:0)" and race.second.actor == "legacy default stream (cuda:0)"


def test_work_wait_orders_the_read_after_the_collective_on_its_comm_stream():
    assert_safe(all_reduce_then_read, ["nccl"])
    np.testing.assert_array_equal(all_reduce_then_read(Device("sim", devices=RANKS)), [[3.0] * 3, [3.0] * 3])


def test_work_synchronize_waits_for_every_rank():
    dev = Device("sim", devices=RANKS, policy="delay", streams=["nccl"], steps=10**6)
    nccl = [dev.stream("nccl", device=k) for k in range(RANKS)]
    buckets = [dev.alloc((2,), device=k, name=f"b{k}", fill=float(k + 1)) for k in range(RANKS)]
    dev.all_reduce(buckets, nccl).synchronize()
    assert [dev.host_read(b).tolist() for b in buckets] == [[3.0, 3.0], [3.0, 3.0]]
    assert dev.races == []


# --- the rules across devices ----------------------------------------------------------------------

def cross_device_wait(dev, wait=True):
    """Stream A of cuda:0 produces x; stream B of cuda:1 copies it to cuda:1 (a peer copy)."""
    a, b = dev.stream("A", device=0), dev.stream("B", device=1)
    x = dev.alloc((2,), name="x", fill=0.0, device=0)
    y = dev.alloc((2,), name="y", fill=-1.0, device=1)
    dev.launch(put(7.0, "produce"), (x,), stream=a, writes=[x])
    if wait:  # CUDA: an event recorded on one device may be waited on by a stream of another
        b.wait_event(a.record())
    dev.copy_peer(y, x, stream=b)
    return [dev.get(y, stream=b)]


def test_a_stream_of_one_device_waits_on_an_event_of_another():
    assert_safe(cross_device_wait, ["A"])
    assert cross_device_wait(Device("sim", devices=2))[0].tolist() == [7.0, 7.0]
    races = assert_racy(lambda dev: cross_device_wait(dev, wait=False), ["A"], "x")
    assert races[0].second.name == "copy P2P" and races[0].second.actor == "stream B (cuda:1)"


def test_a_peer_copy_reads_its_source_and_writes_its_destination_on_its_stream():
    dev = Device("sim", devices=2)
    a, b = dev.stream("A", device=0), dev.stream("B", device=1)
    x = dev.alloc((2,), name="x", fill=1.0, device=0)
    y = dev.alloc((2,), name="y", fill=0.0, device=1)
    dev.copy_peer(y, x, stream=a)  # issued on cuda:0's stream, writing cuda:1's memory
    dev.launch(put(5.0, "reuse"), (y,), stream=b, writes=[y])  # unordered with the copy's write
    assert [(r.kind, r.buffer) for r in dev.races] == [("WAW", "y")]
    copy = [op for op in dev.trace if type(op).__name__ == "Copy"][0]
    assert copy.kind is CopyKind.PEER and copy.reads[0].buffer == x.id and copy.writes[0].buffer == y.id


def legacy_then_blocking(dev, same_device):
    """cuda:0's legacy stream writes x; a blocking stream (of cuda:0, or of cuda:1) then reads it."""
    device = 0 if same_device else 1
    blocking = dev.stream("blocking", kind="blocking", device=device)
    x = dev.alloc((2,), name="x", fill=0.0, device=0)
    y = dev.alloc((2,), name="y", fill=-1.0, device=device)
    dev.launch(put(3.0, "produce"), (x,), stream=dev.legacy, writes=[x])
    dev.copy(y, x, stream=blocking)
    return [dev.get(y, stream=blocking)]


def test_each_device_has_its_own_legacy_stream():
    # Same device: the blocking stream's copy waits for the legacy stream's work (no wait needed).
    assert_safe(lambda dev: legacy_then_blocking(dev, same_device=True), ["legacy"])
    # Another device's blocking stream does not synchronize with cuda:0's legacy stream.
    races = assert_racy(lambda dev: legacy_then_blocking(dev, same_device=False), ["legacy"], "x")
    assert "synchronizes only with blocking streams of its own device" in races[0].missing_edge
    # And cuda:1 has a legacy stream of its own, which cuda:1's blocking streams do join.
    dev = Device("sim", devices=2)
    assert dev.legacy_stream(1) is not dev.legacy and dev.legacy_stream(1).device_index == 1
    blocking = dev.stream("blocking", kind="blocking", device=1)
    z = dev.alloc((2,), name="z", fill=0.0, device=1)
    dev.launch(put(1.0, "produce"), (z,), stream=dev.legacy_stream(1), writes=[z])
    dev.launch(put(2.0, "overwrite"), (z,), stream=blocking, writes=[z])
    assert dev.races == []


def test_a_device_synchronize_waits_for_that_device_only():
    def program(dev, which):
        a, b = dev.stream("A", device=0), dev.stream("B", device=1)
        x = dev.alloc((2,), name="x", fill=0.0, device=0)
        y = dev.alloc((2,), name="y", fill=0.0, device=1)
        dev.launch(put(1.0, "on0"), (x,), stream=a, writes=[x])
        dev.launch(put(2.0, "on1"), (y,), stream=b, writes=[y])
        dev.synchronize(which)
        return dev.host_read(x), dev.host_read(y)

    dev = Device("sim", devices=2, policy="delay", streams=["A", "B"], steps=10**6)
    x, y = program(dev, 0)
    assert x.tolist() == [1.0, 1.0] and y.tolist() == [0.0, 0.0]  # cuda:1's work is still held
    assert [(r.kind, r.buffer, r.second.name) for r in dev.races] == [("RAW", "y", "host read")]
    dev = Device("sim", devices=2, policy="delay", streams=["A", "B"], steps=10**6)
    x, y = program(dev, None)  # every device
    assert x.tolist() == [1.0, 1.0] and y.tolist() == [2.0, 2.0] and dev.races == []
    assert [op.device for op in dev.trace if isinstance(op, DeviceSync)] == [0, 1]


def test_a_kernel_touching_another_devices_memory_needs_peer_access():
    dev = Device("sim", devices=2)
    s1 = dev.stream("S", device=1)
    x = dev.alloc((2,), name="x", fill=4.0, device=0)
    y = dev.alloc((2,), name="y", fill=0.0, device=1)
    with pytest.raises(PeerAccessError) as info:
        dev.launch(copy_into, (y, x), stream=s1, reads=[x], writes=[y], name="gather")
    message = str(info.value)
    assert "cudaErrorIllegalAddress" in message and "`gather`" in message and "`x`" in message
    assert "from cuda:1 to cuda:0" in message and "device.enable_peer_access(1, 0)" in message
    assert [str(e) for e in dev.checker.peer_errors] == [message]  # the checker saw the same launch
    assert dev.host_read(y).tolist() == [0.0, 0.0]  # it never ran
    dev.enable_peer_access(0, 1)  # the other direction does not help
    with pytest.raises(PeerAccessError):
        dev.launch(copy_into, (y, x), stream=s1, reads=[x], writes=[y], name="gather")
    dev.enable_peer_access(1, 0)
    dev.launch(copy_into, (y, x), stream=s1, reads=[x], writes=[y], name="gather")
    assert dev.get(y, stream=s1).tolist() == [4.0, 4.0]
    assert len(dev.checker.peer_errors) == 2 and dev.races == []


def test_one_device_traces_are_unchanged():
    dev = Device("sim")
    a = dev.stream("A")
    x = dev.alloc((2,), name="x")
    dev.launch(put(1.0, "k"), (x,), stream=a, writes=[x])
    dev.synchronize()
    assert [op.device for op in dev.trace if isinstance(op, DeviceSync)] == [0]
    assert dev.legacies == (dev.legacy,)
    # Labels name no device while only one is in use.
    dev.launch(put(2.0, "k2"), (x,), stream=dev.stream("B"), writes=[x])
    dev.launch(put(3.0, "k3"), (x,), stream=a, writes=[x])
    assert all("cuda:" not in r.format() for r in dev.races) and dev.races


# --- bad input -----------------------------------------------------------------------------------

class OneDeviceSim(SimBackend):
    name = "onedevice"
    max_devices = 1


def test_bad_device_indexes_are_refused_with_the_devices_there_are():
    dev = Device("sim", devices=2)
    with pytest.raises(DeviceError, match=r"Device\('sim', devices=2\) has devices 0 and 1; got 2$"):
        dev.stream("A", device=2)
    with pytest.raises(DeviceError, match=r"alloc 'x' at .*: Device\('sim', devices=2\) has devices 0 and 1; got -1"):
        dev.alloc((2,), name="x", device=-1)
    with pytest.raises(DeviceError, match=r"has devices 0, 1 and 2; got 3"):
        Device("sim", devices=3).legacy_stream(3)
    with pytest.raises(DeviceError, match=r"Device\('sim', devices=1\) has device 0 only; got 1"):
        Device("sim").synchronize(1)
    with pytest.raises(DeviceError, match="devices must be an integer >= 1"):
        Device("sim", devices=0)


def test_a_backend_with_fewer_devices_than_asked_is_refused(monkeypatch):
    monkeypatch.setitem(BUILT_IN, "onedevice", f"{__name__}:OneDeviceSim")
    Device("onedevice")  # one device is fine
    with pytest.raises(DeviceError, match=r"the onedevice backend drives 1 device here, fewer than the 2 asked for"):
        Device("onedevice", devices=2)


def test_peer_copies_and_collectives_refuse_what_cuda_and_nccl_would():
    dev = Device("sim", devices=2)
    x0 = dev.alloc((4,), name="x0", device=0)
    x1 = dev.alloc((4,), name="x1", device=1)
    y0 = dev.alloc((4,), name="y0", device=0)
    with pytest.raises(DeviceError, match="are both on cuda:0; a copy within one device is device.copy"):
        dev.copy_peer(y0, x0)
    comm = [dev.stream("c", device=k) for k in range(2)]
    with pytest.raises(DeviceError, match=r"rank 1's input x0\[0:4\] is on cuda:0, its comm stream c on cuda:1"):
        dev.all_reduce([x0, x0], comm)
    with pytest.raises(DeviceError, match="NCCL has one rank per device"):
        dev.all_reduce([x0, y0], [comm[0], comm[0]])
    with pytest.raises(DeviceError, match="2 streams, 1 inputs and 1 outputs"):
        dev.all_reduce([x0], comm)
    with pytest.raises(DeviceError, match=r"needs outputs of shape \(2,\)"):
        dev.reduce_scatter([y0, x1], [x0, x1], comm)
    with pytest.raises(DeviceError, match=r"work.wait at .*: 1 streams for 2 ranks"):
        dev.all_reduce([x0, x1], comm).wait([comm[0]])


# --- the trace ------------------------------------------------------------------------------------
SITE = CallSite("t.py", 1)


def test_old_trace_records_default_to_device_0_and_json_names_the_device():
    assert StreamCreate(0, SITE, stream=1).device == 0 and Alloc(0, SITE, buffer=1).device == 0
    assert DeviceSync(0, SITE).device == 0
    d = json.loads(Trace([StreamCreate(0, SITE, stream=1, device=1)]).to_json())[0]
    assert d["device"] == 1 and d["op"] == "StreamCreate" and op_to_dict(PeerAccess(0, SITE, 0, 1))["peer"] == 1


def two_device_trace(*ops):
    return [StreamCreate(0, SITE, stream=0, kind=StreamKind.LEGACY, device=0),
            StreamCreate(0, SITE, stream=1, kind=StreamKind.LEGACY, device=1),
            StreamCreate(0, SITE, stream=2, name="A", device=0),
            StreamCreate(0, SITE, stream=3, name="B", device=1),
            Alloc(0, SITE, buffer=0, nbytes=8, name="x", device=0),
            Alloc(0, SITE, buffer=1, nbytes=8, name="y", device=1), *ops]


def test_the_checker_keeps_one_legacy_stream_per_device():
    checker = Checker()
    for op in two_device_trace():
        checker.feed(op)
    with pytest.raises(TraceError, match="only one legacy default stream of cuda:1"):
        checker.feed(StreamCreate(0, SITE, stream=9, kind=StreamKind.LEGACY, device=1))
    with pytest.raises(TraceError, match="device -1 is not a device index"):
        checker.feed(StreamCreate(0, SITE, stream=9, device=-1))
    with pytest.raises(TraceError, match="cannot be its own peer"):
        checker.feed(PeerAccess(0, SITE, device=1, peer=1))


def test_the_checker_orders_a_cross_device_event_wait_and_syncs_per_device():
    x, y = Range(0, 0, 8), Range(1, 0, 8)
    site2 = CallSite("t.py", 2)
    common = [EventCreate(0, SITE, event=1), Launch(0, SITE, stream=2, name="w", writes=(x,))]
    # B (cuda:1) reads x through peer access after waiting on A's (cuda:0) event: ordered.
    ordered = two_device_trace(PeerAccess(0, SITE, device=1, peer=0), *common, EventRecord(0, SITE, event=1, stream=2),
                               StreamWait(0, SITE, stream=3, event=1), Launch(0, site2, stream=3, name="r", reads=(x,)))
    assert check(ordered) == []
    unordered = two_device_trace(PeerAccess(0, SITE, device=1, peer=0), *common,
                                 Launch(0, site2, stream=3, name="r", reads=(x,)))
    assert [r.first.actor for r in check(unordered)] == ["stream A (cuda:0)"]
    # A device synchronize of cuda:1 does not order the host after cuda:0's work.
    synced = two_device_trace(Launch(0, SITE, stream=2, name="w", writes=(x,)),
                              Launch(0, SITE, stream=3, name="w1", writes=(y,)), DeviceSync(0, SITE, device=1),
                              HostAccess(0, site2, reads=(x, y)))
    assert [r.buffer for r in check(synced)] == ["x"]
