"""The recorder (streamcheck/record/recorder.py) and the patching rules (streamcheck/record/adapters/patching.py)
on the CPU, with a fake GPU library: ids, byte ranges, frees, graph-held memory, per-thread
default streams, the delay rule, and what a patch may and may not replace."""
from __future__ import annotations

import gc
import importlib.util
import sys
import threading
import types

import pytest

from streamcheck.record import recorder as R
from streamcheck.core import trace as T
from streamcheck.record.adapters import cupy_graphs
from streamcheck.record.adapters.patching import Patch, Patcher, transparent_subclass
from streamcheck.core.schedule import seed_delays
from streamcheck.core.trace import CaptureMode, StreamKind


class FakeArray:
    """A contiguous device array: what __cuda_array_interface__ would say."""

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.nbytes = ptr, nbytes


class FakeStream:
    def __init__(self, ptr: int):
        self.ptr = ptr


class FakeGraph:
    def __init__(self):
        self.launched = []

    def launch(self, stream=None):
        self.launched.append(stream)


class FakeGpu:
    """recorder.Gpu without a GPU: streams are pointers, arrays are (ptr, nbytes)."""

    library_dirs = ()

    def __init__(self):
        self.legacy = FakeStream(0)
        self.current = self.legacy
        self.capturing: set = set()
        self.spins: list = []

    def current_stream(self):
        return self.current

    def stream_ptr(self, stream):
        return stream.ptr

    def stream_kind(self, ptr):
        return StreamKind.NON_BLOCKING

    def is_capturing(self, stream):
        return stream.ptr in self.capturing

    def spin(self, stream, us):
        self.spins.append((stream.ptr, us))

    def is_array(self, obj):
        return isinstance(obj, FakeArray)

    def array_span(self, obj):
        return (obj.ptr, obj.ptr + obj.nbytes) if obj.nbytes else None

    def driver_range(self, ptr):
        return None

    def capture_mode(self, value):
        return CaptureMode.RELAXED if value is None else CaptureMode.parse(value)


@pytest.fixture
def rec(monkeypatch):
    recording = R.Recorder(FakeGpu())
    monkeypatch.setattr(R, "current", recording)
    return recording


def ops(rec, kind):
    return [op for op in rec.trace.ops if type(op) is kind]


def launch(rec, name, stream, reads=(), writes=()):
    return rec.launch(name, lambda: None, stream=stream, reads=reads, writes=writes)


def test_a_view_is_a_byte_range_of_its_allocation_and_a_free_is_ordered_on_the_allocating_stream(rec):
    s1 = FakeStream(0x10)
    rec.gpu.current = s1
    alloc = rec.alloc(0x1000, 256)
    whole, tail = FakeArray(0x1000, 256), FakeArray(0x1080, 128)
    (rng,) = rec.ranges([tail])
    assert (rng.buffer, rng.start, rng.stop) == (alloc.id, 0x80, 0x100)
    assert rec.ranges([whole, whole]) == (rec.range_of(whole),)  # one Range per (allocation, bytes)
    rec.free(alloc)
    (free,) = ops(rec, T.Free)
    assert free.buffer == alloc.id and free.stream == rec.sid(s1)


def test_the_records_a_recording_keeps_are_off_the_cyclic_gcs_lists(rec):
    # Frozen and acyclic, so untracked: the GC's collections do not walk a long trace again and again.
    from streamcheck.core import fast
    from streamcheck.device import Device

    if fast._checker_native is None:
        pytest.skip(f"the native checker module is not built here: {fast.unavailable()}")
    s1, s2 = FakeStream(0x10), FakeStream(0x20)
    rec.gpu.current = s1
    alloc = rec.alloc(0x1000, 256)
    x = FakeArray(0x1000, 256)
    launch(rec, "write", s1, writes=(x,))
    launch(rec, "read", s2, reads=(x,))
    rec.free(alloc)
    assert rec.races  # the records still say what they said
    dev = Device("sim")
    a = dev.alloc(4, name="a", fill=0.0)
    dev.launch(lambda x: None, (a,), writes=[a], name="touch")
    dev.free(a)
    dev.alloc(4, name="b", reuse=a)  # the caching allocator's reuse: Alloc.reuses
    records = rec.trace.ops + dev.trace.ops
    ranges = [r for op in records for field in ("reads", "writes", "reuses") for r in getattr(op, field, ())]
    assert len(records) > 8 and len(ranges) == 4
    assert [o for o in records + ranges if gc.is_tracked(o)] == []


