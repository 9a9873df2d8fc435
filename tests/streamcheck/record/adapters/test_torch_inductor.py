"""torch.compile's kernels (streamcheck/record/adapters/torch_inductor.py) on the CPU, with a fake
CachingAutotuner: a launch is recorded on the raw stream Inductor's wrapper passes, with the
arguments Inductor says it mutates written even where the source only loads from them, no
notice for those, the first launch noted as an implicit synchronization, benchmark runs passed
through, and a race between two compiled kernels on two streams. Also Patcher.after_import,
which patches Inductor's runtime only once the program imports it. The real Inductor runs in
tests/streamcheck/record/adapters/test_compiled_programs_gpu.py."""
from __future__ import annotations

import sys

import pytest

from streamcheck.record import recorder as R
from streamcheck.record.adapters import torch_inductor
from streamcheck.record.adapters.patching import Patcher
from streamcheck.core import trace as T
from tests.streamcheck.record.adapters.test_triton_launch import STREAM_A, STREAM_B, FakeJIT, GradGpu, Tensor, ops, tl


@FakeJIT
def triton_poi_fused_add_copy__0(in_ptr0, out_ptr0, out_ptr1, xnumel, XBLOCK: tl.constexpr):
    # As Inductor writes `x.add_(1)` with x an input: it loads x as in_ptr0 and stores it back
    # through out_ptr1, the same tensor; mutated_arg_names names both.
    xoffset = tl.program_id(0) * XBLOCK
    x0 = xoffset + tl.arange(0, XBLOCK)[:]
    tmp0 = tl.load(in_ptr0 + (x0), None)
    tl.store(out_ptr0 + (x0), tmp0 + 1.0, None)
    tl.store(out_ptr1 + (x0), tmp0 + 1.0, None)


