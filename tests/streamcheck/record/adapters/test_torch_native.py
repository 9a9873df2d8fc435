"""The native operator observer (streamcheck/record/native/observer.cpp) and its drain
(record/adapters/torch_native.py) on the CPU, observing CPU tensors as the stand-ins of
test_torch_ops.py: the records of a small program (bytes read and written, the user's lines), the
same trace as the dispatch mode's for the same programs (composites with and without autograd,
host-valued operators, custom operators, frees and events between operators, call stacks), nothing
left behind once it stops, streamcheck's own operators never recorded, the threads that observe,
and the Python path, said in one line, where the library cannot be built."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch")

from streamcheck.core import trace as T  # noqa: E402
from streamcheck.record import gpu, native, recorder as R  # noqa: E402
from streamcheck.record.adapters import torch_graphs, torch_native, torch_runtime  # noqa: E402

from . import test_torch_custom_ops as custom  # noqa: E402  (registers its operators)
from .test_torch_ops import A, B, harness, launches  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
F = torch.nn.functional


@pytest.fixture
def observer():
    found = native.load()
    if found is None:
        pytest.skip(f"no native observer here: {native.unavailable_reason()}")
    return found


def line_of(text: str) -> int:
    """The line of this file that holds `text` (a marker comment)."""
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "line_of(" not in line)


def test_a_small_programs_records_read_and_write_its_bytes_at_the_users_lines(monkeypatch, observer):
    rec, _, on = harness(monkeypatch, "native")
    x, y, z = torch.zeros(8), torch.arange(8.0), torch.empty(8)
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with on(A):
        m = a @ b  # matmul
        x[2:4].add_(1)  # in place, on a slice
        v = x.view(2, 4)  # only a view
        v[1].fill_(3)  # written through the view
        torch.mul(x, y, out=z)  # out=
        c = torch.cat([x, y])  # a TensorList
    mm, add, fill, mul, cat = launches(rec)

    def place(op):
        return op.site.file, op.site.line

    def spans(ranges, *tensors):  # (buffer, start, stop) of each range, and of the tensors' bytes
        return [(r.buffer, r.start, r.stop) for r in ranges], [(r.buffer, r.start, r.stop) for r in rec.ranges(tensors)]

    assert (mm.name, place(mm)) == ("aten.mm.default", (__file__, line_of("# matmul")))
    assert spans(mm.reads, a, b)[0] == spans(mm.reads, a, b)[1] and spans(mm.writes, m)[0] == spans(mm.writes, m)[1]
    assert (add.name, place(add)) == ("aten.add_.Tensor", (__file__, line_of("# in place, on a slice")))
    assert [(r.start, r.stop) for r in add.writes] == [(8, 16)] and add.reads == ()
    assert (fill.name, place(fill)) == ("aten.fill_.Scalar", (__file__, line_of("# written through the view")))
    assert [(r.start, r.stop) for r in fill.writes] == [(16, 32)]  # x[4:8], through v[1]
    assert (mul.name, place(mul)) == ("aten.mul.out", (__file__, line_of("# out=")))
    assert spans(mul.reads, x, y)[0] == spans(mul.reads, x, y)[1] and spans(mul.writes, z)[0] == spans(mul.writes, z)[1]
    assert (cat.name, place(cat)) == ("aten.cat.default", (__file__, line_of("# a TensorList")))
    assert spans(cat.reads, x, y)[0] == spans(cat.reads, x, y)[1] and spans(cat.writes, c)[0] == spans(cat.writes, c)[1]
    assert all(op.stream == rec.sid(A) for op in (mm, add, fill, mul, cat))
    assert v.data_ptr() == x.data_ptr() and rec.errors == []


# --- the same trace as the dispatch mode's ---------------------------------------------------------------

def _helper_that_adds(x):
    x.add_(2)  # the innermost user frame; its caller is kept in the stack


def _two_user_frames(x):
    _helper_that_adds(x)


def basic(on, keep):
    x, y, z = torch.zeros(8), torch.arange(8.0), torch.empty(8)
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    keep += [x, y, z, a, b]
    with on(A):
        keep.append(a @ b)
        x[2:4].add_(1)
        v = x.view(2, 4)
        v[1].fill_(3)
        torch.mul(x, y, out=z)
        keep.append(torch.cat([x, y]))
        keep.append(x * 2)
        keep.append(torch.zeros(4))
        keep.append(torch.full((3,), 7.0))
        _two_user_frames(x)
        F.relu(x, inplace=True)  # through a library's frame
    with on(B):
        x[4:].mul_(3)


def composites(on, keep):
    x, w, b = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    keep += [x, w, b]
    with on(A):
        keep.append(F.linear(x, w, b))
        keep.append(torch.matmul(x, w.t()))
        keep.append(x.transpose(0, 1).reshape(-1))  # a copy, though its schema says alias
        keep.append(x.reshape(6, 4))  # a view
        keep.append(x.to(torch.float64))  # a copy (to's schema says alias)
        keep.append(x.transpose(1, 2).contiguous())


def host_values(on, keep):
    x, y = torch.arange(1.0, 5.0), torch.arange(4.0)
    keep += [x, y]
    with on(A):
        s = x.sum()
        keep.append(s)
        s.item()
        torch.equal(x, y)
        keep.append(torch.nonzero(x))
        mask = x > 2
        keep += [mask, x[mask]]
        keep.append(x[torch.tensor([0, 2])])
    with on(B):
        y.zero_()


@contextlib.contextmanager
def trace_callbacks_registered():
    """torch_runtime's event and allocator callbacks in torch's GPU-trace registries, as torch_runtime._activate
    leaves them where CUDA is; `fire(name, *args)` calls a registry's fire_callbacks, as c10 does."""
    from torch.cuda import _gpu_trace

    added = []
    for name, callback, _ in torch_runtime.TRACE_CALLBACKS:
        callbacks = getattr(_gpu_trace, name).callback_list
        if callback not in callbacks:
            callbacks.append(callback)
            added.append((callbacks, callback))
    try:
        yield lambda name, *args: getattr(_gpu_trace, name).fire_callbacks(*args)
    finally:
        for callbacks, callback in added:
            callbacks.remove(callback)


