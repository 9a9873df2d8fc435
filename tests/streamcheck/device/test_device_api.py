"""The device API: what it records, what it refuses (and how it says so), and how a
failing kernel is reported."""
import queue
import sys
import threading
import time

import numpy as np
import pytest

from streamcheck import trace as T
from streamcheck.device import Buffer, Device, DeviceError, Event, KernelError, Region, Stream
from streamcheck.core.hb import check

HERE = "test_device_api.py"


def here(offset=1) -> str:
    """`test_device_api.py:<line>` of the caller's line plus `offset`."""
    return f"{HERE}:{sys._getframe(1).f_lineno + offset}"


def site_of(marker: str) -> str:
    """`test_device_api.py:<line>` of the one line of this file that ends with `# <marker>`."""
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(lines) == 1, marker
    return f"{HERE}:{lines[0]}"


def noop(*arrays):
    pass


@pytest.fixture
def dev():
    return Device("sim", policy="eager")


# --- what is recorded ---------------------------------------------------------------------------


def test_every_call_is_recorded_with_the_users_call_site(dev):
    a = dev.stream("A")
    x = dev.alloc((2, 3), "float32", name="x")
    site = here()
    dev.launch(noop, (x,), stream=a, writes=[x])
    op = dev.trace.ops[-1]
    assert isinstance(op, T.Launch) and str(op.site) == site and op.site.function.startswith("test_every")
    assert op.writes == (T.Range(x.id, 0, 24),) and op.stream == a.id and op.name == "noop"
    e = a.record()
    dev.legacy.wait_event(e)
    a.synchronize()
    kinds = [type(op).__name__ for op in dev.trace.ops]
    assert kinds == ["StreamCreate", "StreamCreate", "Alloc", "Launch", "EventCreate", "EventRecord", "StreamWait",
                     "StreamSync"]
    assert all(op.site.file == __file__ for op in dev.trace.ops[1:])


def test_the_trace_alone_reproduces_the_checkers_reports(dev):
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((4,), "float32", name="x")
    dev.launch(noop, (x,), stream=a, writes=[x])
    dev.launch(noop, (x,), stream=b, reads=[x])
    assert [r.kind for r in dev.races] == ["RAW"]
    assert [r.key for r in check(dev.trace)] == [r.key for r in dev.races]
    assert "RAW race on `x`" in dev.report()


def test_check_false_records_the_trace_but_reports_nothing():
    dev = Device("sim", check=False, policy="delay", streams=["A"])
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((4,), "float32", name="x", fill=0.0)
    dev.launch(lambda x: x.fill(1), (x,), stream=a, writes=[x])
    dev.launch(noop, (x,), stream=b, reads=[x])
    assert dev.checker is None and dev.races == [] and dev.report() == "streamcheck: no races found"
    assert len(dev.trace) == 6
    assert [r.kind for r in check(dev.trace)] == ["RAW"]  # the race is in the trace all the same
    np.testing.assert_array_equal(dev.get(x, stream=b), [0, 0, 0, 0])  # and it still strikes


def test_legacy_stream_and_defaults(dev):
    assert dev.legacy.kind is T.StreamKind.LEGACY and dev.legacy.name == "legacy" and dev.legacy.id == 0
    assert dev.stream("A").kind is T.StreamKind.NON_BLOCKING
    assert dev.stream("B", "blocking").kind is T.StreamKind.BLOCKING
    assert dev.stream("C", "non-blocking").kind is T.StreamKind.NON_BLOCKING
    x = dev.alloc(3, name="x", fill=2.0)
    dev.launch(lambda x: np.multiply(x, 2, out=x), (x,), writes=[x])  # no stream: the legacy stream
    assert dev.trace.ops[-1].stream == 0
    np.testing.assert_array_equal(dev.get(x), [4, 4, 4])  # get() synchronizes the legacy stream


def test_unfilled_memory_is_garbage_and_fill_sets_it(dev):
    assert np.isnan(dev.host_read(dev.alloc(2, "float32"))).all()
    assert dev.host_read(dev.alloc(2, "int32")).tolist() == [0, 0]
    assert dev.host_read(dev.alloc((2,), "float16", fill=1.5)).tolist() == [1.5, 1.5]