def test_memory_no_allocator_handed_out_is_checked_by_address_in_the_native_checker(rec):
    from streamcheck.core import fast

    if fast.unavailable():
        pytest.skip(f"the native checker is not built here: {fast.unavailable()}")
    s1, s2 = FakeStream(0x10), FakeStream(0x20)
    unknown = FakeArray(0x7F00_0000_1000, 64)  # no allocation, and the driver cannot say whose
    launch(rec, "write", s1, writes=(unknown,))
    launch(rec, "read", s2, reads=(unknown,))
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "write", "read")
    assert (race.start, race.stop) == (0x7F00_0000_1000, 0x7F00_0000_1040)  # offsets are the addresses
    assert rec.checker.occurrences() is not None  # still the native checker's (None: hb.Checker took over)


def test_memory_a_graph_uses_stays_alive_while_the_graph_lives(rec):
    gpu = rec.gpu
    origin, other = FakeStream(0x10), FakeStream(0x20)
    x = rec.alloc(0x1000, 64, stream=origin)
    y = rec.alloc(0x2000, 64, stream=origin)
    rec.capture_begin(origin, None, lambda: gpu.capturing.add(origin.ptr))
    launch(rec, "fill", origin, writes=(FakeArray(0x1000, 64),))
    graph = cupy_graphs.wrap_end_capture(lambda _s: (gpu.capturing.clear(), FakeGraph())[1])(origin)
    assert graph.kernel_names == ("fill",)

    rec.free(x)  # the program dropped its array; the graph still writes those bytes
    rec.free(y)  # not used by the graph: freed at once
    assert [f.buffer for f in ops(rec, T.Free)] == [y.id]
    graph.launch(other)
    launch(rec, "read_other", other, reads=(FakeArray(0x1000, 64),))
    assert rec.errors == [] and rec.races == []  # no "use after free", no race (same stream order)

    del graph
    gc.collect()
    assert [f.buffer for f in ops(rec, T.Free)] == [y.id, x.id]  # freed with the graph
    assert rec.errors == []


def test_each_host_thread_has_its_own_per_thread_default_stream(rec):
    ptds = FakeStream(2)  # cudaStreamPerThread
    child = rec.thread_starting()
    seen = {}

    def work():
        rec.thread_running(child)
        seen["child"] = rec.sid(ptds)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    rec.thread_joined(child)
    mine = rec.sid(ptds)
    assert mine != seen["child"]
    kinds = {op.stream: op.kind for op in ops(rec, T.StreamCreate)}
    assert kinds[mine] is kinds[seen["child"]] is StreamKind.PER_THREAD
    assert {rec.streams[mine], rec.streams[seen["child"]]} == {"ptds0", f"ptds{child}"}


def test_an_unordered_write_on_a_per_thread_stream_races_with_the_other_threads_read(rec):
    ptds = FakeStream(2)
    rec.alloc(0x1000, 64)
    data = FakeArray(0x1000, 64)
    launch(rec, "write", ptds, writes=(data,))
    thread = threading.Thread(target=lambda: launch(rec, "read", ptds, reads=(data,)))
    thread.start()
    thread.join()
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "write", "read")