def python_records_between(on, keep, rec):
    """Records the recorder makes in Python between operators, through torch's GPU-trace registries (which the
    native observer takes over while it records): events (a new event, one recorded, waited on and deleted twice,
    the second time made in its C++ drain), a wait, the allocator's blocks allocated and freed (one never seen as a
    tensor; a free inside streamcheck's own work, which the observer cannot defer; a graph tree's warm-up, whose
    blocks go back to the graph's pool)."""
    x, y, w, z = torch.zeros(1024), torch.ones(1024), torch.zeros(256), torch.zeros(64)
    keep += [x, y, w, z]

    def block(t):
        return t.untyped_storage().data_ptr()
    with trace_callbacks_registered() as fire:
        with on(A):
            fire("MemoryAllocationCallbacks", block(x))  # the allocator reports their blocks on A
            fire("MemoryAllocationCallbacks", block(w))
            fire("MemoryAllocationCallbacks", 0xB10C)  # never seen as a tensor
            x.fill_(1)
            for _ in range(2):  # side.wait_stream(A), twice, as torch reports it (a new event each time)
                fire("EventCreationCallbacks", 0xE2)
                fire("EventRecordCallbacks", 0xE2, A)
                x.mul_(3)
                fire("EventWaitCallbacks", 0xE2, B)
                fire("EventDeletionCallbacks", 0xE2)
            fire("MemoryDeallocationCallbacks", 0xB10C)
            with torch_graphs._allocating_to_graph_pool(rec, contextlib.nullcontext()):
                fire("MemoryAllocationCallbacks", block(z))
                z.fill_(3)
                fire("MemoryDeallocationCallbacks", block(z))  # back to the graph's pool: not a free
            x.fill_(1)
            torch_runtime._event_recorded(0xE1, A)  # side.wait_stream(A)
            y.add_(x)
        torch_runtime._event_waited(0xE1, B)
        with on(B):
            keep.append(x.sum())
            w.fill_(2)  # first seen on B: its block is A's all the same
            fire("MemoryDeallocationCallbacks", block(w))  # dropped at once: freed on A
            R.inside(fire, "MemoryDeallocationCallbacks", block(x))
            y.mul_(2)
    assert torch_runtime.state(rec).pending == {}


