"""The torch adapter (streamcheck/record/adapters/torch_ops.py, torch_runtime.py) on the CPU: CPU tensors
stand in for CUDA tensors (and a chosen few for pinned host memory), so the operator rules are
checked without a GPU: schema writes, fresh outputs, views as byte ranges, host copies,
`.item()`, the caching allocator's blocks and record_stream.

Each test of the `run` fixture runs twice: through the dispatch mode (the Python path) and through
the native observer (record/native, torch_native.py) observing CPU tensors. Those of `python_run`
need the stand-in's pinned or pageable host tensors, which only the Python path can be told of (the
observer asks the allocator whether memory is pinned)."""
from __future__ import annotations

import contextlib
import weakref

import pytest

torch = pytest.importorskip("torch")

from streamcheck.record import native, recorder as R  # noqa: E402
from streamcheck.record.adapters import torch_graphs, torch_native, torch_ops, torch_runtime  # noqa: E402
from streamcheck.core import trace as T  # noqa: E402
from streamcheck.record.host_views import HostView  # noqa: E402
import numpy as np  # noqa: E402

from . import stand_in  # noqa: E402
from .stand_in import CpuStandsInForCuda, stand_in_gpu  # noqa: E402,F401 (also the other tests' names here)

A, B = 0x10, 0x20  # two torch streams (cudaStream_t)


def harness(monkeypatch, path: str = "python"):
    """(recorder, ops, on(stream)): `with on(A): ...` runs torch code recorded on stream A, through the
    dispatch mode (`path` "python") or the native observer ("native", which this process may lack:
    the test is skipped, saying why)."""
    observer = None
    if path == "native":
        observer = native.load()
        if observer is None:
            pytest.skip(f"no native observer here: {native.unavailable_reason()}")
    rec = R.Recorder(stand_in_gpu())
    stand_in.machinery(rec)
    monkeypatch.setattr(R, "current", rec)
    rec.state["torch"] = torch_runtime.TorchState()
    current = {"stream": A}
    monkeypatch.setattr(torch_ops, "current_stream_ptr", lambda torch, device=None: current["stream"])
    monkeypatch.setattr(torch_runtime, "current_stream_ptr", lambda torch, device=None: current["stream"])
    ops = CpuStandsInForCuda(rec, torch)
    for s in (A, B):
        rec.register_stream(s, T.UNKNOWN_SITE, fresh=True)

    class on:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            current["stream"] = self.stream
            if observer is None:
                self.mode = torch_ops.make_mode(rec, torch, ops, backend="CPU")
                self.mode.__enter__()
            else:  # CPU has no streams: each record is on the stream current when it is drained (at exit)
                self.recording = torch_native.start(rec, torch, observer, ops, device="cpu",
                                                    stream_pointer=lambda handle: current["stream"])

        def __exit__(self, *exc):
            if observer is None:
                self.mode.__exit__(*exc)
            else:
                torch_native.stop(self.recording)
            current["stream"] = A
    return rec, ops, on


@pytest.fixture(params=["python", "native"])
def run(request, monkeypatch):
    return harness(monkeypatch, request.param)


@pytest.fixture
def python_run(monkeypatch):
    return harness(monkeypatch, "python")


def launches(rec):
    return [op for op in rec.trace.ops if type(op) is T.Launch]


def test_an_in_place_op_on_a_slice_writes_those_bytes_only(run):
    rec, _, on = run
    x = torch.zeros(8)
    with on(A):
        x[2:4].add_(1)
    (op,) = launches(rec)
    assert op.name == "aten.add_.Tensor" and op.stream == rec.sid(A)
    (written,) = op.writes
    assert (written.start, written.stop) == (8, 16) and op.reads == ()
    assert x.tolist() == [0, 0, 1, 1, 0, 0, 0, 0]  # the program's result, unchanged