@FakeJIT
def triton_poi_fused_mul_1(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    x0 = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
    tl.store(out_ptr0 + (x0), tl.load(in_ptr0 + (x0), None) * 3.0, None)


class FakeAutotuner:
    """Inductor's CachingAutotuner as the adapter sees it: `fn` (the generated JITFunction),
    `mutated_arg_names`, `launchers` (none until the first run compiles and autotunes), and
    `run(*args, stream, benchmark_run=False)`."""

    def __init__(self, fn, mutated_arg_names=(), custom_kernel=False):
        self.fn, self.mutated_arg_names, self.custom_kernel = fn, list(mutated_arg_names), custom_kernel
        self.reset_to_zero_arg_names = []
        self.launchers = []
        self.launched = []  # (stream, args, benchmark_run)

    def run(self, *args, stream, benchmark_run=False, **kwargs):
        self.launchers = ["the chosen config"]
        self.launched.append((stream, args, benchmark_run))
        return None


@pytest.fixture
def compiled(monkeypatch):
    """FakeAutotuner.run wrapped as a recording wraps CachingAutotuner.run."""
    monkeypatch.setattr(FakeAutotuner, "run", torch_inductor._run(FakeAutotuner.run))
    for kernel in (triton_poi_fused_add_copy__0, triton_poi_fused_mul_1):
        kernel.__dict__.pop("_streamcheck_plan", None)


@pytest.fixture
def rec(monkeypatch):
    recording = R.Recorder(GradGpu())
    monkeypatch.setattr(R, "current", recording)
    monkeypatch.setattr(torch_inductor, "_register", lambda rec, tensors: None)  # no torch blocks here
    return recording


def test_a_compiled_kernel_is_recorded_on_the_wrappers_stream_with_inductors_writes(compiled, rec):
    rec.alloc(0x1000, 512, stream=None)
    x, buf = Tensor(0x1000, 256), Tensor(0x1100, 256)
    kernel = FakeAutotuner(triton_poi_fused_add_copy__0, mutated_arg_names=["in_ptr0", "out_ptr1"])
    kernel.run(x, buf, x, 64, stream=STREAM_B)
    (launch,) = ops(rec, T.Launch)
    assert launch.name == "triton_poi_fused_add_copy__0" and launch.stream == rec.sid(STREAM_B)
    assert launch.reads == () and sorted((r.start, r.stop) for r in launch.writes) == [(0, 256), (256, 512)]
    assert launch.site.file == __file__
    assert kernel.launched == [(STREAM_B, (x, buf, x, 64), False)]  # passed on untouched
    assert rec.notices == [] and rec.errors == []  # Inductor said in_ptr0 is written: nothing assumed
    (implicit,) = ops(rec, T.ImplicitSync)
    assert "first launch" in implicit.reason and "triton_poi_fused_add_copy__0" in implicit.reason
    kernel.run(x, buf, x, 64, stream=STREAM_B)
    assert len(ops(rec, T.ImplicitSync)) == 1  # compiled and autotuned once


def test_a_kernel_loaded_from_inductors_cache_without_its_function_is_planned_by_its_names(compiled, rec):
    """A kernel compiled in a worker or loaded from the cache keeps `src` and `arg_names` but no
    Python function: its outputs are the parameters Inductor names out_ptr*/in_out_ptr*."""
    rec.alloc(0x1000, 768, stream=None)
    a, b, c = Tensor(0x1000, 256), Tensor(0x1100, 256), Tensor(0x1200, 256)
    jit = FakeJIT(triton_poi_fused_mul_1.fn)
    jit.arg_names = ["in_ptr0", "in_out_ptr0", "out_ptr1", "xnumel"]
    jit.fn = None
    FakeAutotuner(jit).run(a, b, c, 64, stream=STREAM_A)
    (launch,) = ops(rec, T.Launch)
    assert [(r.start, r.stop) for r in launch.reads] == [(0, 256)]
    assert sorted((r.start, r.stop) for r in launch.writes) == [(256, 512), (512, 768)]
    assert rec.errors == [] and rec.notices == []


def test_a_users_triton_kernel_inside_compiled_code_is_analysed_with_inductors_mutations(compiled, rec):
    rec.alloc(0x1000, 768, stream=None)
    x, out, scratch = Tensor(0x1000, 256), Tensor(0x1100, 256), Tensor(0x1200, 256)
    user = FakeAutotuner(triton_poi_fused_mul_1, mutated_arg_names=["out_ptr0"], custom_kernel=True)
    user.run(x, out, 64, stream=STREAM_A)
    (launch,) = ops(rec, T.Launch)
    assert [(r.start, r.stop) for r in launch.reads] == [(0, 256)]  # the source only loads in_ptr0
    assert [(r.start, r.stop) for r in launch.writes] == [(256, 512)]
    assert rec.errors == [] and rec.notices == []


def test_a_benchmark_run_while_inductor_compiles_is_not_the_programs_work(compiled, rec):
    rec.alloc(0x1000, 512, stream=None)
    kernel = FakeAutotuner(triton_poi_fused_mul_1)
    kernel.run(Tensor(0x1000, 256), Tensor(0x1100, 256), 64, stream=STREAM_A, benchmark_run=True)
    assert ops(rec, T.Launch) == [] and kernel.launched[0][2] is True


def test_two_compiled_kernels_on_two_streams_race_on_the_buffer_between_them(compiled, rec):
    """A compiled producer on stream A, a compiled consumer called under torch.cuda.stream(B)
    without a wait: RAW on the produced buffer."""
    rec.alloc(0x1000, 768, stream=None)
    x, y, out = Tensor(0x1000, 256), Tensor(0x1100, 256), Tensor(0x1200, 256)
    FakeAutotuner(triton_poi_fused_mul_1).run(x, y, 64, stream=STREAM_A)
    FakeAutotuner(triton_poi_fused_mul_1).run(y, out, 64, stream=STREAM_B)
    (race,) = rec.races
    assert race.kind == "RAW" and (race.start, race.stop) == (256, 512)
    assert race.first.name == race.second.name == "triton_poi_fused_mul_1"


def test_after_import_patches_a_module_only_once_the_program_imports_it(tmp_path, monkeypatch):
    (tmp_path / "sc_lazy_runtime.py").write_text("class Autotuner:\n    def run(self):\n        return 1\n")
    (tmp_path / "sc_lazy_broken.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("sc_lazy_runtime", "sc_lazy_broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    unpatched, seen = [], []
    patcher = Patcher(unpatched)
    patcher.after_import("sc_lazy_runtime", seen.append)
    patcher.after_import("sc_lazy_broken", lambda module: 1 / 0)
    assert seen == [] and "sc_lazy_runtime" not in sys.modules  # never imported by us
    import sc_lazy_broken
    import sc_lazy_runtime

    assert seen == [sc_lazy_runtime] and sc_lazy_broken.VALUE == 2  # a failing callback breaks no import
    assert unpatched == ["sc_lazy_broken: ZeroDivisionError: division by zero"]
    patcher.after_import("sc_lazy_runtime", seen.append)  # imported already: at once
    assert seen == [sc_lazy_runtime, sc_lazy_runtime]
    patcher.after_import("sc_lazy_never", seen.append)
    patcher.restore()
    assert not any(type(f).__name__ == "ImportWatcher" for f in sys.meta_path)  # the finders are gone


def test_a_torch_whose_modes_cannot_step_aside_says_compiled_code_runs_eagerly(rec, monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    rec.gpu.torch = torch
    torch_inductor._eager_fallback(rec)
    assert rec.notices == []  # this torch has ignore_compile_internals
    monkeypatch.delattr(TorchDispatchMode, "ignore_compile_internals")
    torch_inductor._eager_fallback(rec)
    (notice,) = rec.notices
    assert "falls back to eager" in notice and torch.__version__ in notice