def allocator_reuse(on, keep, rec):
    """Blocks of torch's pool freed and handed out again at their address (Alloc.reuses): the whole block, then a
    smaller one at its start and another after that (each reusing part of it), through torch's registries."""
    big = torch.zeros(1024)
    head = torch.frombuffer(big.numpy(), dtype=torch.float32, count=16)  # big's first 64 bytes, a storage of its own
    after = torch.frombuffer(big.numpy(), dtype=torch.float32, count=16, offset=64)
    keep += [big, head, after]
    ptr = big.untyped_storage().data_ptr()
    with trace_callbacks_registered() as fire, on(A):
        fire("MemoryAllocationCallbacks", ptr)
        big.fill_(1)
        fire("MemoryDeallocationCallbacks", ptr)
        fire("MemoryAllocationCallbacks", ptr)
        big.add_(1)
        fire("MemoryDeallocationCallbacks", ptr)
        fire("MemoryAllocationCallbacks", ptr)
        head.fill_(2)
        fire("MemoryAllocationCallbacks", ptr + 64)
        after.fill_(3)
        fire("MemoryDeallocationCallbacks", ptr + 64)
        fire("MemoryDeallocationCallbacks", ptr)
        fire("MemoryAllocationCallbacks", ptr)
        big.mul_(2)  # all of it again: the rest of the first block and both small ones
    reuses = [[(r.start, r.stop) for r in op.reuses] for op in rec.trace.ops if isinstance(op, T.Alloc)]
    # the whole block; its head and the next bytes; then all of it again, from each bytes' latest owner
    assert reuses[-4:] == [[(0, 4096)], [(0, 64)], [(64, 128)], [(0, 64), (0, 64), (128, 4096)]], reuses


def custom_operators(on, keep):
    x, y = torch.ones(4), torch.arange(4.0)
    keep += [x, y]
    with on(A):
        custom.scale_(x, 2.0)
        torch.ops.sctest.bump(x)
        keep.append(custom.plus(x, y))
        custom.accumulate(x, y)
    with on(B):
        y.add_(1)


def compiled_code(on, keep):
    """Operators called by torch.compile's code: inside its named regions ("Torch-Compiled Region", "## Call
    CompiledFxGraph ##"), which are RecordFunctions of no operator; a custom operator among them declares its
    unseen work. Compiled before the recording, as a warm program runs it."""
    x, y, out = torch.ones(8, 8), torch.full((8, 8), 2.0), torch.zeros(8, 8)
    keep += [x, y, out]
    compiled = torch.compile(lambda a, b, o: custom.with_unseen_work(torch.mm(a, b), o) + 1, fullgraph=True,
                             backend="aot_eager")
    compiled(x, y, out)
    with on(A):
        out.zero_()  # known to the recording before the operator declares it written
        keep.append(compiled(x, y, out))


PROGRAMS = {
    "basic": (basic, torch.enable_grad),
    "composites-grad": (composites, torch.enable_grad),
    "composites-no_grad": (composites, torch.no_grad),
    "composites-inference_mode": (composites, torch.inference_mode),
    "host-values": (host_values, torch.enable_grad),
    "python-records-between": (python_records_between, torch.enable_grad),
    "allocator-reuse": (allocator_reuse, torch.enable_grad),
    "custom-operators": (custom_operators, torch.enable_grad),
    "compiled-code": (compiled_code, torch.no_grad),
}