def test_an_op_reads_its_inputs_and_writes_its_fresh_output(run):
    rec, _, on = run
    x = torch.arange(4.0)
    with on(A):
        y = x * 2
    (op,) = launches(rec)
    assert op.name == "aten.mul.Tensor"
    (read,), (written,) = op.reads, op.writes
    assert read.buffer != written.buffer and (written.start, written.stop) == (0, 16)
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_views_launch_nothing(run):
    rec, _, on = run
    x = torch.zeros(8)
    with on(A):
        x.view(2, 4)
        x[1:]
        x.t() if x.dim() == 2 else x.unsqueeze(0)
    assert launches(rec) == []


def test_slices_of_one_bucket_written_from_two_streams_race_only_where_they_overlap(run):
    rec, _, on = run
    bucket = torch.zeros(8)
    with on(A):
        bucket[:4].fill_(1)
    with on(B):
        bucket[4:].fill_(2)  # disjoint: no race
    assert rec.races == []
    with on(B):
        bucket[2:6].mul_(3)  # overlaps A's half with no wait
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("WAW", "aten.fill_.Scalar", "aten.mul_.Tensor")
    assert (race.start, race.stop) == (8, 16)


def test_a_pinned_buffer_rewritten_by_the_host_while_its_async_copy_is_pending_races(python_run):
    rec, ops, on = python_run
    staging = torch.ones(16)
    ops.pinned.add(staging.untyped_storage().data_ptr())
    device = torch.zeros(16)
    with on(A):
        device.copy_(staging, non_blocking=True)  # H2D, async: stream A reads the pinned bytes later
        staging.fill_(5)  # the host writes them now
    copy = next(op for op in rec.trace.ops if type(op) is T.Copy)
    assert copy.kind is T.CopyKind.H2D and copy.stream == rec.sid(A)
    assert not any(type(op) is T.StreamSync for op in rec.trace.ops)  # non_blocking from pinned: no wait
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("WAR", "copy H2D", "aten.fill_.Scalar")
    assert race.second.actor == "host thread 0"


def test_a_fresh_pinned_tensor_on_a_reused_block_is_ordered_after_the_old_tensors_pending_copy(python_run):
    """torch's CachingHostAllocator (issue 37): the block of a pinned staging tensor whose
    non_blocking copy is pending goes back to the pool when the tensor dies, and is handed to a new
    pinned tensor only once the event recorded after that copy completed. So the host's write into
    the new tensor (same bytes) is ordered after the copy, where a write into the old one races."""
    rec, ops, on = python_run
    staging = torch.ones(16)
    ptr = staging.untyped_storage().data_ptr()
    ops.pinned.add(ptr)
    device = torch.zeros(16)
    with on(A):
        device.copy_(staging, non_blocking=True)  # pending on A: the pinned block is in use
    again = torch.empty(0).set_(staging.untyped_storage())  # a new tensor on the same bytes
    ops.register(again, "host", fresh=True)  # as torch.empty(16, pin_memory=True) handing the block out again
    with on(A):
        again.fill_(5)  # the host writes the new staging tensor
    assert rec.races == [], rec.report()
    queries = [op for op in rec.trace.ops if type(op) is T.EventQuery]
    assert [q.done for q in queries] == [True]  # the allocator's query of the copy's event
    (reuse,) = [op for op in rec.trace.ops if type(op) is T.Alloc and op.reuses]
    assert reuse.stream is None and reuse.reuses[0].start == 0