# --- regions ------------------------------------------------------------------------------------


def test_regions_are_first_axis_rows_and_byte_ranges(dev):
    x = dev.alloc((6, 2), "float64", name="x", fill=0.0)
    r = x[2:5]
    assert isinstance(r, Region) and (r.start, r.stop, r.rows, r.size) == (2, 5, 3, 6)
    assert r.byte_range() == T.Range(x.id, 32, 80)
    assert r[1:].byte_range() == T.Range(x.id, 48, 80)  # a region of a region
    assert x[-2:].byte_range() == T.Range(x.id, 64, 96)
    assert x[:-1].byte_range() == T.Range(x.id, 0, 80)  # negative bounds count from the end, as in Python
    assert x[4:4].size == 0 and x[6:].size == 0  # empty regions are fine
    assert repr(r) == "x[2:5]"
    s = dev.alloc((), "float32", name="s", fill=1.0)
    assert s.region().byte_range() == T.Range(s.id, 0, 4)


def test_kernels_see_exactly_their_rows_and_disjoint_rows_do_not_race(dev):
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((4, 2), "float32", name="x", fill=0.0)
    dev.launch(lambda r: r.fill(1), (x[0:2],), stream=a, writes=[x[0:2]])
    dev.launch(lambda r: r.fill(2), (x[2:4],), stream=b, writes=[x[2:4]])
    dev.synchronize()
    assert dev.host_read(x)[:, 0].tolist() == [1, 1, 2, 2]
    assert dev.races == []
    dev.launch(noop, (x[1:3],), stream=a, reads=[x[1:3]])  # overlaps B's rows: ordered by the synchronize
    assert dev.races == []


@pytest.mark.parametrize("index", [1, slice(0, 4, 2), (0, 1)])
def test_regions_refuse_non_contiguous_indexing(dev, index):
    x = dev.alloc((4,), "float32", name="x")
    with pytest.raises(DeviceError, match=r"x\[0:4\]\[.*\] at " + here(1) + ": only contiguous"):
        x[index]


@pytest.mark.parametrize("index, message", [
    (slice(4, 100), r"x\[0:8\]\[4:100\] at {site}: 4:100 is not within the 8 rows of x\[0:8\]; slice within 0:8"),
    (slice(None, 9), r"x\[0:8\]\[:9\] at {site}: :9 is not within the 8 rows"),
    (slice(-9, None), r"x\[0:8\]\[-9:\] at {site}: -9: is not within the 8 rows .*down to -8"),
    (slice(5, 2), r"x\[0:8\]\[5:2\] at {site}: stop 2 is before start 5; write \[5:5\] for no rows"),
    (slice(-2, 3), r"x\[0:8\]\[-2:3\] at {site}: stop 3 is before start 6"),
    (slice(1.5, 3), r"x\[0:8\]\[1.5:3\] at {site}: slice bounds must be integers, got 1.5"),
    (slice(True, 3), r"slice bounds must be integers, got True"),
])
def test_regions_refuse_slices_past_their_rows_instead_of_shortening_them(dev, index, message):
    # A Python slice clips x[4:100] to x[4:8]: a region must not, or a kernel gets fewer rows than asked.
    x = dev.alloc((8,), "float32", name="x")
    with pytest.raises(DeviceError, match=message.format(site=here(1))):
        x[index]


def test_a_region_of_a_region_is_bounded_by_its_rows_and_a_scalar_has_none(dev):
    x = dev.alloc((8, 2), "float32", name="x")
    assert x[2:6][1:4].byte_range() == T.Range(x.id, 24, 48) and x[2:6][-1:].start == 5
    with pytest.raises(DeviceError, match=r"x\[2:6\]\[1:5\] at .*: 1:5 is not within the 4 rows of x\[2:6\]"):
        x[2:6][1:5]
    s = dev.alloc((), "float32", name="s")
    with pytest.raises(DeviceError, match=r"s\[0:1\]\[0:0\] at .*: buffer `s` is a scalar \(shape \(\)\), which "
                                          "has no rows; pass the buffer itself"):
        s[0:0]


# --- bad input -----------------------------------------------------------------------------------