def test_a_freed_block_split_and_freed_again_is_reused_from_its_latest_owners(rec):
    """A pool splits a freed block: a smaller allocation takes its head, then is freed in turn, with a read of it
    still pending on another stream. The next allocation over the whole block reuses the head from the smaller
    one (its latest owner) and the rest from the first: a FREE race with that read."""
    s, other = FakeStream(0x10), FakeStream(0x20)
    big = rec.alloc(0x1000, 4096, stream=s)
    rec.free(big)
    head = rec.alloc(0x1000, 64, stream=s)
    rest = rec.alloc(0x1040, 64, stream=s)  # the next bytes, to another allocation
    launch(rec, "read head", other, reads=(FakeArray(0x1000, 64),))
    rec.free(head)
    rec.free(rest)
    again = rec.alloc(0x1000, 4096, stream=s)
    reuses = [(r.buffer, r.start, r.stop) for op in ops(rec, T.Alloc) for r in op.reuses]
    assert reuses == [(big.id, 0, 64), (big.id, 64, 128),  # head and rest, each from the first block
                      (head.id, 0, 64), (rest.id, 0, 64), (big.id, 128, 4096)]  # then all of it, from each owner
    assert [op.buffer for op in ops(rec, T.Alloc)][-1] == again.id
    (race,) = rec.races
    assert (race.kind, race.first.name) == ("FREE", "read head")


@pytest.mark.parametrize("synchronized", [False, True])
def test_a_pool_block_freed_on_a_workers_per_thread_stream_goes_to_the_main_threads_one(rec, synchronized):
    """CuPy's pool files a free block under its stream handle, and every thread's per-thread default
    stream has the same one (cudaStreamPerThread): the main thread's next allocation gets the block a
    worker freed with its kernel's read pending. Joining the worker orders the host, not the
    worker's stream: a FREE race, unless the worker synchronized its stream before the free
    (tests/gpu_programs/torch/race_cupy_pool_ptds_other_thread.py and its fixed twin)."""
    ptds = FakeStream(2)
    child = rec.thread_starting()

    def worker():
        rec.thread_running(child)
        rec.gpu.current = ptds
        scratch = rec.alloc(0x1000, 64)
        launch(rec, "multiply", ptds, reads=(FakeArray(0x1000, 64),))
        if synchronized:
            rec.stream_sync(ptds, lambda: None)
        rec.free(scratch)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    rec.thread_joined(child)
    rec.gpu.current = ptds
    padding = rec.alloc(0x1000, 64)  # the same block, on the main thread's per-thread stream
    (alloc,) = [op for op in ops(rec, T.Alloc) if op.buffer == padding.id]
    assert alloc.reuses and alloc.stream != ops(rec, T.Alloc)[0].stream
    if synchronized:
        assert rec.races == []
    else:
        (race,) = rec.races
        assert (race.kind, race.first.name) == ("FREE", "multiply")
        assert race.second.actor == f"per-thread default stream of thread {child}"  # the free, on the worker's
        assert "per-thread default stream of thread 0" in race.missing_edge  # the allocation that got the bytes


def test_seed_chosen_delays_follow_the_one_rule(monkeypatch):
    rec = R.Recorder(FakeGpu(), delay_us=100.0, seed=5)
    monkeypatch.setattr(R, "current", rec)
    streams = [FakeStream(0x10 * i) for i in range(1, 9)]
    for s in streams:
        rec.register_stream(s.ptr, T.UNKNOWN_SITE, fresh=True)
        launch(rec, "k", s)
    delayed = {ptr for ptr, _ in rec.gpu.spins}
    expected = {s.ptr for s in streams if seed_delays(5, rec.streams[rec.sid(s)])}
    assert delayed == expected and rec.delays == len(expected)


def test_seeds_choose_every_delay_set_not_two():
    names = ("legacy", "s1", "s2", "s3")
    sets = {frozenset(n for n in names if seed_delays(seed, n)) for seed in range(400)}
    assert len(sets) == 16  # a parity rule (crc32(name) + seed) % 2 gave exactly two
    for name in names:  # a fair coin per stream
        assert 150 < sum(seed_delays(seed, name) for seed in range(400)) < 250
    eight = ("legacy",) + tuple(f"s{i}" for i in range(1, 8))
    assert len({frozenset(n for n in eight if seed_delays(seed, n)) for seed in range(10)}) == 10


