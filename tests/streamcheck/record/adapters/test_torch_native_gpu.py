"""The native operator observer on a real GPU (CUDA torch): it builds and loads against that torch,
records the same trace as the dispatch mode for a small two-stream program, and `streamcheck run`
reports the same races through both paths (STREAMCHECK_NATIVE_RECORD=1 and =0) for racy programs
and none for their fixed twins: a missing wait written inline, and programs of tests/gpu_programs
(allocator reuse, pinned host memory, host copies, waits on the wrong stream).

    pytest -m gpu tests/streamcheck/record/adapters/test_torch_native_gpu.py
"""
from __future__ import annotations

import dataclasses
import re
import textwrap

import pytest

from streamcheck.record import native

from .test_torch_programs_gpu import PROGRAMS_DIR, assert_ran_cleanly, missing_gpu, streamcheck_run

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def gpu():
    reason = missing_gpu()
    if reason:
        pytest.skip(reason)


MISSING_WAIT = """
import torch

x = torch.zeros(1 << 20, device="cuda")
side = torch.cuda.Stream()
torch.cuda.synchronize()
x.fill_(1.0)  # the producer, on the default stream
{wait}with torch.cuda.stream(side):
    y = x * 2.0  # the consumer, on the side stream
torch.cuda.current_stream().wait_stream(side)
print("RESULT", float(y.sum()))
"""

PROGRAMS = ["work_after_wait_stream", "wait_on_default_stream", "alloc_reuse_d2h", "pinned_rewritten_by_host",
            "setitem_lengths_unwaited", "kv_swap_before_write"]


def races_of(program, tmp_path, path: str) -> list:
    """The races `streamcheck run` reports for `program` through `path` ("native" or "python"): kind,
    and each access's operation and site."""
    run = streamcheck_run(program, report=tmp_path / f"{program.stem}-{path}.json",
                          env={native.SWITCH: "1" if path == "native" else "0"})
    assert_ran_cleanly(run, f"{program.name} through the {path} path")
    assert "recorded through Python" not in run.stderr, run.describe()  # native=1 must really be native
    return sorted((r["kind"], r["first"]["name"], r["first"]["site"], r["second"]["name"], r["second"]["site"])
                  for r in run.races)


def test_the_observer_builds_against_this_torch():
    import torch  # noqa: F401 (the library links to its libraries)

    assert native.load() is not None, native.unavailable_reason()


@pytest.mark.parametrize("fixed", [False, True], ids=["missing-wait", "fixed"])
def test_a_missing_wait_is_reported_the_same_through_both_paths(tmp_path, fixed):
    program = tmp_path / ("fixed_wait.py" if fixed else "race_wait.py")
    wait = "side.wait_stream(torch.cuda.current_stream())\n" if fixed else ""
    program.write_text(textwrap.dedent(MISSING_WAIT.format(wait=wait)))
    through_native, through_python = (races_of(program, tmp_path, path) for path in ("native", "python"))
    assert through_native == through_python
    if fixed:
        assert through_native == []
    else:
        assert [(kind, first, second) for kind, first, _, second, _ in through_native] == [
            ("RAW", "aten.fill_.Scalar", "aten.mul.Tensor")]


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("prefix", ["race_", "fixed_"])
def test_a_bug_program_is_reported_the_same_through_both_paths(tmp_path, name, prefix):
    program = PROGRAMS_DIR / f"{prefix}{name}.py"
    through_native, through_python = (races_of(program, tmp_path, path) for path in ("native", "python"))
    assert through_native == through_python
    assert bool(through_native) == (prefix == "race_")


def test_the_same_trace_in_process(monkeypatch):
    """A two-stream program recorded by instrument() through each path: the same operations, streams,
    bytes, lines, and the caching allocator's blocks allocated and freed (its addresses aside: buffers
    numbered by first use)."""
    import torch

    from streamcheck.core import trace as T
    from streamcheck.record import instrument

    def program():
        a = torch.randn(256, 256, device="cuda")
        b = torch.empty(256, 256, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mm(a, a, out=b)
            c = torch.nn.functional.relu(b + 1)
        torch.cuda.current_stream().wait_stream(side)
        d = torch.cat([c, a]).sum(dim=0)
        return float(d[0]), d.cpu()

    def record(path):
        monkeypatch.setenv(native.SWITCH, "1" if path == "native" else "0")
        session = instrument.start()
        try:
            program()
        finally:
            instrument.stop()
        buffers: dict = {}

        def value(name, v):
            if isinstance(v, T.Range):
                return buffers.setdefault(v.buffer, len(buffers)), v.start, v.stop
            if isinstance(v, tuple):
                return tuple(value(name, x) for x in v)
            if isinstance(v, T.CallSite):
                return v.place
            if name == "buffer":
                return buffers.setdefault(v, len(buffers))
            if name == "name" and isinstance(v, str):
                return re.sub(r"#\d+", "#", v)
            return v
        # The allocator's blocks too: allocated, first used and freed through torch's callbacks (which the native
        # observer takes while it records).
        kept = (T.Launch, T.Copy, T.StreamSync, T.StreamWait, T.EventRecord, T.DeviceSync, T.Alloc, T.Free)
        return [(type(op).__name__,) + tuple(value(f.name, getattr(op, f.name)) for f in dataclasses.fields(op))
                for op in session.trace.ops if type(op) in kept], session.errors

    record("python")  # warm: the allocator's pool, cuBLAS, the library build
    through_python, through_native = record("python"), record("native")
    assert through_native == through_python and len(through_native[0]) > 8
    assert {"Alloc", "Free"} <= {op[0] for op in through_native[0]}