@pytest.mark.parametrize("synchronized", [False, True], ids=["read-before-sync", "read-after-sync"])
def test_a_numpy_view_of_pinned_memory_reads_it_as_the_host(python_run, monkeypatch, synchronized):
    """vLLM's pattern (issue 37): a non_blocking D2H copy into a pinned tensor, then the host reads
    its numpy view. The view's read is a host access of the bytes it reads (RAW before the sync)."""
    rec, ops, on = python_run
    pinned = torch.zeros(16)
    ops.pinned.add(pinned.untyped_storage().data_ptr())
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: self.untyped_storage().data_ptr() in ops.pinned)
    counts = torch.arange(16.0)
    view = torch_ops._numpy(torch.Tensor.numpy)(pinned)  # torch.Tensor.numpy as the adapter patches it
    assert isinstance(view, HostView)
    with on(A):
        pinned.copy_(counts, non_blocking=True)  # async D2H on A into the pinned tensor
    if synchronized:
        torch_runtime._stream_synchronized(A)
    assert view[3] == 3.0
    if synchronized:
        assert rec.races == []
        return
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", "copy D2H", "host view read")
    assert (race.start, race.stop) == (12, 16)  # the element read, not the whole tensor
    assert race.second.site.file == __file__


def test_numpy_of_pageable_memory_is_a_plain_array(run):
    rec, ops, on = run
    array = torch_ops._numpy(torch.Tensor.numpy)(torch.zeros(4))
    assert type(array) is np.ndarray


def test_the_same_host_write_after_a_stream_sync_is_fine(python_run):
    rec, ops, on = python_run
    staging = torch.ones(16)
    ops.pinned.add(staging.untyped_storage().data_ptr())
    device = torch.zeros(16)
    with on(A):
        device.copy_(staging, non_blocking=True)
    rec.stream_sync(A, lambda: None)  # what torch's stream-synchronization callback records
    with on(A):
        staging.fill_(5)
    assert rec.races == []


def test_a_blocking_copy_from_pinned_memory_is_followed_by_a_host_wait(python_run):
    rec, ops, on = python_run
    device = torch.zeros(4)
    pinned = torch.ones(4)
    ops.pinned.add(pinned.untyped_storage().data_ptr())
    with on(A):
        device.copy_(pinned)  # non_blocking=False: the host waits for the stream
        pinned.fill_(2)
    assert [type(op).__name__ for op in rec.trace.ops if type(op) in (T.Copy, T.StreamSync)] == ["Copy", "StreamSync"]
    assert rec.races == []


@pytest.mark.parametrize("non_blocking", [False, True], ids=["blocking", "non-blocking-asked"])
@pytest.mark.parametrize("direction", ["H2D", "D2H"])
def test_a_copy_between_a_device_tensor_and_pageable_memory_is_followed_by_a_host_wait(python_run, direction, non_blocking):
    # Pageable memory goes through a staging buffer the host waits for, non_blocking or not: the
    # host issues what follows after the copy ran, so stream B's use of the device tensor is
    # ordered after it with no event.
    rec, ops, on = python_run
    device, pageable = torch.zeros(4), torch.ones(4)
    ops.pageable.add(pageable.untyped_storage().data_ptr())
    with on(A):
        if direction == "H2D":
            device.copy_(pageable, non_blocking=non_blocking)
        else:
            pageable.copy_(device, non_blocking=non_blocking)
    with on(B):
        device.mul_(3)  # writes what A's copy read or wrote
    (copy,) = [op for op in rec.trace.ops if type(op) is T.Copy]
    assert copy.kind is getattr(T.CopyKind, direction) and copy.stream == rec.sid(A)
    after = rec.trace.ops[rec.trace.ops.index(copy) + 1]
    assert type(after) is T.StreamSync and after.stream == rec.sid(A)
    assert rec.races == []
    assert (device.tolist(), pageable.tolist()) == (([3.0] * 4, [1.0] * 4) if direction == "H2D" else ([0.0] * 4, [0.0] * 4))


def test_item_reads_on_the_current_stream_and_waits_for_it(run):
    rec, _, on = run
    x = torch.arange(4.0)
    with on(B):
        value = x.sum().item()
    assert value == 6.0
    kinds = [type(op).__name__ for op in rec.trace.ops if type(op) in (T.Launch, T.Copy, T.StreamSync)]
    assert kinds == ["Launch", "Copy", "StreamSync"]
    assert all(op.stream == rec.sid(B) for op in rec.trace.ops if type(op) in (T.Copy, T.StreamSync))