def canonical(rec) -> list:
    """The trace with its buffers numbered by first appearance (the CPU allocator places each run's
    tensors elsewhere) and each site as its places (the user's frame, the innermost one, the stack)."""
    buffers: dict = {}

    def buffer(b):
        return buffers.setdefault(b, len(buffers))

    def value(name, v):
        if isinstance(v, T.Range):
            return buffer(v.buffer), v.start, v.stop
        if isinstance(v, tuple):
            return tuple(value(name, x) for x in v)
        if isinstance(v, T.CallSite):
            return v.place, tuple(f.place for f in v.stack)
        if name == "buffer":
            return buffer(v)
        if name == "name" and isinstance(v, str):
            return re.sub(r"#\d+", "#", v)
        return v
    return [(type(op).__name__,) + tuple((f.name, value(f.name, getattr(op, f.name))) for f in dataclasses.fields(op))
            for op in rec.trace.ops]


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_the_drains_trace_is_the_dispatch_modes(monkeypatch, observer, program):
    make, mode = PROGRAMS[program]
    traces, reports = [], []
    for path in ("python", "native"):
        with monkeypatch.context() as patches:
            rec, _, on = harness(patches, path)
            keep: list = []  # every tensor lives on: the CPU allocator gives no address twice
            with mode():
                if make in (python_records_between, allocator_reuse):
                    make(on, keep, rec)
                else:
                    make(on, keep)
            traces.append(canonical(rec))
            reports.append((sorted((r.kind, r.first.name, r.second.name) for r in rec.races), rec.notices, rec.errors))
    python, native_ = traces
    assert len(python) > 5
    assert native_ == python
    assert reports[1] == reports[0]


def test_torchs_event_callbacks_wait_in_the_buffer_while_the_observer_records_and_others_still_run(monkeypatch,
                                                                                                   observer):
    """While the observer records, a registry's fire_callbacks is the observer's: the event callback becomes a
    record of its buffer (nothing reaches the trace until the next drain, then in issue order with the
    operators), the registry's other callbacks still run, and the registries are as they were once it stops."""
    from torch.cuda import _gpu_trace

    rec, _, on = harness(monkeypatch, "native")
    registry = _gpu_trace.EventRecordCallbacks
    others = []
    with trace_callbacks_registered() as fire:
        registry.callback_list.append(lambda *args: others.append(args))  # PyTorch's sanitizer, say
        try:
            before = list(registry.callback_list)
            x = torch.zeros(8)
            with on(A):
                x.add_(1)
                recorded = len(rec._trace.ops)
                fire("EventCreationCallbacks", 0xE7)
                fire("EventRecordCallbacks", 0xE7, A)
                assert torch_runtime._event_recorded not in registry.callback_list
                assert len(rec._trace.ops) == recorded and observer.waiting.value > 0  # deferred
                assert others == [(0xE7, A)]
                x.mul_(2)
            assert registry.callback_list == before and "fire_callbacks" not in vars(registry)
        finally:
            registry.callback_list.pop()
    names = [type(op).__name__ if not isinstance(op, T.Launch) else op.name for op in rec.trace.ops[-4:]]
    assert names == ["aten.add_.Tensor", "EventCreate", "EventRecord", "aten.mul_.Tensor"]
    # its site: the frame that fired it (here the helper's; on a GPU torch's, then the user's)
    assert rec.trace.ops[-2].site.line == line_of("yield lambda name, *args") and rec.errors == []