def test_device_options_are_validated():
    with pytest.raises(DeviceError, match=f"Device\\(\\) at {here(1)}: check must be True or False"):
        Device("sim", check="yes")
    with pytest.raises(DeviceError, match="seed must be an integer"):
        Device("sim", seed="0")
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        Device("gpu")


@pytest.mark.parametrize("call, message", [
    (lambda dev: dev.stream("A", "fast"), r"stream\('A'\) at .*: unknown stream kind 'fast'"),
    (lambda dev: dev.stream("A", "legacy"), "legacy streams exist already; use device.legacy"),
    (lambda dev: dev.stream("A", "per_thread"), "use device.legacy or device.per_thread_stream"),
    (lambda dev: dev.stream(7), r"stream\(\) at .*: name must be a string"),
    (lambda dev: dev.stream("A", priority="high"), "priority must be an integer"),
    (lambda dev: dev.event(b"e"), r"event\(\) at .*: name must be a string"),
    (lambda dev: dev.alloc((2, -1)), "alloc '' at .*: shape must be non-negative integers"),
    (lambda dev: dev.alloc((2.0,)), "shape must be non-negative integers"),
    (lambda dev: dev.alloc(True), "shape must be"),
    (lambda dev: dev.alloc("four"), "shape must be non-negative integers"),
    (lambda dev: dev.alloc(None), "shape must be an integer or a tuple of integers"),
    (lambda dev: dev.alloc(4, None), "give a dtype"),
    (lambda dev: dev.alloc(4, fill=[1, 2]), r"fill \[1, 2\] does not fit shape \(4,\)"),
    (lambda dev: dev.alloc(4, "int32", fill="x"), "the buffer holds int32, but fill is <U1, which is not numbers"),
])
def test_bad_object_options_raise_device_error_naming_the_call_and_site(dev, call, message):
    with pytest.raises(DeviceError, match=message) as info:
        call(dev)
    assert f"{HERE}:" in str(info.value)


def test_bad_launches_raise_device_error_at_the_launch_site(dev):
    a = dev.stream("A")
    x = dev.alloc(4, name="x")
    y = dev.alloc(4, name="y")
    cases = [
        (lambda: dev.launch("kernel", (x,), writes=[x]), "kernel must be callable"),
        (lambda: dev.launch(noop, x, writes=[x]), "args must be a tuple or list, got Buffer; write args=\\(x,\\)"),
        (lambda: dev.launch(noop, (x,), writes=x), "writes= at .*: expected a list of Buffers/Regions, got Buffer"),
        (lambda: dev.launch(noop, (x,), reads=[np.zeros(4)]), "reads= at .*: expected a Buffer or Region, got ndarray"),
        (lambda: dev.launch(noop, (x, y), reads=[x]), "argument `y` is in neither reads= nor writes="),
        (lambda: dev.launch(noop, (x,), stream="A", writes=[x]), "'A' is not a stream of this device"),
        (lambda: dev.launch(noop, (x,), writes=[x], name=5), "name must be a string"),
    ]
    for call, message in cases:
        with pytest.raises(DeviceError, match=message) as info:
            call()
        assert str(info.value).startswith("launch") and f" at {HERE}:" in str(info.value), message
    assert len(dev.trace) == 4  # nothing refused was recorded
    assert a.device is dev


def test_objects_of_another_device_are_refused(dev):
    other = Device("sim")
    x_other = other.alloc(4, name="theirs")
    s_other = other.stream("theirs")
    e_other = other.event("theirs")
    with pytest.raises(DeviceError, match="buffer `theirs` belongs to another Device"):
        dev.launch(noop, (x_other,), writes=[x_other])
    with pytest.raises(DeviceError, match="is not a stream of this device"):
        dev.copy(dev.alloc(4), dev.alloc(4), stream=s_other)
    with pytest.raises(DeviceError, match=r"wait_event at .*: Event\('theirs'\) is not an event of this device"):
        dev.stream("A").wait_event(e_other)
    with pytest.raises(DeviceError, match=r"record `theirs` at .*: Stream\('B', non_blocking\) is not a stream"):
        e_other.record(dev.stream("B"))