HOST_VALUED = [
    pytest.param(lambda x, y: torch.equal(x, y), id="equal"),
    pytest.param(lambda x, y: torch.allclose(x, y), id="allclose"),
    pytest.param(lambda x, y: torch.nonzero(x), id="nonzero"),
    pytest.param(lambda x, y: x[x > 0], id="boolean-mask-index"),
    pytest.param(lambda x, y: torch.masked_select(x, y > 0), id="masked_select"),
    pytest.param(lambda x, y: torch.unique(x), id="unique"),
    pytest.param(lambda x, y: torch.repeat_interleave(x.long()), id="repeat_interleave-without-output_size"),
]


@pytest.mark.parametrize("host_valued", HOST_VALUED)
def test_an_operator_that_hands_the_host_a_value_orders_a_later_write_on_another_stream(run, host_valued):
    """The host waited for A inside the call (issue 37: equal, allclose, tolist were reported on an
    H100): the operator's reads are recorded before that wait, so B's overwrite issued next is ordered."""
    rec, _, on = run
    x, y = torch.arange(4.0), torch.arange(4.0)
    with on(A):
        x.add_(1)
        host_valued(x, y)
    with on(B):
        x.zero_()
        y.zero_()
    assert rec.races == [], rec.report()
    syncs = [op for op in rec.trace.ops if type(op) is T.StreamSync]
    assert [s.stream for s in syncs][-1:] == [rec.sid(A)] and syncs[-1].cause.startswith("aten.")


@pytest.mark.parametrize("device_only", [
    pytest.param(lambda x, index: torch.add(x, x), id="add"),
    pytest.param(lambda x, index: x[index - 1], id="integer-index"),
    pytest.param(lambda x, index: torch.repeat_interleave(x, index, output_size=3), id="repeat_interleave-output_size"),
])
def test_an_operator_that_needs_no_host_value_leaves_a_later_write_on_another_stream_racy(run, device_only):
    rec, _, on = run
    x, index = torch.arange(2.0), torch.tensor([1, 2])  # (repeats for repeat_interleave, positions for x[index])
    with on(A):
        device_only(x, index)
    with on(B):
        x.zero_()
    assert [r.kind for r in rec.races] == ["WAR"], rec.report()


def _block_written_on_a(run):
    """(rec, on, x, its block's pointer): a tensor the allocator reported on stream A, filled there."""
    rec, _, on = run
    x = torch.zeros(1024)
    ptr = x.untyped_storage().data_ptr()
    torch_runtime.state(rec).pending[ptr] = rec.sid(A)  # the allocator reported the block on stream A
    with on(A):
        x.fill_(1)
    return rec, on, x, ptr


@pytest.mark.parametrize("how", ["reused at once", "reused after A waits for B", "nothing reuses it", "strict"])
def test_a_block_freed_without_record_stream_races_with_its_side_stream_reader_once_reused(run, how):
    """The free alone corrupts nothing: the race is the allocation on A that the caching allocator
    hands the block (the same address) before B's read is ordered before it; a block nothing
    reuses is a hazard line; --strict-free makes the free itself the race."""
    rec, on, x, ptr = _block_written_on_a(run)
    rec.strict_free = how == "strict"
    with on(B):
        x.sum()  # read on a side stream, no record_stream
    torch_runtime._deallocated(ptr)  # the program dropped x: the block goes back to A's pool
    (free,) = [op for op in rec.trace.ops if type(op) is T.Free]
    assert free.stream == rec.sid(A) and free.pool == "torch" and free.also == ()
    if how == "reused after A waits for B":
        torch_runtime._event_recorded(0xE2, B)  # A.wait_stream(B)
        torch_runtime._event_waited(0xE2, A)
    if how.startswith("reused"):  # the allocator hands the block to the next allocation on A
        rec.alloc(ptr, x.untyped_storage().nbytes(), what="torch tensor", pool="torch", sid=rec.sid(A))
        (reuse,) = [op for op in rec.trace.ops if type(op) is T.Alloc and op.reuses]
        assert reuse.reuses == (T.Range(free.buffer, 0, x.untyped_storage().nbytes()),)
        assert reuse.stream == rec.sid(A)
    frees = [r for r in rec.races if r.kind == "FREE"]  # (B's read of A's fill is a RAW besides)
    if how == "reused after A waits for B":
        assert frees == [] and rec.hazards == []
        return
    if how == "nothing reuses it":
        assert frees == []
        (hazard,) = rec.hazards
        assert hazard.race.first.name == "aten.sum.default" and "record_stream" in hazard.race.hint
        assert "1 free hazard" in rec.report()
        return
    (race,) = frees
    assert race.first.name == "aten.sum.default" and "record_stream" in race.hint