def test_the_cpp_drain_records_torchs_callbacks_with_no_python_rule(monkeypatch, observer):
    """A block allocated and freed while the observer records: both callbacks wait in its buffer, and its C++
    drain files the block under the stream current at the allocation, records its Alloc where an operator first
    uses it, and records the Free at the frame that freed it, with no Python rule and no register_storage; a free
    inside streamcheck's own work, and a block allocated on a thread the observer does not see, are
    torch_runtime's at once. A wait_stream's events likewise (a new event named
    in the event table by Python, its EventCreate made in C++)."""
    rec, _, on = harness(monkeypatch, "native")
    ruled: list = []
    monkeypatch.setattr(torch_runtime, "TRACE_CALLBACKS", tuple(
        (name, callback, lambda *args, rule=rule, name=name: (ruled.append(name), rule(*args)))
        for name, callback, rule in torch_runtime.TRACE_CALLBACKS))
    registered: list = []
    original = torch_native.NativeRecording._register
    monkeypatch.setattr(torch_native.NativeRecording, "_register",
                        lambda self, *args: (registered.append(args[0]), original(self, *args))[1])
    for name in ("file", "unfile"):  # the allocation table's changes, made by the C++ drain itself
        method = getattr(R.Recorder, name)
        monkeypatch.setattr(R.Recorder, name,
                            lambda self, *args, method=method, name=name: (ruled.append(name), method(self, *args))[1])
    x, y = torch.zeros(16), torch.zeros(16)
    with trace_callbacks_registered() as fire:
        with on(B):
            fire("MemoryAllocationCallbacks", x.untyped_storage().data_ptr())
            assert observer.waiting.value > 0 and torch_runtime.state(rec).pending == {}  # deferred
            x.add_(1)  # first use
            fire("MemoryAllocationCallbacks", y.untyped_storage().data_ptr())
            for name, *args in (("EventCreationCallbacks", 0xE3), ("EventRecordCallbacks", 0xE3, B),
                                ("EventWaitCallbacks", 0xE3, A), ("EventDeletionCallbacks", 0xE3)):
                fire(name, *args)  # A.wait_stream(B), as torch reports it
            y.add_(1)  # first use
            fire("MemoryDeallocationCallbacks", x.untyped_storage().data_ptr())
            R.inside(fire, "MemoryDeallocationCallbacks", y.untyped_storage().data_ptr())
            # x's Free drained first, then y's at once
            assert observer.waiting.value == 0 and [type(op) for op in rec._trace.ops[-2:]] == [T.Free, T.Free]
            # A thread the observer does not see: torch_runtime's callback at once (it names such a thread)
            other = threading.Thread(target=fire, args=("MemoryAllocationCallbacks", 0xB10C))
            other.start()
            other.join()
            assert observer.waiting.value == 0 and 0xB10C in torch_runtime.state(rec).pending
            fire("MemoryAllocationCallbacks", x.untyped_storage().data_ptr())  # x's block handed out again
            x.mul_(2)
    assert ruled == ["unfile"] and registered == []  # y's free alone, made at once by torch_runtime in Python
    events = [(type(op).__name__, op.event) for op in rec.trace.ops if isinstance(op, (T.EventCreate, T.EventRecord,
                                                                                        T.StreamWait))]
    assert [kind for kind, _ in events] == ["EventCreate", "EventRecord", "StreamWait"]
    assert len({event for _, event in events}) == 1  # one event, created, recorded on B, waited on by A
    allocs = {op.buffer: op for op in rec.trace.ops if isinstance(op, T.Alloc)}
    frees = [op for op in rec.trace.ops if isinstance(op, T.Free)]
    assert [allocs[op.buffer].nbytes for op in frees] == [64, 64]
    assert list(allocs.values())[-1].reuses == (T.Range(frees[0].buffer, 0, 64),)
    assert {allocs[op.buffer].stream for op in frees} == {op.stream for op in frees} == {rec.sid(B)}
    assert frees[0].site.line == line_of("yield lambda name, *args") and frees[0].pool == "torch"
    assert [allocs[op.buffer].site.line for op in frees] == [line_of("x.add_(1)  # first use"),
                                                              line_of("y.add_(1)  # first use")]
    assert [gc.is_tracked(op) for op in frees + list(allocs.values())] == [False] * (2 + len(allocs))
    assert rec.errors == []


def capture_between_frees(on, keep, rec):
    """A block freed just before a capture begins (a free), and one allocated and freed inside the capture (back
    to the graph's pool: no free), with torch's callbacks fired through its registries (the native observer
    defers them: the capture's begin and end drain first, so each is turned by the rule of its own time)."""
    x, y = torch.zeros(16), torch.zeros(16)
    keep += [x, y]
    with trace_callbacks_registered() as fire, on(A):
        fire("MemoryAllocationCallbacks", x.untyped_storage().data_ptr())
        x.add_(1)
        fire("MemoryDeallocationCallbacks", x.untyped_storage().data_ptr())
        rec.capture_begin(A, "global", lambda: None)
        fire("MemoryAllocationCallbacks", y.untyped_storage().data_ptr())
        y.add_(1)
        fire("MemoryDeallocationCallbacks", y.untyped_storage().data_ptr())
        rec.capture_end(A, lambda: None)