def test_freed_buffers_and_destroyed_events_are_refused(dev):
    a = dev.stream("A")
    x = dev.alloc(4, name="x")
    dev.free(x)
    with pytest.raises(DeviceError, match=f"launch `noop` writes= at {here(1)}: buffer `x` was freed"):
        dev.launch(noop, (x,), stream=a, writes=[x])
    with pytest.raises(DeviceError, match="free at .*: buffer `x` was freed"):
        dev.free(x)
    with pytest.raises(DeviceError, match="free at .*: expected a Buffer, got Region"):
        dev.free(dev.alloc(4)[0:2])
    e = a.record()
    e.destroy()
    for call in (lambda: a.wait_event(e), lambda: e.record(a), e.synchronize, e.destroy):
        with pytest.raises(DeviceError, match="event `event1` was destroyed; create a new one"):
            call()


def test_bad_copies_and_host_accesses_are_refused_at_the_call(dev):
    x = dev.alloc((4,), "float32", name="x", fill=0.0)
    y = dev.alloc((3,), "float32", name="y")
    with pytest.raises(DeviceError, match=r"copy at .*: x\[0:4\] \(16 bytes\) and y\[0:3\] \(12 bytes\) differ"):
        dev.copy(y, x)
    with pytest.raises(DeviceError, match="overlap"):
        dev.copy(x[0:2], x[1:3])
    with pytest.raises(DeviceError, match=r"upload to y\[0:3\] at .*: 4 host elements for 3 device elements"):
        dev.upload(y, np.zeros(4))
    with pytest.raises(DeviceError, match="`y` holds float32, but the host array is <U1, which is not numbers; "
                                          "pass an array of float32"):
        dev.upload(y, ["a", "b", "c"])
    with pytest.raises(DeviceError, match=r"host_write to x\[0:4\] at .*: a value of shape \(3,\) does not fit"):
        dev.host_write(x, np.ones(3))
    with pytest.raises(DeviceError, match="host_read at .*: expected a Buffer or Region, got list"):
        dev.host_read([1, 2])
    with pytest.raises(DeviceError, match="note_implicit_sync at .*: reason must be a string"):
        dev.note_implicit_sync(None)


# --- values are never changed on the way in ----------------------------------------------------


@pytest.mark.parametrize("dtype, host, message", [
    # numpy's cast would store [-24, 24, 0]: integers wrap
    ("int8", np.array([1000, -1000, 0]), r"`x` holds int8, but the host array is int64 and its 1000 \(element 0\) is "
                                         r"not exactly representable in int8; convert it .*\.astype\(np\.int8\)"),
    ("int32", np.array([2.0, 1.5, 3.0]), r"`x` holds int32, but the host array is float64 and its 1\.5 \(element 1\)"),
    ("int32", [1.0, float("nan"), 2.0], r"`x` holds int32, but the host array is float64 and its nan \(element 1\)"),
    ("uint8", np.array([3, -1, 0]), r"`x` holds uint8, but the host array is int64 and its -1 \(element 1\)"),
    # uint8 200 -> int8 -56 -> uint8 200: a wrap that survives the round trip
    ("int8", np.array([1, 200, 0], np.uint8), r"`x` holds int8, but the host array is uint8 and its 200 \(element 1\)"),
    ("int64", np.array([1, 2, 2**63], np.uint64), r"`x` holds int64, but the host array is uint64 and its "
                                                  r"9223372036854775808 \(element 2\)"),
    ("float64", np.array([1, 2**53 + 1, 0]), r"`x` holds float64, but the host array is int64 and its "
                                             r"9007199254740993 \(element 1\)"),
    ("float32", np.array([0.5, 0.1, 0.25]), r"`x` holds float32, but the host array is float64 and its 0\.1 "),
    ("float16", np.array([1.0, 1e6, 2.0], np.float32), r"`x` holds float16, but the host array is float32 and its "
                                                       r"1000000\.0 \(element 1\) is not exactly representable"),
    ("bool", np.array([0, 1, 2]), r"`x` holds bool, but the host array is int64 and its 2 \(element 2\)"),
])
def test_upload_refuses_host_values_the_buffer_cannot_hold_exactly(dev, dtype, host, message):
    x = dev.alloc((3,), dtype, name="x", fill=0)
    before = len(dev.trace)
    with pytest.raises(DeviceError, match=f"upload to x\\[0:3\\] at {here(1)}: {message}"):
        dev.upload(x, host)
    dev.synchronize()
    assert len(dev.trace) == before + 1 and dev.host_read(x).tolist() == [0, 0, 0]  # nothing recorded or copied