# --- patching ---------------------------------------------------------------------------------

@pytest.fixture
def fake_library(monkeypatch):
    """`fakelib` (a package) re-exporting `Kernel` from `fakelib.core`, which defines it."""
    core = types.ModuleType("fakelib.core")

    class Kernel:
        def run(self):
            return "ran"
    Kernel.__module__ = "fakelib.core"
    core.Kernel = Kernel
    pkg = types.ModuleType("fakelib")
    pkg.core, pkg.Kernel = core, Kernel
    monkeypatch.setitem(sys.modules, "fakelib", pkg)
    monkeypatch.setitem(sys.modules, "fakelib.core", core)
    return pkg


def test_a_type_is_rebound_where_python_looks_it_up_never_in_its_defining_module(fake_library):
    unpatched: list = []
    patcher = Patcher(unpatched)
    original = fake_library.Kernel
    sub = lambda K: transparent_subclass(K, {"run": lambda self: "recorded " + K.run(self)})  # noqa: E731
    assert patcher.apply(Patch("fakelib.Kernel", sub, also=("fakelib.core.Kernel",)))
    assert fake_library.Kernel is not original and fake_library.core.Kernel is original
    assert "not replaced in the module that defines it" in unpatched[0]
    assert fake_library.Kernel().run() == "recorded ran"
    assert isinstance(original(), fake_library.Kernel)  # objects made before still pass isinstance
    assert fake_library.Kernel.__name__ == "Kernel" and fake_library.Kernel.__module__ == "fakelib.core"
    patcher.restore()
    assert fake_library.Kernel is original


def test_undo_keeps_what_the_program_rebound_itself(fake_library):
    unpatched: list = []
    patcher = Patcher(unpatched)
    original_run = fake_library.core.Kernel.run
    patcher.apply(Patch("fakelib.core.Kernel.run", lambda run: lambda self: "wrapped"))

    def programs_own(self):
        return "the program's"
    fake_library.core.Kernel.run = programs_own
    patcher.restore()
    assert fake_library.core.Kernel.run is programs_own and fake_library.core.Kernel.run is not original_run
    assert "rebound by the program" in unpatched[-1]


def test_a_missing_entry_point_is_reported_not_raised(fake_library):
    unpatched: list = []
    assert not Patcher(unpatched).apply(Patch("fakelib.core.Kernel.launch_async", lambda f: f))
    assert "fakelib.core.Kernel.launch_async: not in this library version" in unpatched[0]


def test_a_new_stream_at_a_destroyed_streams_address_is_another_stream(rec):
    # CUDA may hand a destroyed stream's handle to the next stream created: work on the two is
    # not ordered, so they must not be confused as one stream.
    rec.alloc(0x1000, 64)
    data = FakeArray(0x1000, 64)
    old = rec.register_stream(0x10, T.UNKNOWN_SITE, fresh=True)
    launch(rec, "write", FakeStream(0x10), writes=(data,))
    new = rec.register_stream(0x10, T.UNKNOWN_SITE, fresh=True)  # Stream() after the old one was destroyed
    assert new != old and rec.sid(FakeStream(0x10)) == new
    launch(rec, "read", FakeStream(0x10), reads=(data,))
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "write", "read")


def _racy_steps(rec, steps: int) -> None:
    """Each step: s1 writes x, s2 reads it without a wait (a race), then the host reads y on s1."""
    s1, s2 = FakeStream(0x10), FakeStream(0x20)
    rec.alloc(0x1000, 64, stream=s1)
    rec.alloc(0x2000, 64, stream=s1)
    x, y = FakeArray(0x1000, 64), FakeArray(0x2000, 64)
    for _ in range(steps):
        launch(rec, "write", s1, writes=(x,))
        launch(rec, "read", s2, reads=(x,), writes=(y,))
        rec.host_read("get", y, s1, True, lambda: None)