def test_an_error_in_an_allocator_callback_the_observer_calls_is_said_not_raised(monkeypatch, observer):
    """torch's registries log a callback's error and go on (the allocator called them): so does the observer,
    for torch_runtime's callback it calls itself."""
    rec, _, on = harness(monkeypatch, "native")
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def broken(rec, ptr, stream):
        raise RuntimeError("a bug of streamcheck's")
    monkeypatch.setattr(torch_runtime, "memory_allocated", broken)
    with trace_callbacks_registered() as fire, on(A):
        R.inside(fire, "MemoryAllocationCallbacks", 0xB10C)  # called at once: inside streamcheck's own work
    assert [str(u.exc_value) for u in unraisable] == ["a bug of streamcheck's"]


def test_a_capture_drains_first_so_each_free_follows_the_rule_of_its_time(monkeypatch, observer):
    traces = []
    for path in ("python", "native"):
        with monkeypatch.context() as patches:
            rec, _, on = harness(patches, path)
            keep: list = []
            capture_between_frees(on, keep, rec)
            kinds = [type(op).__name__ for op in rec.trace.ops if not isinstance(op, T.StreamCreate)]
            assert kinds == ["Alloc", "Launch", "Free", "CaptureBegin", "Alloc", "Launch", "CaptureEnd"], path
            traces.append(canonical(rec))
    assert traces[1] == traces[0]


def test_both_paths_see_the_operators_a_composite_calls_without_autograd(monkeypatch, observer):
    """Under inference_mode a dispatch mode sees `to` and `reshape` whole, and their schemas say
    "alias": the copy they make would go unrecorded. Both paths record the copy."""
    for path in ("python", "native"):
        with monkeypatch.context() as patches:
            rec, _, on = harness(patches, path)
            x = torch.randn(2, 3)
            with torch.inference_mode(), on(A):
                y = x.to(torch.float64)
                z = x.t().reshape(-1)
            assert [op.name for op in launches(rec)] == ["aten._to_copy.default", "aten.clone.default",
                                                         "aten._unsafe_view.default"], path
            assert y.dtype == torch.float64 and z.shape == (6,)


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_launch_the_checker_refuses_is_kept_and_said_on_both_paths(monkeypatch, observer, path):
    """Recorder.record's rule, which the C++ drain follows for the operators it turns itself: the
    record stays in the trace, the checker's error is said, and the refusal is listed with its index."""
    rec, _, on = harness(monkeypatch, path)
    x = torch.zeros(8)
    with on(A):
        x.add_(1)  # x registered: its next operators are the C++ drain's own (all known)
    rec.flush()
    feed = rec._feed

    def refuse_multiplications(op):
        if isinstance(op, T.Launch) and op.name.startswith("aten.mul_"):
            raise R.TraceError(f"refused {op.name}")
        feed(op)
    monkeypatch.setattr(rec, "_feed", refuse_multiplications)
    with on(B):
        x.mul_(2)
        x.sub_(1)
    ops = rec.trace.ops
    mul = next(i for i, op in enumerate(ops) if isinstance(op, T.Launch) and op.name.startswith("aten.mul_"))
    assert ops[mul + 1].name.startswith("aten.sub_")
    assert rec.errors == [f"refused {ops[mul].name}"]
    assert [(index, op) for index, op, _ in rec.refused] == [(mul, ops[mul])]


