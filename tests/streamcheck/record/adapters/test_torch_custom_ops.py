"""Custom operators (torch.library) in the torch adapter, on the CPU stand-in harness of
test_torch_ops.py: the schema's written arguments (`mutates_args`, `"unknown"`, `Tensor(a!)`),
every tensor argument written for an operator that declares no write and returns no tensor,
with its notice, and the race only that rule reveals, next to its declared twin."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamcheck.record import recorder as R  # noqa: E402
from streamcheck.record.adapters import torch_runtime  # noqa: E402
from streamcheck.record.instrument import declare_access  # noqa: E402

from .test_torch_ops import A, B, launches, run  # noqa: E402,F401  (run: the fixture)

NS = "sctest"


@torch.library.custom_op(f"{NS}::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@torch.library.custom_op(f"{NS}::accumulate", mutates_args="unknown")
def accumulate(x: torch.Tensor, y: torch.Tensor) -> None:
    x.add_(y)


@torch.library.custom_op(f"{NS}::plus", mutates_args=())
def plus(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@torch.library.custom_op(f"{NS}::with_unseen_work", mutates_args=())
def with_unseen_work(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """flashnorm's norm_projection in small: while a recording runs the operator as one call
    (recorder.depth()), it declares the work the recording cannot see inside it, on stream B."""
    doubled = x * 2  # a torch operator inside: part of this one, not recorded again
    if R.depth():
        declare_access(reads=(x,), writes=(out,), stream=B, name="unseen kernel")
    return doubled


@with_unseen_work.register_fake
def _with_unseen_work_fake(x, out):  # so that torch.compile can trace a call to it (test_torch_native)
    return torch.empty_like(x)


_lib = torch.library.Library(NS, "FRAGMENT")
_lib.define("bump(Tensor x) -> ()")
_lib.define("add_into(Tensor(a!) out, Tensor src) -> ()")


def _bump(x):
    x.add_(1.0)


def _add_into(out, src):
    out.add_(src)


_lib.impl("bump", _bump, "CPU")
_lib.impl("add_into", _add_into, "CPU")


def one_launch(rec, name):
    (op,) = [op for op in launches(rec) if op.name == name]
    return op


def buffers(rec, ranges, *tensors) -> bool:
    """Whether `ranges` are exactly the bytes of `tensors`."""
    def key(r):
        return r.buffer, r.start, r.stop
    return sorted(map(key, ranges)) == sorted(map(key, rec.ranges(tensors)))


def test_mutates_args_are_written_and_the_rest_read(run):
    rec, _, on = run
    x = torch.ones(4)
    with on(A):
        scale_(x, 3.0)
    op = one_launch(rec, f"{NS}.scale_.default")
    assert buffers(rec, op.writes, x) and op.reads == () and op.stream == rec.sid(A)
    assert x.tolist() == [3.0] * 4
    assert rec.notices == []


def test_mutates_args_unknown_writes_every_tensor_argument(run):
    rec, _, on = run
    x, y = torch.ones(4), torch.full((4,), 2.0)
    with on(A):
        accumulate(x, y)
    op = one_launch(rec, f"{NS}.accumulate.default")
    assert buffers(rec, op.writes, x, y) and op.reads == ()
    assert x.tolist() == [3.0] * 4
    assert rec.notices == []  # "unknown" is a declaration: nothing assumed


def test_a_library_schema_with_a_write_annotation_writes_that_argument_only(run):
    rec, _, on = run
    out, src = torch.zeros(4), torch.ones(4)
    with on(A):
        torch.ops.sctest.add_into(out, src)
    op = one_launch(rec, f"{NS}.add_into.default")
    assert buffers(rec, op.writes, out) and buffers(rec, op.reads, src)
    assert out.tolist() == [1.0] * 4
    assert rec.notices == []


def test_an_operator_declaring_no_write_and_returning_nothing_writes_every_tensor_argument(run):
    rec, _, on = run
    x = torch.zeros(4)
    with on(A):
        torch.ops.sctest.bump(x)
        torch.ops.sctest.bump(x)
    ops = [op for op in launches(rec) if op.name == f"{NS}.bump.default"]
    assert len(ops) == 2 and all(buffers(rec, op.writes, x) and op.reads == () for op in ops)
    assert x.tolist() == [2.0] * 4
    (notice,) = rec.notices  # once per recording, not per call
    assert f"`{NS}.bump.default`" in notice and "every tensor argument is assumed written" in notice


def test_an_honest_operator_without_mutations_reads_its_arguments_and_says_nothing(run):
    rec, _, on = run
    x, y = torch.zeros(4), torch.ones(4)
    versions = (x._version, y._version)
    with on(A):
        z = plus(x, y)
    op = one_launch(rec, f"{NS}.plus.default")
    assert buffers(rec, op.reads, x, y) and buffers(rec, op.writes, z)
    assert rec.notices == [] and (x._version, y._version) == versions


def test_an_aten_operator_is_never_assumed_to_write(run):
    rec, _, on = run
    x = torch.zeros(4)
    with on(A):
        x.sum()
    (op,) = launches(rec)
    assert op.name == "aten.sum.default" and buffers(rec, op.reads, x)
    assert rec.notices == []


def test_a_custom_operator_runs_as_one_call_that_declares_what_it_does_unseen(run):
    rec, _, on = run
    with on(A):
        x, out = torch.ones(4), torch.zeros(4)
        doubled = with_unseen_work(x, out)
    *_, declared, op = launches(rec)
    assert (declared.name, declared.stream) == ("unseen kernel", rec.sid(B))
    assert buffers(rec, declared.reads, x) and buffers(rec, declared.writes, out)
    assert (op.name, op.stream) == (f"{NS}.with_unseen_work.default", rec.sid(A))  # not aten.mul inside it
    assert buffers(rec, op.reads, x, out) and buffers(rec, op.writes, doubled)
    assert not R.depth()  # out of the operator, the program's calls are recorded again


# --- races only the rules reveal ------------------------------------------------------------

def _written_on_a_read_on_b(run, write):
    rec, _, on = run
    x, y = torch.zeros(1024), torch.ones(1024)
    with on(A):
        write(x, y)
    with on(B):
        x.sum()  # no wait for stream A
    return rec


def test_a_side_stream_write_by_an_operator_that_returns_nothing_races_with_a_read(run):
    rec = _written_on_a_read_on_b(run, lambda x, y: torch.ops.sctest.bump(x))
    (race,) = rec.races
    assert (race.kind, race.first.name, race.second.name) == ("RAW", f"{NS}.bump.default", "aten.sum.default")


def test_the_same_write_declared_and_waited_for_is_clean(run):
    rec, _, on = run
    x = torch.zeros(1024)
    with on(A):
        scale_(x, 2.0)
    torch_runtime._event_recorded(0xE1, A)  # B.wait_stream(A), as torch reports it: record, then wait
    torch_runtime._event_waited(0xE1, B)
    with on(B):
        x.sum()
    assert rec.races == []
    assert buffers(rec, one_launch(rec, f"{NS}.scale_.default").writes, x)


def test_the_same_read_on_b_after_an_honest_operator_is_no_race(run):
    rec = _written_on_a_read_on_b(run, plus)  # plus only reads x: two reads do not race
    assert rec.races == []