def test_checks_deferred_to_host_syncs_report_what_checks_at_each_record_report(monkeypatch):
    reports = []
    for defer in (False, True):
        rec = R.Recorder(FakeGpu())
        monkeypatch.setattr(R, "current", rec)
        if defer:
            rec.defer_checks()
        _racy_steps(rec, 3)
        reports.append([(r.kind, r.first.name, r.second.name, r.count) for r in rec.races])
    # x's write and read race every step, the next step's write with the read (WAR), and the
    # host's read of y with s2's write of it (the host synchronized s1 only).
    assert reports[0] == reports[1] == [("RAW", "write", "read", 3), ("RAW", "read", "copy D2H", 3),
                                        ("WAR", "read", "write", 2)]


def test_a_record_the_checker_refuses_is_kept_when_checks_are_deferred_too(monkeypatch):
    refused = []
    for defer in (False, True):
        rec = R.Recorder(FakeGpu())
        monkeypatch.setattr(R, "current", rec)
        if defer:
            rec.defer_checks()
        rec.record(T.Launch(0, T.UNKNOWN_SITE, stream=99, name="lost"))  # a stream the trace never created
        rec.host_read("get", FakeArray(0x1000, 0), FakeStream(0x10), True, lambda: None)
        refused.append([(index, op.name) for index, op, _ in rec.refused])
    assert refused[0] == refused[1] == [(1, "lost")]


def test_a_library_call_site_names_the_users_line_and_the_librarys_as_innermost(tmp_path, monkeypatch):
    """Frames in the Gpu's library_dirs are the library's: the site is the user's call of it, and
    the library's line is the innermost frame (before, they were skipped without a trace)."""
    (tmp_path / "fakelib").mkdir()
    (tmp_path / "fakelib" / "api.py").write_text("def launch(rec, stream):\n    rec.launch('k', lambda: None, stream=stream)\n")
    spec = importlib.util.spec_from_file_location("fakelib_api", tmp_path / "fakelib" / "api.py")
    api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api)
    gpu = FakeGpu()
    gpu.library_dirs = (str(tmp_path / "fakelib"),)
    rec = R.Recorder(gpu)
    monkeypatch.setattr(R, "current", rec)
    line = sys._getframe().f_lineno + 1
    api.launch(rec, FakeStream(0x10))
    (op,) = ops(rec, T.Launch)
    assert (op.site.file, op.site.line) == (__file__, line)
    assert (op.site.innermost.file, op.site.innermost.line) == (str(tmp_path / "fakelib" / "api.py"), 2)


def test_the_cuda_stream_legacy_handle_is_the_legacy_default_stream(rec):
    # cudaStreamLegacy is ((cudaStream_t)0x1): work on it and on the null stream (0) is in stream order.
    rec.alloc(0x1000, 64)
    x = FakeArray(0x1000, 64)
    launch(rec, "write", FakeStream(1), writes=(x,))
    launch(rec, "read", FakeStream(0), reads=(x,))
    assert rec.sid(FakeStream(1)) == rec.sid(FakeStream(0)) == 0
    assert rec.races == []


def test_kernel_arguments_the_signature_does_not_describe_count_as_written(rec):
    # No source to read a signature from: each array argument may be written (the conservative rule).
    s1, s2 = FakeStream(0x10), FakeStream(0x20)
    rec.alloc(0x1000, 64)
    x = FakeArray(0x1000, 64)
    assert rec.kernel_access("opaque", None, (x, 3)) == ([], [x])
    rec.source_launch("opaque", None, (x,), s1, lambda: None)
    launch(rec, "read", s2, reads=(x,))
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "opaque", "read")


def test_a_non_blocking_host_read_does_not_synchronize_its_stream(rec):
    # get(blocking=False): the copy is queued on s1 and the host goes on; the data is not there yet.
    s1 = FakeStream(0x10)
    rec.alloc(0x1000, 64)
    y = FakeArray(0x1000, 64)
    rec.host_read("get", y, s1, False, lambda: None)
    assert ops(rec, T.StreamSync) == []
    rec.host_read("get", y, s1, True, lambda: None)
    assert [op.stream for op in ops(rec, T.StreamSync)] == [rec.sid(s1)]