def test_the_native_drain_turns_ordinary_operators_in_cpp_and_the_rest_in_python(monkeypatch, observer):
    """The C++ drain hands Python a special operator whole, and a storage first seen to register (its
    Alloc record at the operator's site, before the operator's Launch, as on the Python path); and
    every record while a probe or an edit plan watches the records."""
    rec, _, on = harness(monkeypatch, "native")
    x, y = torch.zeros(8), torch.ones(8)
    slow: list = []
    original = torch_native.NativeRecording._record_one
    monkeypatch.setattr(torch_native.NativeRecording, "_record_one",
                        lambda self, record: (slow.append(self.names[record[0]]), original(self, record)))
    with on(A):
        x.add_(y)  # both storages first seen  # native-drain-add
        x.mul_(y)  # all known
        x.sum().item()  # the sum: a fresh output first seen; item: special
    ops = rec.trace.ops
    add = next(i for i, op in enumerate(ops) if isinstance(op, T.Launch))
    allocs = [op for op in ops[:add] if isinstance(op, T.Alloc)]
    assert [op.nbytes for op in allocs[-2:]] == [32, 32]  # y (read), then x (written): _launch's order
    assert {op.site.line for op in allocs[-2:] + [ops[add]]} == {line_of("# native-drain-add")}
    assert [op.name for op in ops if isinstance(op, T.Launch)][:3] == ["aten.add_.Tensor", "aten.mul_.Tensor",
                                                                      "aten.sum.default"]
    assert slow == ["aten._local_scalar_dense.default"]
    # The Launches made in C++ are off the cyclic GC's lists too, as Recorder.record's are (core.fast.untrack).
    assert [op.name for op in ops if isinstance(op, T.Launch) and gc.is_tracked(op)] == []

    class Probe:  # sees each record as Recorder.record issues it
        def issued(self, rec, op):
            probed.append(op.name)
    probed: list = []
    monkeypatch.setattr(rec, "probe", Probe())
    slow.clear()
    with on(A):
        x.mul_(y)
    assert probed == ["aten.mul_.Tensor"]  # through Recorder.record, which tells the probe


def test_a_new_resolver_applies_to_the_next_operator_after_a_drain_with_nothing_to_take(monkeypatch, observer):
    """A drain with no record waiting returns at once, unless the recorder's resolver or the site
    settings changed (a library imported, Recorder.refresh_library_dirs): then the observer's stacks
    are forgotten, so the next operator's frames are classified by the new resolver."""
    rec, _, on = harness(monkeypatch, "native")
    x = torch.zeros(4)
    with on(A):
        _helper_that_adds(x)
        rec.flush()
        # this test file now a library's: its frames are no longer the user's
        rec.site = T.SiteResolver(rec.site.internal, libraries=(os.path.dirname(os.path.abspath(__file__)) + os.sep,))
        rec.flush()  # nothing waiting
        _helper_that_adds(x)
    first, second = [op.site for op in rec.trace.ops if isinstance(op, T.Launch)][-2:]
    assert first.line == line_of("# the innermost user frame")
    assert [f.function for f in first.stack] == ["_helper_that_adds", sys._getframe().f_code.co_name]
    # the frames of this file are a library's now: the walk goes on past them, into pytest's
    assert len(second.stack) > 2 and "pytest" in second.stack[2].file


# --- starting and stopping ---------------------------------------------------------------------------------

def test_stopping_leaves_no_callback_behind(monkeypatch, observer):
    assert not observer.thread_has_callbacks()
    rec, _, on = harness(monkeypatch, "native")
    x = torch.zeros(4)
    with on(A):
        assert observer.thread_has_callbacks()
        x.add_(1)
    assert not observer.thread_has_callbacks()
    assert rec.pending is None and gpu.native_pause is None
    before = len(rec.trace)
    x.add_(1)
    x.mul_(2)
    assert len(rec.trace) == before and observer.take() == []  # nothing observed any more


def test_streamchecks_own_work_is_never_recorded(monkeypatch, observer):
    rec, _, on = harness(monkeypatch, "native")
    x = torch.zeros(4)
    with on(A):
        R.inside(x.add_, 1)  # inside a recorded library call: part of it
        with gpu.suppressed():
            x.mul_(2)  # streamcheck's own work
        x.sub_(1)
    assert [op.name for op in launches(rec)] == ["aten.sub_.Tensor"]


def test_a_thread_is_observed_inside_its_context_only(monkeypatch, observer):
    rec, _, on = harness(monkeypatch, "native")
    x, y = torch.zeros(4), torch.zeros(4)

    def work(tensor, observed):
        if observed:
            with torch_native.ObservedThread(observer):
                tensor.add_(1)
        else:
            tensor.add_(1)
    with on(A):
        for tensor, observed in ((x, True), (y, False)):
            thread = threading.Thread(target=work, args=(tensor, observed))
            thread.start()
            thread.join()
    (op,) = launches(rec)
    assert op.writes == rec.ranges([x]) and op.thread != 0  # the thread's own id, not the main thread's
    assert [type(o).__name__ for o in rec.trace.ops if o.thread == op.thread][:1] == ["ThreadStart"]


