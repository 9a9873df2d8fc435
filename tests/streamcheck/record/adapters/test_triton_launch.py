"""The Triton launch adapter (streamcheck/record/adapters/triton_launch.py) on the CPU, with a fake
triton module: launches recorded on the stream Triton's driver names, reads and writes from the
kernel's source as byte ranges, the notice for arguments assumed written, declare_kernel, and
what passes through unrecorded. The tests at the end use the real triton (skipped without it)
for what the fake cannot show: the real JITFunction, autotune and heuristics."""
from __future__ import annotations

import inspect
import sys
import textwrap
import types

import pytest

from streamcheck.record import kernel_access
from streamcheck.record import recorder as R
from streamcheck.record.adapters import triton_launch
from streamcheck.record.adapters.patching import Patcher
from streamcheck.core import trace as T
from streamcheck.record.triton_access import analyze
from tests.streamcheck.record.test_recorder import FakeArray, FakeGpu, FakeStream

tl = None  # the kernels below are parsed, never run: `tl` is only a name in them

STREAM_A, STREAM_B = 0xA0, 0xB0


class FakeDriver:
    """triton.runtime.driver.active: the device and the stream a launch goes to."""

    def __init__(self):
        self.stream = STREAM_A
        self.fail = False

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        if self.fail:
            raise RuntimeError("0 active drivers")
        return self.stream


class FakeDriverConfig:
    def __init__(self):
        self.active = FakeDriver()


DRIVER = FakeDriverConfig()


class FakeJIT:
    """triton.runtime.jit.JITFunction as the adapter sees it: `fn`, `src` (from the `def`),
    `arg_names`, the per-device kernel caches, and `run`, which launches on the driver's stream."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        src = textwrap.dedent(inspect.getsource(fn))
        self.src = src[src.index("def "):]
        self.arg_names = list(inspect.signature(fn).parameters)
        self.device_caches = {0: ({},)}
        self.launched = []  # (stream, args, kwargs) per launch that ran

    def run(self, *args, grid, warmup, **kwargs):
        key = tuple(type(a).__name__ for a in args)
        self.device_caches[0][0].setdefault(key, "compiled")
        if not warmup:
            driver = DRIVER.active
            self.launched.append((driver.get_current_stream(driver.get_current_device()), args, kwargs))
        return "compiled kernel"

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)


class FakeAutotuner:
    """triton.autotune / triton.heuristics: its run ends in the JITFunction's run."""

    def __init__(self, fn, **meta):
        self.fn, self.meta = fn, meta

    def run(self, *args, **kwargs):
        return self.fn.run(*args, **kwargs, **self.meta)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)


class Tensor(FakeArray):
    """A device tensor; `requires_grad` ones refuse to name their bytes, as torch's do."""

    def __init__(self, ptr, nbytes, requires_grad=False):
        super().__init__(ptr, nbytes)
        self.requires_grad = requires_grad

    def detach(self):
        return Tensor(self.ptr, self.nbytes)


class GradGpu(FakeGpu):
    def is_array(self, obj):
        if getattr(obj, "requires_grad", False):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")
        return super().is_array(obj)


@FakeJIT
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(output_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
             mask=mask)


@FakeJIT
def _store_block(ptr, offs, value):
    tl.store(ptr + offs, value)