# --- compute(): CuPy's functions and ndarray methods, which launch iff they allocate or write ----


def _cupy_call(rec, wrap, fn, *args, stream=None, **kwargs):
    """`fn` wrapped by a CuPy adapter's wrapper factory `wrap` (what its patch table installs),
    called on `stream` (the current one)."""
    if stream is not None:
        rec.gpu.current = stream
    return wrap(fn)(*args, **kwargs)


def _allocating(rec, ptr, nbytes=64):
    """A library function that allocates its result from CuPy's pool (whose hook records it)."""
    def fn(*args, **kwargs):
        rec.alloc(ptr, nbytes, what="cupy array")
        return FakeArray(ptr, nbytes)
    return fn


def test_a_cupy_function_writes_the_result_it_allocates_and_reads_its_arguments(rec):
    from streamcheck.record.adapters.cupy_functions import compute_function

    a_stream, b_stream = FakeStream(0x10), FakeStream(0x20)
    rec.alloc(0x1000, 64)
    rec.alloc(0x2000, 64)
    x, w = FakeArray(0x1000, 64), FakeArray(0x2000, 64)
    y = _cupy_call(rec, compute_function("cupy.matmul"), _allocating(rec, 0x3000), x, w, stream=a_stream)
    (op,) = ops(rec, T.Launch)
    assert (op.name, op.stream) == ("cupy.matmul", rec.sid(a_stream))
    assert op.writes == rec.ranges([y]) and set(op.reads) == set(rec.ranges([x, w]))
    launch(rec, "consume", b_stream, reads=(y,))  # no wait for stream A
    (race,) = rec.races
    assert (race.kind, race.first.name, race.first.write, race.second.name) == ("RAW", "cupy.matmul", True, "consume")


def test_a_cupy_method_writes_the_result_it_allocates(rec):
    from streamcheck.record.adapters.cupy_ndarray import compute_method

    a_stream, b_stream = FakeStream(0x10), FakeStream(0x20)
    rec.alloc(0x1000, 64)
    x = FakeArray(0x1000, 64)
    total = _cupy_call(rec, compute_method("cupy.ndarray.sum"), _allocating(rec, 0x3000, 8), x, stream=a_stream)
    launch(rec, "overwrite", b_stream, writes=(total,))  # no wait for stream A
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("WAW", "cupy.ndarray.sum", "overwrite")


def test_a_cupy_call_that_allocates_nothing_launches_nothing(rec):
    # A view of an array allocated just before the call (the newest allocation so far) is no
    # result of the call: no kernel ran.
    from streamcheck.record.adapters.cupy_functions import compute_function

    rec.alloc(0x1000, 64)
    x = FakeArray(0x1000, 64)
    view = _cupy_call(rec, compute_function("cupy.reshape"), lambda a, shape: FakeArray(a.ptr, a.nbytes), x, (8, 2),
                      stream=FakeStream(0x10))
    assert view.ptr == x.ptr and ops(rec, T.Launch) == []


def test_a_torch_graph_captured_before_the_recording_is_named_when_replayed(rec):
    """Its nodes were never recorded: each such graph is named once, its replay still runs."""
    from streamcheck.record.adapters import torch_graphs

    class BeforeGraph:  # a torch.cuda.CUDAGraph captured before the recording: no _streamcheck_graph
        replays = 0

        def replay(self):
            self.replays += 1
    replay = torch_graphs._replay(BeforeGraph.replay)
    first, second = BeforeGraph(), BeforeGraph()
    replay(first)
    replay(first)
    replay(second)
    assert (first.replays, second.replays) == (2, 1)
    notices = [n for n in rec.notices if "captured before the recording started" in n]
    assert len(notices) == 2 and all("test_recorder.py" in n and "not seen" in n for n in notices)
    assert ops(rec, T.GraphLaunch) == []