def test_a_block_freed_while_a_graph_is_captured_stays_the_graphs(run, monkeypatch):
    """torch's capture pool: a block freed during a capture (an intermediate the compiled wrapper
    drops) goes back to the graph's private pool, whose replays keep writing it: no Free, so a
    replay after it is no use after free, and the block is the same allocation afterwards."""
    rec, on, x, ptr = _block_written_on_a(run)
    alloc = rec.allocation_of(x)
    with monkeypatch.context() as capturing:
        capturing.setattr(type(rec), "captures", property(lambda self: 1))  # a capture is open
        torch_runtime._deallocated(ptr)
    assert [op for op in rec.trace.ops if type(op) is T.Free] == [] and rec.allocation_of(x) is alloc
    torch_runtime._deallocated(ptr)  # outside a capture: back to the stream's pool
    assert len([op for op in rec.trace.ops if type(op) is T.Free]) == 1


def test_a_block_a_graph_tree_warm_up_allocated_goes_back_to_the_trees_pool_and_is_no_free(run):
    """CUDA graph trees warm a function up with its allocations going to their private pool
    (cudagraph_trees._use_cuda_memory_pool_manager, wrapped by torch_graphs): a warm-up output read
    on a side stream and dropped later, outside any capture, is not freed (the pool's next user
    starts with a device synchronize); an ordinary block read the same way is a FREE race."""
    rec, _, on = run
    entered = []

    @contextlib.contextmanager
    def trees_pool_manager(device, mem_pool, stream):  # torch's: synchronize, allocate to the pool
        entered.append((device, mem_pool))
        yield

    kept = []  # the CPU tensors (inputs and the sums' outputs) stay alive: no later tensor gets their address

    def read_on_b_then_drop(in_pool: bool):
        manager = torch_graphs._pool_manager(trees_pool_manager)(0, (0, 7), None) if in_pool \
            else contextlib.nullcontext()
        with manager:
            x = torch.zeros(1024)
            kept.append(x)
            ptr = x.untyped_storage().data_ptr()
            torch_runtime._allocated(ptr)  # the allocator's callback, on stream A
            with on(A):
                x.fill_(1)
        torch_runtime._event_recorded(0xE1, A)  # side.wait_stream(A)
        torch_runtime._event_waited(0xE1, B)
        with on(B):
            kept.append(x.sum())  # read on a side stream, no record_stream
        torch_runtime._deallocated(ptr)
        return [op for op in rec.trace.ops if type(op) is T.Free]

    assert read_on_b_then_drop(in_pool=True) == [] and rec.races == []
    assert entered == [(0, (0, 7))]
    assert torch_runtime.state(rec).graph_pool_blocks == set()  # handed back with the block
    (free,) = read_on_b_then_drop(in_pool=False)
    assert free.pool == "torch" and rec.races == [] and [h.race.kind for h in rec.hazards] == ["FREE"]