def test_upload_converts_values_that_are_exactly_representable(dev):
    # The documented allowance: another dtype is fine when no value changes on the way.
    x = dev.alloc((3,), "int8", name="x")
    f = dev.alloc((4,), "float32", name="f")
    b = dev.alloc((2,), "float64", name="b")
    dev.upload(x, [1, -128, 127])
    dev.upload(f, np.array([1.5, -0.25, np.inf, np.nan]))
    dev.upload(b, np.array([True, False]))
    dev.synchronize()
    assert dev.host_read(x).tolist() == [1, -128, 127] and dev.host_read(x).dtype == np.int8
    np.testing.assert_array_equal(dev.host_read(f), np.array([1.5, -0.25, np.inf, np.nan], np.float32))
    assert dev.host_read(b).tolist() == [1.0, 0.0]


def test_upload_refuses_a_host_array_of_another_shape_but_takes_a_flat_one(dev):
    x = dev.alloc((2, 3), "float32", name="x", fill=0.0)
    with pytest.raises(DeviceError, match=r"upload to x\[0:2\] at .*: the host array has shape \(3, 2\) and x\[0:2\] "
                                          r"has shape \(2, 3\); pass an array of shape \(2, 3\) \(or a flat one of 6"):
        dev.upload(x, np.zeros((3, 2), np.float32))  # a transposed array would be spread over the rows
    with pytest.raises(DeviceError, match=r"x\[1:2\] has shape \(1, 3\)"):
        dev.upload(x[1:2], np.zeros((3, 1), np.float32))
    with pytest.raises(DeviceError, match="the host data is not an array .*; pass a numpy array of float32"):
        dev.upload(x, [[1.0, 2.0], [3.0]])
    dev.upload(x, np.arange(6, dtype=np.float32))  # flat: a byte copy, as cudaMemcpy sees it
    dev.synchronize()
    assert dev.host_read(x).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_upload_of_a_non_contiguous_host_array_copies_its_values_not_its_memory(dev):
    x = dev.alloc((2, 3), "float32", name="x", fill=0.0)
    host = np.arange(6, dtype=np.float32).reshape(3, 2).T  # shape (2, 3), Fortran order
    assert not host.flags.c_contiguous
    dev.upload(x, host)
    dev.upload(x[0:1], np.arange(12, dtype=np.float32)[::4][None])  # strided, shape (1, 3)
    dev.synchronize()
    assert dev.host_read(x).tolist() == [[0, 4, 8], [1, 3, 5]]


def test_upload_into_a_capture_must_be_an_array_of_the_buffers_dtype(dev):
    # The graph reads the host array at every launch: a converted copy would freeze its values.
    s = dev.stream("s")
    x = dev.alloc((2,), "float32", name="x", fill=0.0)
    s.begin_capture()
    with pytest.raises(DeviceError, match=r"upload to x\[0:2\] at .*: s is capturing, and a captured copy reads the "
                                          r"host array at every launch of the graph; pass a numpy array of float32 "
                                          r"\(not float64\)"):
        dev.upload(x, np.array([1.0, 2.0]), stream=s)
    with pytest.raises(DeviceError, match=r"pass a numpy array of float32 \(not list\)"):
        dev.upload(x, [1.0, 2.0], stream=s)
    host = np.array([1.0, 2.0], np.float32)
    dev.upload(x, host, stream=s)
    graph = s.end_capture()
    host[:] = [3.0, 4.0]
    graph.launch(s)
    s.synchronize()
    assert dev.host_read(x).tolist() == [3.0, 4.0]