def _install_in_a_fresh_process(tmp_path, **env_changes) -> dict:
    """What installing the torch adapters chose in a fresh process: its notices and the dispatch modes."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent("""
        import json, torch
        from streamcheck.record import recorder as R
        from streamcheck.record.adapters import install, torch_runtime
        from tests.streamcheck.record.adapters.stand_in import stand_in_gpu
        from streamcheck.core import trace as T

        rec = R.Recorder(stand_in_gpu())
        rec.state["torch"] = torch_runtime.TorchState()  # as torch_runtime.install does where CUDA is
        patcher = install(rec, {"torch"})
        modes = torch.utils._python_dispatch._get_current_dispatch_mode_stack()
        patcher.restore()
        print(json.dumps({"notices": rec.notices, "modes": [type(m).__name__ for m in modes]}))
    """))
    env = dict(os.environ, PYTHONPATH=ROOT, STREAMCHECK_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(native.SWITCH, None)
    env.update(env_changes)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_compiler_the_python_path_records_and_says_so_once(tmp_path):
    """Asked for the observer, no C++ compiler: the dispatch mode records the operators, and one notice says why."""
    result = _install_in_a_fresh_process(tmp_path, CXX=str(tmp_path / "no-such-compiler"), **{native.SWITCH: "1"})
    # (torch_runtime's own notice says this CPU build has no CUDA device)
    (notice,) = [n for n in result["notices"] if "native observer" in n]
    assert notice.startswith("torch operators are recorded through Python") and "\n" not in notice
    assert "no-such-compiler could not run" in notice
    assert result["modes"] == ["RecordingMode"]


def test_the_observer_is_opt_in_until_the_gpu_suite_has_run_through_it(tmp_path, observer):
    """Not asked for (the switch unset), the dispatch mode records, with no notice, though the observer builds."""
    result = _install_in_a_fresh_process(tmp_path)
    assert result["modes"] == ["RecordingMode"]
    assert not [n for n in result["notices"] if "native observer" in n]
    # Asked for, it is tried: it records (no mode), or says in one line why it could not here.
    asked = _install_in_a_fresh_process(tmp_path, **{native.SWITCH: "1"})
    assert asked["modes"] == [] or [n for n in asked["notices"] if "native observer" in n]


def test_the_fake_tensors_of_compile_tracing_are_not_recorded(monkeypatch, observer):
    """torch.compile traces with fake tensors (a device, no bytes: meta storage) under a FakeTensorMode,
    while the dispatch mode of the Python path is off (ignore_compile_internals): their operators are
    nobody's accesses."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec, _, on = harness(monkeypatch, "native")
    with on(A):
        with FakeTensorMode():
            x = torch.zeros(8)
            x.mul_(2)
        real = torch.ones(4)
        real.add_(1)
    assert [op.name for op in launches(rec)] == ["aten.ones.default", "aten.add_.Tensor"]


def test_what_torch_runs_with_the_dispatch_modes_off_is_not_recorded(monkeypatch, observer):
    """Dynamo compiles under torch's _disable_current_modes (Inductor's autotuning clones inputs and
    runs kernels there): the dispatch mode sees none of it, nor does the observer."""
    from torch.utils import _python_dispatch

    from streamcheck.record.adapters.patching import Patcher

    rec, _, on = harness(monkeypatch, "native")
    original = _python_dispatch._disable_current_modes
    patcher = Patcher(rec.unpatched)
    torch_native._pause_while_modes_are_off(observer, patcher)
    x = torch.zeros(4)
    try:
        with on(A):
            with _python_dispatch._disable_current_modes():
                x.mul_(2)  # torch's own work
            x.add_(1)
    finally:
        patcher.restore()
    assert [op.name for op in launches(rec)] == ["aten.add_.Tensor"]
    assert _python_dispatch._disable_current_modes is original and rec.unpatched == []
