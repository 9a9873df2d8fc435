"""The sim backend executes CUDA's stream rules: values read, not just reports.

Each test runs a tiny stream program on the virtual device and looks at the data
the consumer actually read. A missing edge must make the consumer read stale data
under an injected delay and correct data under `sequential`; a present edge must
give correct data under every policy and seed.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcheck.device import Device, KernelError, UndeclaredWriteError

STEPS = 3
EXPECTED = np.repeat(np.arange(1, STEPS + 1, dtype=np.float32)[:, None], 2, axis=1)  # row t holds t+1


def set_to(value):
    def produce(x):
        x[...] = value
    produce.__name__ = "produce"
    return produce


def copy_into(dst, src):
    dst[...] = src


def decode_steps(dev, *, join=True, war=True, kind="non_blocking"):
    """The FlashNorm pattern in miniature: each step the producer (stream A) writes the
    persistent buffer x, the consumer (stream B) copies it into row t of `out`.
    `join`: B waits for A's record after the producer. `war`: the next producer waits
    until the consumer has read x. Returns the rows read after a device synchronize."""
    a, b = dev.stream("A", kind), dev.stream("B", kind)
    x = dev.alloc((2,), "float32", name="x", fill=0.0)  # holds the previous step's value
    out = dev.alloc((STEPS, 2), "float32", name="out", fill=-1.0)
    for t in range(STEPS):
        dev.launch(set_to(t + 1), (x,), stream=a, writes=[x])
        if join:
            b.wait_event(a.record())
        dev.launch(copy_into, (out[t:t + 1], x), stream=b, reads=[x], writes=[out[t:t + 1]], name="consume")
        if war:
            a.wait_event(b.record())
    dev.synchronize()
    return dev.host_read(out)


# --- a missing join -----------------------------------------------------------------------------


def test_missing_join_reads_the_previous_step_under_delay():
    dev = Device("sim", policy="delay", streams=["A"], steps=2)
    got = decode_steps(dev, join=False)
    # The symptom users saw: every step reads the value of the step before.
    np.testing.assert_array_equal(got[:, 0], [0.0, 1.0, 2.0])
    assert any(r.kind == "RAW" and r.buffer == "x" for r in dev.races)


def test_missing_join_reads_correct_data_under_sequential_and_eager():
    for policy in ("sequential", "eager"):
        dev = Device("sim", policy=policy)
        np.testing.assert_array_equal(decode_steps(dev, join=False), EXPECTED)
        # The bug hides in the values but not from the checker.
        assert any(r.kind == "RAW" for r in dev.races), policy


def test_missing_join_strikes_under_some_random_and_pct_seeds_but_not_all():
    for policy in ("random", "pct"):
        stale = [not np.array_equal(decode_steps(Device("sim", check=False, policy=policy, seed=s), join=False),
                                    EXPECTED) for s in range(40)]
        assert any(stale) and not all(stale), (policy, stale)


@pytest.mark.parametrize("policy, params", [
    ("sequential", {}), ("eager", {}), ("delay", {}), ("delay", {"streams": ["A"], "steps": 3}),
    ("delay", {"streams": ["B"], "steps": 5}), ("random", {}), ("pct", {}), ("pct", {"depth": 3}),
])
def test_event_join_reads_correct_data_for_1000_seeds(policy, params):
    seeds = range(1000) if policy in ("delay", "random", "pct") else range(3)
    for seed in seeds:
        got = decode_steps(Device("sim", check=False, policy=policy, seed=seed, **params))
        if not np.array_equal(got, EXPECTED):
            pytest.fail(f"{policy} {params} seed={seed} read {got.tolist()}")


def test_event_join_program_is_race_free():
    dev = Device("sim", policy="random", seed=1)
    decode_steps(dev)
    assert dev.races == []


def test_missing_war_edge_lets_the_next_producer_overwrite_before_the_read():
    # Without the WAR edge the producer of step t+1 may run before the consumer of step t.
    hit = False
    for seed in range(40):
        dev = Device("sim", policy="delay", streams=["B"], steps=3, seed=seed)
        got = decode_steps(dev, war=False)
        hit |= bool(got[0, 0] > 1.0)
        assert any(r.kind == "WAR" and r.buffer == "x" for r in dev.races)
    assert hit


# --- the legacy default stream --------------------------------------------------------------------


def legacy_consumer(dev, kind):
    """Producer on A (of `kind`), consumer on the legacy stream with no event."""
    a = dev.stream("A", kind)
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=-1.0)
    dev.launch(set_to(7.0), (x,), stream=a, writes=[x])
    dev.launch(copy_into, (y, x), stream=dev.legacy, reads=[x], writes=[y], name="consume")
    return dev.get(y)  # synchronizes the legacy stream only


def test_legacy_stream_joins_blocking_streams_implicitly():
    for seed in range(50):
        dev = Device("sim", policy="delay", streams=["A"], steps=50, seed=seed)
        np.testing.assert_array_equal(legacy_consumer(dev, "blocking"), [7.0, 7.0])
        assert dev.races == []


def test_legacy_stream_does_not_join_non_blocking_streams():
    dev = Device("sim", policy="delay", streams=["A"], steps=50)
    np.testing.assert_array_equal(legacy_consumer(dev, "non_blocking"), [0.0, 0.0])
    assert [r.kind for r in dev.races] == ["RAW"]
    np.testing.assert_array_equal(legacy_consumer(Device("sim", policy="sequential"), "non_blocking"), [7.0, 7.0])


def blocking_after_legacy(dev, kind):
    """Producer on the legacy stream, consumer on a stream of `kind` with no event."""
    b = dev.stream("B", kind)
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=-1.0)
    dev.launch(set_to(5.0), (x,), stream=dev.legacy, writes=[x])
    dev.launch(copy_into, (y, x), stream=b, reads=[x], writes=[y], name="consume")
    return dev.get(y, stream=b)


def test_later_blocking_work_waits_for_the_legacy_stream():
    dev = Device("sim", policy="delay", streams=["legacy"], steps=50)
    np.testing.assert_array_equal(blocking_after_legacy(dev, "blocking"), [5.0, 5.0])
    assert dev.races == []
    dev = Device("sim", policy="delay", streams=["legacy"], steps=50)
    np.testing.assert_array_equal(blocking_after_legacy(dev, "non_blocking"), [0.0, 0.0])
    assert dev.races


def test_per_thread_default_stream_joins_the_legacy_stream_like_a_blocking_stream():
    dev = Device("sim", policy="delay", streams=["legacy"], steps=50)
    pts = dev.per_thread_stream()
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=-1.0)
    dev.launch(set_to(3.0), (x,), stream=dev.legacy, writes=[x])
    dev.launch(copy_into, (y, x), stream=pts, reads=[x], writes=[y], name="consume")
    np.testing.assert_array_equal(dev.get(y, stream=pts), [3.0, 3.0])
    assert dev.races == []


def test_legacy_join_is_transitive_through_the_legacy_stream():
    # A (blocking) -> legacy no-op -> B (blocking): B's consumer sees A's write.
    dev = Device("sim", policy="delay", streams=["A"], steps=50)
    a, b = dev.stream("A", "blocking"), dev.stream("B", "blocking")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=-1.0)
    dev.launch(set_to(4.0), (x,), stream=a, writes=[x])
    dev.launch(lambda: None, (), stream=dev.legacy, name="legacy no-op")
    dev.launch(copy_into, (y, x), stream=b, reads=[x], writes=[y], name="consume")
    np.testing.assert_array_equal(dev.get(y, stream=b), [4.0, 4.0])
    assert dev.races == []


# --- events ----------------------------------------------------------------------------------------


def test_wait_before_record_orders_nothing():
    dev = Device("sim", policy="delay", streams=["A"], steps=50)
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=-1.0)
    e = dev.event("e")
    b.wait_event(e)  # never recorded yet: a no-op
    dev.launch(set_to(9.0), (x,), stream=a, writes=[x])
    e.record(a)
    dev.launch(copy_into, (y, x), stream=b, reads=[x], writes=[y], name="consume")
    np.testing.assert_array_equal(dev.get(y, stream=b), [0.0, 0.0])
    assert [(r.kind, r.buffer) for r in dev.races] == [("RAW", "x")]


def three_writes(dev, record_again_before_wait):
    """A writes 1, records e, writes 2, (records e again), B waits on e and reads."""
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=-1.0)
    e = dev.event("e")
    dev.launch(set_to(1.0), (x,), stream=a, writes=[x])
    e.record(a)
    dev.launch(set_to(2.0), (x,), stream=a, writes=[x])
    if record_again_before_wait:
        e.record(a)  # replaces the captured state
    b.wait_event(e)
    if not record_again_before_wait:
        e.record(a)  # after the wait: does not change what B waits for
    dev.launch(copy_into, (y, x), stream=b, reads=[x], writes=[y], name="consume")
    return dev.get(y, stream=b)


def test_wait_sees_the_state_captured_at_wait_time():
    # The wait covers the first write only: synchronizing B runs exactly that much of A,
    # and the second write (and the record after the wait) stay pending.
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    got = three_writes(dev, record_again_before_wait=False)
    np.testing.assert_array_equal(got, [1.0, 1.0])
    assert dev.backend.pending() == 2
    assert [r.kind for r in dev.races] == ["RAW"]  # B reads x while A's second write is unordered
    got = three_writes(Device("sim", policy="sequential"), record_again_before_wait=False)
    np.testing.assert_array_equal(got, [2.0, 2.0])


def test_recording_again_before_the_wait_replaces_the_captured_state():
    for policy in ("delay", "random", "pct"):
        for seed in range(100):
            dev = Device("sim", check=False, policy=policy, seed=seed,
                         **({"streams": ["A"], "steps": 4} if policy == "delay" else {}))
            np.testing.assert_array_equal(three_writes(dev, record_again_before_wait=True), [2.0, 2.0])


def test_event_synchronize_waits_for_the_recorded_work_only():
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    a = dev.stream("A")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    dev.launch(set_to(1.0), (x,), stream=a, writes=[x])
    e = a.record()
    dev.launch(set_to(2.0), (x,), stream=a, writes=[x])
    e.synchronize()
    np.testing.assert_array_equal(dev.host_read(x), [1.0, 1.0])  # the later write is still pending
    assert dev.backend.pending() == 1


def test_synchronizing_a_never_recorded_event_returns_at_once():
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    a = dev.stream("A")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    dev.launch(set_to(1.0), (x,), stream=a, writes=[x])
    dev.event("never").synchronize()
    np.testing.assert_array_equal(dev.host_read(x), [0.0, 0.0])


def test_a_busy_loop_on_an_event_query_orders_the_host_after_the_events_work_only():
    dev = Device("sim", policy="delay", streams=["A"], steps=5)
    a = dev.stream("A")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=0.0)
    dev.launch(set_to(1.0), (x,), stream=a, writes=[x])
    e = a.record()
    dev.launch(set_to(2.0), (y,), stream=a, writes=[y])  # after the record: the query says nothing of it
    polls = 1
    while not e.query():
        polls += 1
    assert polls > 1  # the delay held the work: the loop waited for it
    np.testing.assert_array_equal(dev.host_read(x), [1.0, 1.0])
    assert dev.races == []
    dev.host_read(y)
    (race,) = dev.races
    assert (race.kind, race.buffer, race.second.actor) == ("RAW", "y", "host thread 0")


# --- host synchronization ------------------------------------------------------------------------


@pytest.mark.parametrize("sync", ["device", "stream", "event", "get"])
def test_host_synchronize_drives_delayed_work_to_completion(sync):
    # A delay far longer than the program: the synchronize must still complete, not hang.
    dev = Device("sim", policy="delay", streams=["A", "B"], steps=10**9)
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=0.0)
    dev.launch(set_to(6.0), (x,), stream=a, writes=[x])
    b.wait_event(a.record())
    dev.launch(copy_into, (y, x), stream=b, reads=[x], writes=[y], name="consume")
    done = b.record()
    if sync == "device":
        dev.synchronize()
    elif sync == "stream":
        b.synchronize()
    elif sync == "event":
        done.synchronize()
    else:
        np.testing.assert_array_equal(dev.get(y, stream=b), [6.0, 6.0])
    np.testing.assert_array_equal(dev.host_read(y), [6.0, 6.0])
    assert dev.races == []


def test_stream_synchronize_only_synchronizes_its_stream():
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=0.0)
    dev.launch(set_to(1.0), (x,), stream=a, writes=[x])
    dev.launch(set_to(2.0), (y,), stream=b, writes=[y])
    np.testing.assert_array_equal(dev.get(x, stream=b), [0.0, 0.0])  # stale: A not synchronized
    assert any(r.kind == "RAW" and "host" in r.second.actor for r in dev.races)
    np.testing.assert_array_equal(dev.get(y, stream=b), [2.0, 2.0])
    np.testing.assert_array_equal(dev.get(x, stream=a), [1.0, 1.0])


def test_host_read_without_sync_sees_pending_writes_missing():
    dev = Device("sim", policy="delay", streams=["A"], steps=3)
    a = dev.stream("A")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    dev.launch(set_to(1.0), (x,), stream=a, writes=[x])
    # Each read happens before its own call's scheduling step: the launch executes in the
    # step of the 3rd host call after it, so the first three reads miss it.
    assert [dev.host_read(x)[0] for _ in range(4)] == [0.0, 0.0, 0.0, 1.0]


def test_delay_holds_back_for_exactly_steps_host_calls():
    for steps in range(6):
        dev = Device("sim", policy="delay", streams=["A"], steps=steps)
        a = dev.stream("A")
        x = dev.alloc((1,), "float32", name="x", fill=0.0)
        dev.launch(set_to(1.0), (x,), stream=a, writes=[x])
        reads = [dev.host_read(x)[0] for _ in range(6)]
        # A host read happens before the scheduling step of its own call.
        assert reads == [0.0] * steps + [1.0] * (6 - steps), steps


def test_delay_by_kernel_name_holds_only_that_launch_and_its_stream_successors():
    dev = Device("sim", policy="delay", kernels=["slow"], steps=10**6)
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((1,), "float32", name="x", fill=0.0)
    y = dev.alloc((1,), "float32", name="y", fill=0.0)
    z = dev.alloc((1,), "float32", name="z", fill=0.0)
    dev.launch(set_to(1.0), (x,), stream=a, writes=[x], name="slow")
    dev.launch(set_to(2.0), (y,), stream=a, writes=[y], name="fast")  # behind `slow` on A
    dev.launch(set_to(3.0), (z,), stream=b, writes=[z], name="fast")
    assert [dev.host_read(v)[0] for v in (x, y, z)] == [0.0, 0.0, 3.0]
    dev.synchronize()
    assert [dev.host_read(v)[0] for v in (x, y, z)] == [1.0, 2.0, 3.0]


def held_streams(seed):
    """Which of four streams the seeded delay (no target) holds back."""
    dev = Device("sim", check=False, policy="delay", seed=seed, steps=10**6)
    streams = [dev.stream(f"s{i}") for i in range(4)]
    bufs = [dev.alloc((1,), "float32", fill=0.0) for _ in streams]
    for s, buf in zip(streams, bufs):
        dev.launch(set_to(1.0), (buf,), stream=s, writes=[buf])
    return frozenset(i for i, buf in enumerate(bufs) if dev.host_read(buf)[0] == 0.0)


def test_delay_without_target_lets_the_seed_pick_the_streams():
    picks = [held_streams(seed) for seed in range(16)]
    assert picks == [held_streams(seed) for seed in range(16)]  # the seed decides...
    assert len(set(picks)) >= 4  # ...and different seeds decide differently


# --- copies ----------------------------------------------------------------------------------------


def test_async_copies_are_ordered_on_their_stream_and_read_at_execution():
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    a = dev.stream("A")
    x = dev.alloc((2, 2), "float32", name="x", fill=0.0)
    y = dev.alloc((4,), "float32", name="y", fill=0.0)
    host = np.array([[1, 2], [3, 4]], dtype=np.float32)
    dev.upload(x, host, stream=a)
    dev.copy(y, x, stream=a)
    out = dev.download(y, stream=a)
    assert np.isnan(out).all()  # nothing executed yet: the host array is garbage
    a.synchronize()
    np.testing.assert_array_equal(out, [1, 2, 3, 4])
    assert dev.races == []


def test_upload_reads_host_memory_when_it_executes():
    # cudaMemcpyAsync from pageable/pinned host memory reads it late: changing it too early is a bug.
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    a = dev.stream("A")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    host = np.array([1.0, 1.0], dtype=np.float32)
    dev.upload(x, host, stream=a)
    host[:] = 9.0
    a.synchronize()
    np.testing.assert_array_equal(dev.host_read(x), [9.0, 9.0])


def test_copy_between_streams_without_a_wait_copies_stale_bytes():
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    y = dev.alloc((2,), "float32", name="y", fill=-1.0)
    dev.launch(set_to(8.0), (x,), stream=a, writes=[x])
    dev.copy(y, x, stream=b)
    np.testing.assert_array_equal(dev.get(y, stream=b), [0.0, 0.0])
    assert any(r.kind == "RAW" and r.second.name == "copy D2D" for r in dev.races)


# --- reads= is enforced: what a launch only reads, its kernel gets read-only ----------------------


def scale_both(out, src):
    out[...] = src * 2
    # An undeclared write:
    src *= 2  # <writes-src>


def line_of(marker: str) -> str:
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(lines) == 1, marker
    return f"test_sim_rules.py:{lines[0]}"


def test_a_kernel_that_writes_what_it_declared_only_in_reads_raises_naming_the_argument():
    # Unchecked, this write would race with every other reader of x, and no report would say so.
    dev = Device("sim")
    a = dev.stream("A")
    x = dev.alloc((4,), "float32", name="x", fill=1.0)
    y = dev.alloc((4,), "float32", name="y", fill=0.0)
    with pytest.raises(UndeclaredWriteError) as info:
        dev.launch(scale_both, (y, x[0:4]), stream=a, reads=[x], writes=[y])  # <launch-scale>
    message = str(info.value)
    assert message.startswith(f"kernel `scale_both` launched at {line_of('launch-scale')} on A wrote its argument "
                              "`src` (x[0:4]), which the launch declares only in reads= (numpy: output array is "
                              f"read-only, at {line_of('writes-src')}); add what it writes to writes= at the launch "
                              "site, or stop writing it")
    assert isinstance(info.value, KernelError) and info.value.arguments == ("src",)
    assert info.value.kernel == "scale_both" and info.value.stream == "A"
    dev.synchronize()
    assert dev.host_read(x).tolist() == [1, 1, 1, 1]  # the write did not happen
    dev.launch(scale_both, (y, x), stream=a, reads=[x], writes=[x, y])  # declared: the same kernel runs
    dev.synchronize()
    assert dev.host_read(x).tolist() == [2, 2, 2, 2] and dev.host_read(y).tolist() == [2, 2, 2, 2]


def test_with_several_read_only_arguments_the_error_names_each_one():
    dev = Device("sim")
    w = dev.alloc((2,), "float32", name="w", fill=1.0)
    x = dev.alloc((2,), "float32", name="x", fill=1.0)

    def accumulate(weights, inputs):
        np.add(inputs, weights, out=inputs)

    with pytest.raises(UndeclaredWriteError, match=r"kernel `accumulate` launched at .* on legacy wrote one of its "
                                                   r"arguments `weights` \(w\[0:2\]\), `inputs` \(x\[0:2\]\), which"):
        dev.launch(accumulate, (w, x), reads=[w, x])
    assert dev.host_read(x).tolist() == [1, 1]


def test_only_arguments_that_no_declared_write_overlaps_are_read_only():
    dev = Device("sim")
    x = dev.alloc((4,), "float32", name="x", fill=0.0)
    # The whole buffer is passed and rows 2:4 are declared written: it stays writable (rows are not policed).
    dev.launch(lambda v: v[2:].fill(3), (x,), reads=[x], writes=[x[2:4]])
    dev.synchronize()
    assert dev.host_read(x).tolist() == [0, 0, 3, 3]
    # Rows 0:2 are passed and only rows 2:4 are declared written: rows 0:2 are read-only.
    with pytest.raises(UndeclaredWriteError, match=r"wrote its argument `v` \(x\[0:2\]\)") as info:
        dev.launch(lambda v, w: v.fill(5), (x[0:2], x[2:4]), reads=[x[0:2]], writes=[x[2:4]])
    assert info.value.arguments == ("v",)
    assert dev.host_read(x).tolist() == [0, 0, 3, 3]
    assert x.storage.flags.writeable  # the read-only view never leaks onto the buffer itself
    dev.host_write(x, 1.0)
    assert dev.host_read(x).tolist() == [1, 1, 1, 1]


def test_a_kernel_that_fails_otherwise_keeps_its_own_error():
    dev = Device("sim")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)

    def bad(v):
        raise ValueError("bad shape")

    with pytest.raises(KernelError, match="raised ValueError: bad shape") as info:
        dev.launch(bad, (x,), reads=[x])
    assert not isinstance(info.value, UndeclaredWriteError)


def test_a_captured_kernel_gets_its_read_only_arguments_at_every_graph_launch():
    dev = Device("sim")
    s = dev.stream("s")
    x = dev.alloc((2,), "float32", name="x", fill=1.0)
    y = dev.alloc((2,), "float32", name="y", fill=0.0)
    s.begin_capture()
    dev.launch(scale_both, (y, x), stream=s, reads=[x], writes=[y])
    graph = s.end_capture()
    with pytest.raises(UndeclaredWriteError, match=r"kernel `scale_both` .* wrote its argument `src` \(x\[0:2\]\)"):
        graph.launch(s)
        s.synchronize()
    assert dev.host_read(x).tolist() == [1, 1]


# --- the sim's clock for timelines ---------------------------------------------------------------


def test_op_times_cover_every_executed_stream_operation_in_stream_order():
    dev = Device("sim", policy="random", seed=3)
    decode_steps(dev)
    stream_ops = {i: op for i, op in enumerate(dev.trace.ops) if hasattr(op, "stream") and
                  type(op).__name__ in ("Launch", "Copy", "EventRecord", "StreamWait")}
    assert set(dev.backend.op_times) == set(stream_ops)
    starts = sorted(start for start, _ in dev.backend.op_times.values())
    assert starts == list(range(len(stream_ops)))  # one op per step, no gaps
    by_stream: dict = {}
    for i in sorted(stream_ops):
        by_stream.setdefault(stream_ops[i].stream, []).append(dev.backend.op_times[i][0])
    for times in by_stream.values():
        assert times == sorted(times)  # issue order within a stream


# --- the checker and the simulator agree ----------------------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("launch"), st.integers(0, 3), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("record"), st.integers(0, 3), st.integers(0, 1)),
    st.tuples(st.just("wait"), st.integers(0, 3), st.integers(0, 1)),
    st.tuples(st.just("sync_stream"), st.integers(0, 3)),
    st.tuples(st.just("sync_event"), st.integers(0, 1)),
)


def random_program(dev, kinds, ops):
    """Streams 1..3 of `kinds` plus the legacy stream (index 0), two events, three
    one-element buffers; kernels are order-sensitive read-modify-writes."""
    streams = [dev.legacy] + [dev.stream(f"s{i}", kind) for i, kind in enumerate(kinds, 1)]
    events = [dev.event("e0"), dev.event("e1")]
    bufs = [dev.alloc((1,), "float64", name=f"b{i}", fill=float(i)) for i in range(3)]
    for k, op in enumerate(ops):
        if op[0] == "launch":
            _, s, src, dst = op
            x, y = bufs[src], bufs[dst]

            def rmw(y, x, k=k):
                y[...] = y * 3 + x + k

            dev.launch(rmw, (y, x), stream=streams[s], reads=[x, y], writes=[y])
        elif op[0] == "record":
            events[op[2]].record(streams[op[1]])
        elif op[0] == "wait":
            streams[op[1]].wait_event(events[op[2]])
        elif op[0] == "sync_stream":
            streams[op[1]].synchronize()
        else:
            events[op[1]].synchronize()
    dev.synchronize()
    assert dev.backend.pending() == 0
    return np.concatenate([dev.host_read(b) for b in bufs])


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(st.sampled_from(["non_blocking", "blocking"]), min_size=3, max_size=3),
       ops=st.lists(OPS, min_size=1, max_size=14))
def test_a_program_the_checker_calls_race_free_reads_the_same_values_under_every_schedule(kinds, ops):
    reference = Device("sim", policy="sequential")
    expected = random_program(reference, kinds, ops)
    race_free = reference.races == []
    for policy, params in [("delay", {"steps": 3}), ("delay", {"steps": 10**6}), ("random", {}), ("pct", {})]:
        for seed in range(3):
            dev = Device("sim", check=False, policy=policy, seed=seed, **params)
            got = random_program(dev, kinds, ops)
            if race_free:
                assert got.tobytes() == expected.tobytes(), (policy, params, seed, dev.schedule)