def test_host_write_and_fill_refuse_values_the_buffer_cannot_hold_exactly(dev):
    x = dev.alloc((2,), "int8", name="x", fill=5)
    with pytest.raises(DeviceError, match=r"host_write to x\[0:2\] at .*: `x` holds int8, but the value is int64 and "
                                          "its 300 is not exactly representable in int8"):
        dev.host_write(x, 300)
    with pytest.raises(DeviceError, match=r"`x` holds int8, but the value is float64 and its 2\.5 \(element 1\)"):
        dev.host_write(x, [1.0, 2.5])
    with pytest.raises(DeviceError, match="`x` holds int8, but the value is <U1, which is not numbers"):
        dev.host_write(x, "a")
    assert dev.host_read(x).tolist() == [5, 5]
    dev.host_write(x, -7.0)  # exactly an int8
    assert dev.host_read(x).tolist() == [-7, -7]
    # numpy raises a bare OverflowError here, and truncates 1.5 to 1 without a word.
    with pytest.raises(DeviceError, match=f"alloc 'y' at {here(2)}: the buffer holds int8, but fill is int64 and its "
                                          "1000 is not exactly representable in int8"):
        dev.alloc(2, "int8", name="y", fill=1000)
    with pytest.raises(DeviceError, match="the buffer holds int32, but fill is float64 and its 1.5 is not exactly"):
        dev.alloc(2, "int32", name="y", fill=1.5)
    assert dev.host_read(dev.alloc(2, "int32", fill=3.0)).tolist() == [3, 3]


@pytest.mark.parametrize("dtype", ["bfloat16", "floaty", "complex64"])
def test_an_unsupported_dtype_lists_the_supported_ones(dev, dtype):
    with pytest.raises(DeviceError, match=f"alloc 'x' at {here(3)}: unsupported dtype '{dtype}' \\(the sim backend "
                                          "holds numpy data and supports bool, float16, float32, float64, int16, "
                                          "int32, int64, int8, uint8\\)"):
        dev.alloc(4, dtype, name="x")


def test_copy_moves_bytes_whatever_the_element_types(dev):
    x = dev.alloc((2,), "float32", name="x", fill=1.0)
    y = dev.alloc((2,), "int32", name="y", fill=0)
    dev.copy(y, x)
    assert dev.get(y).tolist() == np.array([1.0, 1.0], dtype=np.float32).view(np.int32).tolist()


# --- kernel failures -----------------------------------------------------------------------------


def boom(x):
    raise ValueError("bad shape")


def test_a_kernel_that_raises_is_reported_with_its_launch_site(dev):
    a = dev.stream("A")
    x = dev.alloc(4, name="x")
    launch_site = site_of("launch-boom")
    with pytest.raises(KernelError, match=f"kernel `boom` launched at {launch_site} on A raised ValueError: "
                                          "bad shape") as info:
        dev.launch(boom, (x,), stream=a, writes=[x])  # <launch-boom>
    assert isinstance(info.value.__cause__, ValueError)
    assert str(info.value.launch_site) == launch_site and info.value.kernel == "boom" and info.value.stream == "A"
    dev.synchronize()  # the failed kernel counts as finished: nothing waits on it forever


def test_a_kernel_failure_surfacing_in_a_later_synchronize_names_the_launch_site():
    dev = Device("sim", policy="delay", streams=["A"], steps=10**6)
    a = dev.stream("A")
    x = dev.alloc(4, name="x")
    dev.launch(boom, (x,), stream=a, writes=[x])  # <late-boom>
    dev.launch(noop, (x,), stream=a, reads=[x])
    with pytest.raises(KernelError) as info:
        a.synchronize()  # <late-sync>
    message = str(info.value)
    assert f"kernel `boom` launched at {site_of('late-boom')} on A raised ValueError: bad shape" in message
    assert f"it executed during StreamSync at {site_of('late-sync')}" in message
    a.synchronize()  # the rest of the stream still runs
    assert dev.backend.pending() == 0


def test_a_kernel_failure_surfacing_during_an_unrelated_call_names_both_sites():
    dev = Device("sim", policy="delay", streams=["A"], steps=2)
    a = dev.stream("A")
    x = dev.alloc(4, name="x")
    dev.launch(boom, (x,), stream=a, writes=[x])  # <boom-unrelated>
    dev.alloc(1)
    with pytest.raises(KernelError, match=f"launched at {site_of('boom-unrelated')} .* executed during Alloc at "
                                          f"{site_of('unrelated-alloc')}"):
        dev.alloc(1)  # <unrelated-alloc>