@FakeJIT
def scale_kernel(x_ptr, out_ptr, scale, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    _store_block(out_ptr, offs, tl.load(x_ptr + offs) * scale)


@FakeJIT
def apply_kernel(x_ptr, out_ptr, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    FN(x_ptr + offs, out_ptr + offs)


@FakeJIT
def pair_kernel(ptrs, scratch, n):
    tl.store(ptrs[1], tl.load(ptrs[0]) + n)


@pytest.fixture
def triton(monkeypatch):
    """The fake triton in sys.modules, its JITFunction.run patched as a recording patches it."""
    pkg, runtime, jit = (types.ModuleType(n) for n in ("triton", "triton.runtime", "triton.runtime.jit"))
    jit.JITFunction = FakeJIT
    runtime.jit, runtime.driver, pkg.runtime = jit, DRIVER, runtime
    for module in (pkg, runtime, jit):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    DRIVER.active = FakeDriver()
    kernels = (add_kernel, scale_kernel, apply_kernel, pair_kernel)
    for kernel in kernels:  # fresh: no plan, nothing compiled or launched yet
        kernel.__dict__.pop("_streamcheck_plan", None)
        kernel.device_caches, kernel.launched = {0: ({},)}, []
    patcher = Patcher([])
    for patch in triton_launch.patches():
        assert patcher.apply(patch)
    yield pkg
    patcher.restore()
    kernel_access.forget_declaration("apply_kernel")  # the one kernel these tests declare


@pytest.fixture
def rec(monkeypatch):
    recording = R.Recorder(GradGpu())
    monkeypatch.setattr(R, "current", recording)
    return recording


def ops(rec, kind):
    return [op for op in rec.trace.ops if type(op) is kind]


def buffers(rec):
    """x, y, out: three arrays in one 768-byte allocation."""
    rec.alloc(0x1000, 768, stream=FakeStream(STREAM_A))
    return Tensor(0x1000, 256), Tensor(0x1100, 256), Tensor(0x1200, 256)


def test_a_launch_is_recorded_on_tritons_stream_with_the_kernels_reads_and_writes(triton, rec):
    x, y, out = buffers(rec)
    assert add_kernel[(4,)](x, y, out, 64, BLOCK_SIZE=64) == "compiled kernel"
    (launch,) = ops(rec, T.Launch)
    assert launch.name == "add_kernel" and launch.stream == rec.sid(STREAM_A)
    assert [(r.start, r.stop) for r in launch.reads] == [(0, 256), (256, 512)]
    assert [(r.start, r.stop) for r in launch.writes] == [(512, 768)]
    assert launch.site.file == __file__
    assert add_kernel.launched == [(STREAM_A, (x, y, out, 64), {"BLOCK_SIZE": 64})]  # passed on untouched
    assert rec.notices == [] and rec.errors == []


def test_a_triton_producer_and_consumer_on_two_streams_race_unless_the_consumer_waits(triton, rec):
    """FlashNorm's bug in Triton: the consumer on stream B reads what the producer on stream A
    writes, with no wait; its fixed twin waits on an event recorded after the producer."""
    x, y, out = buffers(rec)
    add_kernel[(1,)](x, x, y, 64, BLOCK_SIZE=64)  # producer: writes y on A
    DRIVER.active.stream = STREAM_B
    add_kernel[(1,)](y, y, out, 64, BLOCK_SIZE=64)  # consumer: reads y on B
    (race,) = rec.races
    assert race.kind == "RAW" and (race.start, race.stop) == (256, 512)
    assert (race.first.name, race.first.write, race.second.name, race.second.write) == \
        ("add_kernel", True, "add_kernel", False)

    fixed = R.Recorder(GradGpu())
    R.current = fixed
    x, y, out = buffers(fixed)
    DRIVER.active.stream = STREAM_A
    add_kernel[(1,)](x, x, y, 64, BLOCK_SIZE=64)
    event = types.SimpleNamespace()
    fixed.event_record(event, STREAM_A, lambda: None)
    fixed.stream_wait(STREAM_B, event, lambda: None)
    DRIVER.active.stream = STREAM_B
    add_kernel[(1,)](y, y, out, 64, BLOCK_SIZE=64)
    assert fixed.races == []


def test_tensors_passed_by_keyword_are_placed_by_parameter_name(triton, rec):
    x, y, out = buffers(rec)
    add_kernel[(1,)](x, y_ptr=y, output_ptr=out, n_elements=64, BLOCK_SIZE=64, num_warps=4)
    (launch,) = ops(rec, T.Launch)
    assert [r.start for r in launch.reads] == [0, 256] and [r.start for r in launch.writes] == [512]


def test_warmup_compiles_without_recording(triton, rec):
    x, y, out = buffers(rec)
    add_kernel.run(x, y, out, 64, grid=(1,), warmup=True, BLOCK_SIZE=64)
    assert ops(rec, T.Launch) == [] and add_kernel.launched == []


def test_without_a_recording_launches_pass_straight_through(triton, monkeypatch):
    monkeypatch.setattr(R, "current", None)
    x = Tensor(0x1000, 256)
    add_kernel[(1,)](x, x, x, 64, BLOCK_SIZE=64)
    assert len(add_kernel.launched) == 1


def test_the_first_launch_of_a_specialization_is_noted_as_an_implicit_sync(triton, rec):
    x, y, out = buffers(rec)
    add_kernel[(1,)](x, y, out, 64, BLOCK_SIZE=64)
    add_kernel[(1,)](x, y, out, 64, BLOCK_SIZE=64)
    (implicit,) = ops(rec, T.ImplicitSync)
    assert "compile and module load of Triton kernel `add_kernel`" in implicit.reason


def test_a_jitted_helper_in_the_kernels_module_is_followed(triton, rec):
    x, _, out = buffers(rec)
    scale_kernel[(1,)](x, out, 2.0, BLOCK=64)
    (launch,) = ops(rec, T.Launch)
    assert [r.start for r in launch.reads] == [0] and [r.start for r in launch.writes] == [512]
    assert rec.notices == []


def test_an_undecided_argument_is_written_and_the_recording_says_it_assumed_so_once(triton, rec):
    x, _, out = buffers(rec)
    for _ in range(3):
        apply_kernel[(1,)](x, out, FN=object(), BLOCK=64)
    launches = ops(rec, T.Launch)
    assert len(launches) == 3 and all([r.start for r in launch.writes] == [0, 512] and launch.reads == ()
                                      for launch in launches)
    (notice,) = rec.notices
    assert notice.startswith("Triton kernel `apply_kernel`: assumed written (could not tell from its source)")
    assert "`x_ptr`" in notice and "`FN`, a function given as an argument" in notice
    assert "test_triton_launch.py:" in notice  # the kernel's own file and line


def test_declare_kernel_overrides_the_analysis_by_position(triton, rec):
    x, _, out = buffers(rec)
    kernel_access.declare_kernel("apply_kernel", reads=(0,), writes=(1,))
    apply_kernel[(1,)](x, out, FN=object(), BLOCK=64)
    (launch,) = ops(rec, T.Launch)
    assert [r.start for r in launch.reads] == [0] and [r.start for r in launch.writes] == [512]
    assert rec.notices == []
    kernel_access.declare_kernel("apply_kernel", writes=(0, 1))  # a new declaration replaces it
    apply_kernel[(1,)](x, out, FN=object(), BLOCK=64)
    assert [r.start for r in ops(rec, T.Launch)[1].writes] == [0, 512]


def test_tensors_in_a_tuple_argument_follow_the_parameters_access(triton, rec):
    x, y, _ = buffers(rec)
    pair_kernel[(1,)]((x, y), None, 3)
    (launch,) = ops(rec, T.Launch)
    assert launch.reads == () and [r.start for r in launch.writes] == [0, 256]
    (notice,) = rec.notices
    assert "`ptrs`: tl.store at test_triton_launch.py:" in notice and "tuple parameter `ptrs`" in notice


def test_a_tensor_that_requires_grad_and_wrappers_with_a_base_are_recorded_by_their_bytes(triton, rec):
    x, y, out = buffers(rec)
    wrapped = types.SimpleNamespace(base=y, dtype="float16", data_ptr=lambda: y.ptr)  # triton.reinterpret
    add_kernel[(1,)](Tensor(x.ptr, 256, requires_grad=True), wrapped, out, 64, BLOCK_SIZE=64)
    (launch,) = ops(rec, T.Launch)
    assert [r.start for r in launch.reads] == [0, 256] and rec.errors == []


def test_a_pointer_whose_bytes_cannot_be_named_is_said_once(triton, rec):
    x, _, out = buffers(rec)
    raw = types.SimpleNamespace(data_ptr=lambda: 0x1100, dtype="float32")
    add_kernel[(1,)](x, raw, out, 64, BLOCK_SIZE=64)
    add_kernel[(1,)](x, raw, out, 64, BLOCK_SIZE=64)
    assert rec.notices == ["Triton kernel `add_kernel`: argument(s) `y_ptr` hold a pointer (data_ptr()) without "
                           "__cuda_array_interface__: their bytes are not checked"]


def test_autotuned_and_heuristic_kernels_are_recorded_where_they_end_in_the_jit_run(triton, rec):
    x, y, out = buffers(rec)
    tuned = FakeAutotuner(FakeAutotuner(add_kernel, num_warps=4), BLOCK_SIZE=64)
    tuned[(1,)](x, y, out, 64)
    (launch,) = ops(rec, T.Launch)
    assert launch.name == "add_kernel" and [r.start for r in launch.writes] == [512]


def test_an_internal_failure_leaves_the_launch_to_the_program_unrecorded(triton, rec):
    x, y, out = buffers(rec)
    DRIVER.active.fail = True
    with pytest.raises(RuntimeError, match="0 active drivers"):  # Triton's own error, from its own run
        add_kernel[(1,)](x, y, out, 64, BLOCK_SIZE=64)
    assert ops(rec, T.Launch) == []
    assert rec.errors == ["Triton launch of `add_kernel`: RuntimeError: 0 active drivers; not recorded"]


def test_nothing_is_patched_while_triton_is_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    assert triton_launch.patches() == ()


def test_the_patch_is_undone_when_the_recording_stops(triton):
    before = FakeJIT.__dict__["run"]
    patcher = Patcher([])
    for patch in triton_launch.patches():
        patcher.apply(patch)
    assert FakeJIT.__dict__["run"] is not before and FakeJIT.__dict__["run"].__wrapped__ is before
    patcher.restore()
    assert FakeJIT.__dict__["run"] is before


# --- the real triton (skipped without it) -----------------------------------------------------

def real_triton():
    return pytest.importorskip("triton", reason="needs triton (pip install triton) for its JITFunction")


def test_a_real_jit_kernel_and_its_helper_are_analysed_from_triton_src(tmp_path, monkeypatch):
    real_triton()
    module = tmp_path / "real_kernels.py"
    module.write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def _store(ptr, offs, v):
            tl.store(ptr + offs, v)

        @triton.jit
        def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            _store(out_ptr, offs, tl.load(x_ptr + offs, mask=offs < n) * 2)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import real_kernels

    access = analyze(triton_launch.source_of(real_kernels.scale))
    assert (set(access.writes), set(access.reads), dict(access.undecided)) == ({"out_ptr"}, {"x_ptr", "n"}, {})
    assert access.evidence["out_ptr"].startswith("`_store` at real_kernels.py:12 (tl.store at real_kernels.py:7)")


def test_real_autotune_and_heuristics_end_in_the_patched_jit_run(monkeypatch, rec, real_kernels_module):
    triton = real_triton()
    from triton.runtime.jit import JITFunction

    from real_kernels_for_autotune import copy_kernel

    launched = []

    def run(self, *args, grid, warmup, **kwargs):  # stands in for the launch a GPU would run
        launched.append((self.__name__, kwargs.get("BLOCK")))

    patcher = Patcher([])
    monkeypatch.setattr(JITFunction, "run", run)
    monkeypatch.setattr(sys.modules["triton.runtime"], "driver", DRIVER)
    DRIVER.active = FakeDriver()
    for patch in triton_launch.patches():
        assert patcher.apply(patch)
    try:
        x, _, out = buffers(rec)
        tuned = triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2)], key=[])(copy_kernel)
        guessed = triton.heuristics({"BLOCK": lambda args: 128})(copy_kernel)
        tuned[(1,)](x, out, 64)
        guessed[(1,)](x, out, 64)
    finally:
        patcher.restore()
        copy_kernel.__dict__.pop("_streamcheck_plan", None)
    assert launched == [("copy_kernel", 64), ("copy_kernel", 128)]
    launches = ops(rec, T.Launch)
    assert [(op.name, [r.start for r in op.reads], [r.start for r in op.writes]) for op in launches] == \
        [("copy_kernel", [0], [512])] * 2
    assert {op.site.file for op in launches} == {__file__}  # past triton's __getitem__ and autotuner frames


@pytest.fixture
def real_kernels_module(tmp_path_factory, monkeypatch):
    """A module with a real @triton.jit kernel (Triton reads its source from a file)."""
    folder = tmp_path_factory.getbasetemp() / "real_kernels_for_autotune"
    folder.mkdir(exist_ok=True)
    (folder / "real_kernels_for_autotune.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    '''))
    monkeypatch.syspath_prepend(str(folder))