def test_a_tensor_the_program_drops_keeps_its_address_while_recording(python_run):
    # The CPU allocator would hand the address to the next tensor of that size at once: a tensor
    # there would be taken for bytes of the dropped one (which the recording never saw freed).
    rec, _, on = python_run
    x = torch.ones(1024)
    with on(A):
        y = x * 2
    ptr, storage = y.untyped_storage().data_ptr(), weakref.ref(y.untyped_storage())
    del y
    assert storage() is not None  # its memory stays the recording's
    later = [torch.empty(n) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) * 4]  # one often lands there
    assert ptr not in [t.untyped_storage().data_ptr() for t in later]
    assert rec.allocation_at(ptr) is not None and not any(type(op) is T.Free for op in rec.trace.ops)


def test_record_stream_defers_the_reuse_past_the_side_streams_work(run):
    rec, on, x, ptr = _block_written_on_a(run)
    torch_runtime._event_recorded(0xE1, A)  # side.wait_stream(A), as torch reports it: record, then wait
    torch_runtime._event_waited(0xE1, B)
    with on(B):
        x.sum()
    rec.record_stream(rec.allocation_of(x), B)  # x.record_stream(side)
    torch_runtime._deallocated(ptr)
    (free,) = [op for op in rec.trace.ops if type(op) is T.Free]
    assert free.also == (rec.sid(B),)
    assert rec.races == []


def test_a_failure_in_the_bookkeeping_never_breaks_the_program(python_run, monkeypatch):
    rec, ops, on = python_run
    x = torch.arange(4.0)

    def broken(t):
        raise RuntimeError("bookkeeping bug")
    monkeypatch.setattr(ops, "_kind", broken)
    with on(A):
        y = x * 3  # the operator still runs, once, and returns its value
    assert y.tolist() == [0.0, 3.0, 6.0, 9.0]
    assert rec.errors == ["aten.mul.Tensor: RuntimeError: bookkeeping bug (not recorded)"]


def test_the_operators_own_error_reaches_the_program_unchanged(run):
    rec, _, on = run
    a, b = torch.zeros(3), torch.zeros(4)
    with on(A), pytest.raises(RuntimeError, match="size of tensor a"):
        a + b
    assert rec.errors == []  # not ours


def test_empty_cache_is_noted_as_a_device_wide_wait_never_an_edge(run):
    """torch.cuda.empty_cache() frees the cached segments with cudaFree, which waits for every
    stream (docs/cuda-rules.md (b)): on the timeline and in the audit's implicit list, not an
    edge, so a race it happens to hide is still reported."""
    from streamcheck.record.adapters.patching import Patcher

    rec, _, on = run
    patcher = Patcher(rec.unpatched)
    for patch in torch_runtime.patches():
        if patch.target == "torch.cuda.memory.empty_cache":
            assert patcher.apply(patch)
    try:
        x = torch.zeros(1024)
        with on(A):
            x.fill_(1)
        torch.cuda.empty_cache()
        with on(B):
            x.sum()
    finally:
        patcher.restore()
    (noted,) = [op for op in rec.trace.ops if type(op) is T.ImplicitSync]
    assert "empty_cache" in noted.reason and "not an edge" in noted.reason
    assert [r.kind for r in rec.races] == ["RAW"]
    assert torch.cuda.empty_cache is torch.cuda.memory.empty_cache and not hasattr(torch.cuda.empty_cache,
                                                                                      "__wrapped__")


def test_a_recorded_operator_names_the_users_line_not_the_wrapper_torch_puts_around_the_mode(run):
    """torch wraps a dispatch mode's __torch_dispatch__ in torch._disable_dynamo: its frames sit
    between the user's line and the recording, and must not read as the library call the user made
    (`through torch/_dynamo/eval_frame.py`); a library the user called is still named."""
    rec, _, on = run
    x = torch.zeros(8)
    with on(A):
        x.add_(1)
        torch.nn.functional.relu(x, inplace=True)  # through torch/nn/functional.py
    add, relu = launches(rec)
    assert add.site.file == __file__ and add.site.innermost is None, add.site.place
    assert "eval_frame" not in add.site.place and "_compile" not in add.site.place
    assert relu.site.innermost is not None and relu.site.innermost.file.endswith("functional.py"), relu.site.place