# --- threads -------------------------------------------------------------------------------------


def test_device_threads_order_their_work_after_start_and_before_join(dev):
    a = dev.stream("A")
    x = dev.alloc(4, name="x", fill=0.0)

    def worker():
        dev.host_write(x, 1.0)

    t = dev.thread(worker)
    dev.host_write(x, 2.0)  # before start: ordered before the worker's write
    t.start()
    t.join()
    dev.launch(noop, (x,), stream=a, reads=[x])  # after join: ordered after it
    assert dev.races == []


def test_an_unknown_thread_is_unordered_with_the_main_thread(dev):
    x = dev.alloc(4, name="x", fill=0.0)
    dev.host_write(x, 2.0)
    t = threading.Thread(target=lambda: dev.host_write(x, 1.0))
    t.start()
    t.join()
    assert [r.kind for r in dev.races] == ["WAW"]


def test_a_timed_out_join_orders_nothing(dev):
    release = threading.Event()
    x = dev.alloc(4, name="x", fill=0.0)

    def worker():
        dev.host_write(x, 1.0)
        release.wait(5)

    t = dev.thread(worker)
    t.start()
    t.join(timeout=0.01)
    assert not any(isinstance(op, T.ThreadJoin) for op in dev.trace.ops)
    release.set()
    t.join()
    assert any(isinstance(op, T.ThreadJoin) for op in dev.trace.ops)


# Hand-offs between host threads (streamcheck/host_handoffs.py): the worker fills x and hands over;
# the main thread takes over and launches a reader of x. Each primitive's racy twin leaves the
# hand-off out: the main thread polls a plain flag the worker sets after the fill, the same order in
# fact, but nothing the checker can see.


def nothing():
    pass


def hand_off_by(primitive: str):
    """(what the worker does before the fill, after it, and what the main thread does after it saw
    the flag and before it reads x)."""
    if primitive == "Event":
        ev = threading.Event()
        return nothing, ev.set, lambda: ev.wait(5)
    if primitive == "Queue":
        q = queue.Queue()
        return nothing, lambda: q.put("x is filled"), lambda: q.get(timeout=5)
    if primitive == "Queue.join":
        q = queue.Queue()
        q.put("fill x")
        return nothing, lambda: (q.get(), q.task_done()), q.join
    if primitive in ("Lock", "RLock"):
        lock = getattr(threading, primitive)()
        return lock.acquire, lock.release, lambda: lock.acquire(timeout=5) and lock.release()
    if primitive == "Condition":
        cond, state = threading.Condition(), []

        def notify():
            with cond:
                state.append("filled")
                cond.notify_all()

        def wait():
            with cond:
                assert cond.wait_for(lambda: state, timeout=5)
        return nothing, notify, wait
    if primitive == "Barrier":
        barrier = threading.Barrier(2)
        return nothing, lambda: barrier.wait(5), lambda: barrier.wait(5)
    raise AssertionError(primitive)


HAND_OFFS = ["Event", "Queue", "Queue.join", "Lock", "RLock", "Condition", "Barrier"]


@pytest.mark.parametrize("handed_over", [True, False], ids=["handed-over", "polled-flag-racy"])
@pytest.mark.parametrize("primitive", HAND_OFFS)
def test_a_hand_off_between_device_threads_orders_them(dev, primitive, handed_over):
    a = dev.stream("A")
    x = dev.alloc(4, name="x", fill=0.0)
    enter, give, take = hand_off_by(primitive) if handed_over else (nothing, nothing, nothing)
    filled = []

    def worker():
        enter()
        dev.host_write(x, 1.0)
        filled.append(True)  # the racy twin's only order: a plain flag
        give()

    t = dev.thread(worker)
    t.start()
    while not filled:
        time.sleep(0.001)
    take()
    dev.launch(noop, (x,), stream=a, reads=[x], name="reader")
    if handed_over:
        assert dev.races == [], dev.report()
    else:
        [race] = dev.races
        assert race.kind == "RAW" and race.first.actor == "host thread 1" and race.second.name == "reader"
        assert "threading.Event (set, then wait), queue.Queue (put, then get)" in race.hint
    t.join()
    assert dev.get(x).tolist() == [1.0] * 4


def test_an_event_wait_that_timed_out_orders_nothing(dev):
    """The Event was set after the fill, then cleared: a wait that times out returns False and takes
    nothing over, although a set is on record."""
    a = dev.stream("A")
    x = dev.alloc(4, name="x", fill=0.0)
    ev, filled = threading.Event(), []

    def worker():
        dev.host_write(x, 1.0)
        ev.set()
        ev.clear()
        filled.append(True)

    t = dev.thread(worker)
    t.start()
    while not filled:
        time.sleep(0.001)
    assert ev.wait(0.01) is False
    dev.launch(noop, (x,), stream=a, reads=[x], name="reader")
    assert [r.kind for r in dev.races] == ["RAW"]
    t.join()


def test_hand_offs_between_threads_that_never_used_the_device_are_not_recorded(dev):
    ev = threading.Event()
    stranger = threading.Thread(target=ev.set)
    stranger.start()
    stranger.join()
    assert ev.wait(5)
    assert not any(isinstance(op, (T.HandOff, T.TakeOver)) for op in dev.trace.ops)


def test_a_thread_the_device_did_not_start_is_ordered_by_the_hand_off_it_took_over(dev):
    """A plain threading.Thread is ordered with nothing until it takes over from one of the device's
    threads: then it is known, and what it does is ordered after the hand-off."""
    x = dev.alloc(4, name="x", fill=0.0)
    q = queue.Queue()
    dev.host_write(x, 2.0)
    q.put("x is filled")

    def plain():
        q.get(timeout=5)
        dev.host_write(x, 1.0)

    t = threading.Thread(target=plain)
    t.start()
    t.join()
    assert dev.races == [], dev.report()
    assert dev.get(x).tolist() == [1.0] * 4


def queue_program(dev):
    """The main thread hands x to a worker through a queue; the worker doubles it."""
    x = dev.alloc(4, name="x", fill=0.0)
    q = queue.Queue()
    t = dev.thread(lambda: (q.get(timeout=5), dev.host_write(x, 2.0)))
    t.start()
    dev.host_write(x, 1.0)
    q.put("x is yours")
    t.join()
    return dev.get(x).tolist()


def test_a_device_whose_program_ended_does_not_hear_the_next_programs_hand_offs():
    first = Device("sim")
    assert queue_program(first) == [2.0] * 4 and first.races == []
    recorded = len(first.trace.ops)
    second = Device("sim")  # the next program in the same thread, the first device still alive
    assert queue_program(second) == [2.0] * 4 and second.races == [], second.report()
    assert len(first.trace.ops) == recorded
    assert [op.what for op in second.trace.ops if isinstance(op, (T.HandOff, T.TakeOver))] == ["Queue.put",
                                                                                                 "Queue.get"]


def test_public_types_are_exported():
    dev = Device("sim")
    assert isinstance(dev.stream("A"), Stream) and isinstance(dev.event(), Event)
    assert isinstance(dev.alloc(1), Buffer)


def test_a_built_in_backend_is_found_without_scanning_installed_packages(monkeypatch):
    """Device("sim") answers from the built-in table: the entry-point scan (every installed
    distribution's metadata, about 10 ms) is only for names that are not built in."""
    from importlib import metadata

    from streamcheck.device.backends import backend_class, resolve

    scans = []
    monkeypatch.setattr(metadata, "entry_points", lambda *args, **kwargs: scans.append(kwargs) or ())
    dev = Device("sim")
    x = dev.alloc(4, fill=1.0, name="x")
    dev.launch(lambda v: None, (x,), writes=[x], name="k")
    assert resolve("sim") == "sim" and backend_class("sim").__name__ == "SimBackend" and dev.races == []
    assert scans == []
    with pytest.raises(ValueError, match="unknown backend 'nosuch'"):
        resolve("nosuch")  # a name not built in: the installed packages are asked
    assert scans == [{"group": "streamcheck.backends"}] * len(scans) and scans
