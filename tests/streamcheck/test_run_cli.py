"""`streamcheck run` and the instrumentation's CPU-testable parts (no GPU needed).

The GPU behaviour (races reported, values wrong under delay) is in
device/backends/test_cupy_backend_gpu.py; here: usage errors, the no-GPU exit, missing scripts,
lazy imports, and the pure pieces (CUDA signature parsing, delay targeting).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from streamcheck import cli
from streamcheck.commands import run as run_command
from streamcheck.pictures.timeline_model import RACE_CONTEXT
from tests.streamcheck.pictures.test_export import trace_event_errors
from streamcheck.device.backends.cupy_backend import MAX_DELAY_US, _Policy
from streamcheck.core.schedule import Delay
from streamcheck.record.kernel_access import kernel_signature, param_names
from streamcheck.core.schedule import ScheduleError
from tests.paths import ROOT

NO_CUPY = "import sys; sys.modules['cupy'] = None; "  # `import cupy` now raises ImportError


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text("print('ran')\n")
    return str(path)


# --- usage --------------------------------------------------------------------------------

def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for option in ("--delay-us", "--delay-stream", "--error-exitcode", "--seed", "script"):
        assert option in out


@pytest.mark.parametrize("value", ["-5", "-0.5", str(MAX_DELAY_US + 1), "lots"])
def test_bad_delay_is_a_usage_error(value, script, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--delay-us", value, script])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--delay-us" in err and value in err


@pytest.mark.parametrize("value", ["256", "-1", "x"])
def test_bad_error_exitcode_is_a_usage_error(value, script, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--error-exitcode", value, script])
    assert exc.value.code == 2
    assert "--error-exitcode" in capsys.readouterr().err


def test_script_is_required_and_its_arguments_are_not(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: streamcheck run [options] script.py [args ...]\n")
    assert err.rstrip().endswith("error: the following arguments are required: script.py")  # not `args`
    assert cli.build_parser().parse_args(["run", "prog.py"]).args == []


def test_a_directory_is_not_a_script(tmp_path, capsys):
    assert cli.main(["run", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"streamcheck run: {tmp_path} is a directory, not a Python script" in line


def test_a_library_path_that_does_not_exist_is_a_usage_error(script, tmp_path, capsys):
    missing = tmp_path / "wrapers"
    assert cli.main(["run", "--library", str(missing), script]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"streamcheck run: --library {missing}: no such file or directory; give your wrappers' "
                    "directory or file")


def test_missing_script_exits_2_like_python(tmp_path, capsys):
    missing = tmp_path / "nope.py"
    assert cli.main(["run", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "can't open file" in err and "nope.py" in err and "No such file" in err


def test_script_arguments_are_not_taken_as_options(script, monkeypatch, capsys):
    monkeypatch.setattr("streamcheck.record.gpu.cuda_device_present", lambda: False)
    # `--delay-us` after the script belongs to the script; the run still stops at the GPU check.
    assert cli.main(["run", "--backend", "gpu", script, "--delay-us", "-5"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


# --- no GPU -------------------------------------------------------------------------------

def test_backend_gpu_without_a_gpu_exits_2_with_a_clear_message(script, monkeypatch, capsys):
    monkeypatch.setattr("streamcheck.record.gpu.cuda_device_present", lambda: False)
    assert cli.main(["run", "--backend", "gpu", "--error-exitcode", "1", script]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert "--backend gpu needs an NVIDIA GPU and CuPy" in line and "--backend sim" in line
    assert "ran" not in captured.out  # the script did not run half-checked


def test_without_a_gpu_auto_runs_the_script_on_the_sim_and_says_so(script, monkeypatch, capsys):
    monkeypatch.setattr("streamcheck.record.gpu.cuda_device_present", lambda: False)
    assert cli.main(["run", "--schedules", "0", script]) == 0
    captured = capsys.readouterr()
    assert captured.out == "ran\n"
    assert captured.err.splitlines()[0] == ("streamcheck run: no GPU here: running on the sim (CUDA emulated on the "
                                            "CPU); --backend gpu requires a GPU")
    assert "streamcheck: no races found" in captured.err


def test_backend_gpu_without_cupy_end_to_end(script):
    proc = python(NO_CUPY + f"from streamcheck.cli import main; sys.exit(main(['run', '--backend', 'gpu', {script!r}]))")
    assert proc.returncode == 2, proc.stderr
    assert "needs an NVIDIA GPU and CuPy" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_console_script_entry_point_without_cupy(script):
    # The same through `python -m streamcheck.cli`, as CI machines run it.
    proc = subprocess.run([sys.executable, "-c", NO_CUPY + "import runpy; runpy.run_module('streamcheck.cli', "
                           "run_name='__main__')", "run", "--backend", "gpu", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "needs an NVIDIA GPU and CuPy" in proc.stderr


# --- lazy imports -------------------------------------------------------------------------

def test_importing_streamcheck_and_instrument_loads_neither_cupy_nor_torch():
    proc = python(textwrap.dedent("""
        import sys
        import streamcheck
        import streamcheck.record.instrument as inst
        from streamcheck import declare_access, declare_kernel
        assert callable(streamcheck.instrument) and streamcheck.instrument is inst
        print('cupy' in sys.modules, 'torch' in sys.modules)
    """))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_instrument_without_cupy_fails_only_when_used():
    proc = python(NO_CUPY + textwrap.dedent("""
        import streamcheck
        from streamcheck.record.instrument import InstrumentError, active
        streamcheck.declare_access(reads=[], writes=[])  # no session: does nothing
        streamcheck.declare_kernel('k', reads=(0,), writes=(1,))
        assert not active()
        try:
            with streamcheck.instrument():
                pass
        except InstrumentError as exc:
            print('InstrumentError:', exc)
    """))
    assert proc.returncode == 0, proc.stderr
    assert "InstrumentError: streamcheck.instrument needs an NVIDIA GPU and CuPy" in proc.stdout


def test_device_cupy_without_gpu_says_what_to_do(monkeypatch):
    from streamcheck.device.backends import BackendUnavailable
    from streamcheck.device import Device

    monkeypatch.setattr("streamcheck.device.backends.gpu_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="backend='sim'"):
        Device("cupy")


# --- CUDA signatures: const pointers are reads --------------------------------------------

@pytest.mark.parametrize("code, name, expected", [
    ('extern "C" __global__ void k(const float* x, float* y, int n) {}', "k", ("r", "w", "-")),
    ('extern "C" __global__ void k(float const *x, const float* __restrict__ y, float * const z) {}', "k",
     ("r", "r", "w")),
    ('__global__ void __launch_bounds__(256, 2) k(const double* a,\n  double* b /* out */) {}', "k", ("r", "w")),
    ("template <typename T, int N> __global__ void f(const T* a, T* b) {}", "f<float, 4>", ("r", "w")),
    ("__global__ void other(float* a) {}\n__global__ void k(const float* a) {}", "k", ("r",)),
    ("__global__ void k(void) {}", "k", ()),
    ("__device__ void k(float* a) {}", "k", None),  # not a kernel
    (None, "k", None),  # precompiled module: no source
])
def test_kernel_signature(code, name, expected):
    assert kernel_signature(code, name) == expected


def test_kernel_signature_ignores_commas_in_templates():
    code = "__global__ void k(const Pair<float, int>* p, Pair<float, int>* q, int n) {}"
    assert kernel_signature(code, "k") == ("r", "w", "-")


def test_elementwise_param_names():
    assert param_names("float32 x, raw T y, T z") == ["x", "y", "z"]
    assert param_names("") == []


# --- the backend's delay targeting (pure) -------------------------------------------------

def test_delay_policy_targets_named_streams_and_kernels():
    policy = _Policy("delay", 0, {"delay_us": 300, "streams": ["A"]})
    assert policy.spin_before("A", "k") == 300 and policy.spin_before("B", "k") == 0
    policy = _Policy("delay", 0, {"delay_us": 300, "kernels": ["matmul"]})
    assert policy.spin_before("B", "matmul") == 300 and policy.spin_before("B", "rms") == 0
    assert policy.describe() == "delay(delay_us=300, kernels=matmul)"


def test_delay_policy_without_names_lets_the_seed_choose_like_the_sim():
    names = ("legacy", "s1", "s2", "s3", "s4", "s5", "s6", "s7")
    chosen_sets = []
    for seed in range(10):
        policy, held = _Policy("delay", seed, {}), Delay(seed=seed)
        chosen = {name for name in names if policy.spin_before(name, "k") > 0}
        assert chosen == {name for name in names if held._stream_targeted(name)}  # the sim's choice, stream by stream
        chosen_sets.append(frozenset(chosen))
    assert len(set(chosen_sets)) == 10  # not the two sets a parity rule gives


def test_pct_and_random_policies_are_seeded():
    a, b = _Policy("random", 7, {"delay_us": 40}), _Policy("random", 7, {"delay_us": 40})
    spins = [a.spin_before("A", "k") for _ in range(20)]
    assert spins == [b.spin_before("A", "k") for _ in range(20)]
    assert all(0 <= s <= 40 for s in spins) and any(s > 0 for s in spins) and any(s == 0 for s in spins)
    assert [a.priority(0, 0, -5) for _ in range(10)] == [b.priority(0, 0, -5) for _ in range(10)]
    pct = _Policy("pct", 3, {"depth": 3})
    assert sum(pct.spin_before("A", "k") > 0 for _ in range(200)) == 2  # depth - 1 change points


@pytest.mark.parametrize("params, words", [
    ({"delay_us": -1}, "delay_us must be"),
    ({"delay_us": MAX_DELAY_US + 1}, "delay_us must be"),
    ({"delay_steps": 3}, "unknown parameters"),
])
def test_policy_parameters_are_validated(params, words):
    with pytest.raises(ScheduleError, match=words):
        _Policy("delay", 0, params)


def test_sim_parameters_are_accepted_so_one_test_runs_on_both_backends():
    assert _Policy("delay", 0, {"steps": 6, "streams": ["A"]}).spin_before("A", "k") > 0


def test_recording_starts_when_the_program_imports_cupy_so_cupy_sees_its_environment(tmp_path, monkeypatch):
    import importlib

    from streamcheck.record import instrument

    fake = tmp_path / "cupy"
    fake.mkdir()
    (fake / "__init__.py").write_text("import os\nPTDS = os.environ.get('CUPY_CUDA_PER_THREAD_DEFAULT_STREAM')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # no library imported yet
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    started = []
    monkeypatch.setattr(instrument, "start", lambda **options: started.append((options, sys.modules["cupy"].PTDS))
                        or "the session")
    hook = instrument.StartAtImport(seed=4)
    try:
        assert started == [] and hook.session is None  # nothing imported CuPy yet
        monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")  # the program's first line
        module = importlib.import_module("cupy")
        assert started == [({"seed": 4}, "1")]  # started after CuPy ran, which saw the program's setting
        assert hook.session == "the session" and set(hook.waiting) == {"torch", "triton"}  # imported later, they join it
        assert module.__spec__.loader.get_filename("cupy").endswith("__init__.py")  # the real loader answers
    finally:
        hook.remove()
        sys.modules.pop("cupy", None)


def test_the_strike_hint_names_the_race_directed_delay_of_each_first_access():
    from dataclasses import replace

    from streamcheck.commands.run import strike_hints
    from streamcheck.device import Device

    dev = Device("sim")
    s1, s2 = dev.stream("s1"), dev.stream("s2")
    x = dev.alloc(4, fill=0.0, name="x")
    dev.launch(lambda v: None, (x,), stream=s1, writes=[x], name="matmul")
    dev.launch(lambda v: None, (x,), stream=s2, reads=[x], name="postscale")
    (race,) = dev.races
    # As `streamcheck run` labels its streams: the short name, then where it was created.
    race = replace(race, first=replace(race.first, actor="stream s1 (created at prog.py:3)"))
    (line,) = strike_hints([race, race], 0, "prog.py", ["--steps", "4"])
    assert line.startswith("streamcheck: to make them strike, rerun with delays: streamcheck run --delay-us 200 "
                           "--delay-stream s1 --delay-kernel matmul prog.py --steps 4  (delays stream s1 (created at "
                           "prog.py:3): `matmul` writes at tests/streamcheck/test_run_cli.py:")
    assert line.endswith("so that `postscale` (test_run_cli.py:" + str(race.second.site.line) + ") runs first)")
    host_first = replace(race, first=replace(race.first, actor="host thread 0"))
    assert strike_hints([host_first], 3, "prog.py", []) == [
        "streamcheck: to make them strike, rerun with delays: streamcheck run --delay-us 200 --seed 3 prog.py"]


# --- outputs, on a GPU faked with test_recorder's FakeGpu ---------------------------------

RACY = """
import streamcheck.record.recorder as R
from tests.streamcheck.record.test_recorder import FakeArray, FakeStream

rec = R.current
s1, s2 = FakeStream(0x10), FakeStream(0x20)
rec.alloc(0x1000, 64, stream=s1)
rec.alloc(0x2000, 64, stream=s1)
y, z = FakeArray(0x1000, 64), FakeArray(0x2000, 64)
for _ in range(60):  # a long run before the race ...
    rec.launch("busy", lambda: None, stream=s1, writes=(z,))
rec.launch("matmul", lambda: None, stream=s1, writes=(y,))
rec.launch("postscale", lambda: None, stream=s2, reads=(y,))  # never waited for s1
for _ in range(60):  # ... and after it
    rec.launch("busy", lambda: None, stream=s1, writes=(z,))
"""


@pytest.fixture
def fake_gpu(monkeypatch):
    """`streamcheck run` where a GPU seems present: the recording is a Recorder on FakeGpu, started
    as the import hook would start it, and the script records through it (streamcheck.record.recorder.current)."""
    from streamcheck.record import instrument
    from streamcheck.record import recorder as R
    from tests.streamcheck.record.test_recorder import FakeGpu

    monkeypatch.setattr("streamcheck.record.gpu.cuda_device_present", lambda: True)
    monkeypatch.setattr("streamcheck.record.gpu.gpu_library_installed", lambda: True)

    class Hook:
        def __init__(self, **options):
            self.session = R.Recorder(FakeGpu(), seed=options["seed"])
            self.session.activate()

        def remove(self):
            self.session.deactivate()

    monkeypatch.setattr(instrument, "StartAtImport", Hook)


def program(tmp_path, source: str) -> str:
    path = tmp_path / "prog.py"
    path.write_text(source)
    return str(path)


def test_trace_and_timeline_show_the_racing_pair_among_the_operations_around_it(fake_gpu, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    trace, png = tmp_path / "race.json", tmp_path / "race"
    assert cli.main(["run", "--trace", str(trace), "--timeline", str(png), program(tmp_path, RACY)]) == 0
    err = capsys.readouterr().err
    assert f"Perfetto trace of 1 racing pair and the operations around them: {trace}" in err
    assert f"timeline of 1 racing pair and the operations around them: {png}.png" in err

    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in slices if e["name"].startswith("RACE: ")} == {"RACE: matmul", "RACE: postscale"}
    busy = [e for e in slices if e["name"] == "busy"]
    assert 0 < len(busy) <= 2 * RACE_CONTEXT + 2  # the race's neighbourhood, not the 120 launches
    flows = {e["name"] for e in events if e["ph"] in ("s", "f")}
    assert "missing wait" in flows
    assert trace_event_errors({"traceEvents": events}) == []

    assert (tmp_path / "race.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_race_writes_no_picture_and_says_why(fake_gpu, tmp_path, capsys):
    quiet = RACY.replace("stream=s2, reads=(y,)", "stream=s1, reads=(y,)")  # stream order: no race
    trace = tmp_path / "race.json"
    assert cli.main(["run", "--trace", str(trace), program(tmp_path, quiet)]) == 0
    assert "no race, so no --trace or --timeline was written" in capsys.readouterr().err
    assert not trace.exists()


def test_json_dash_writes_the_reports_to_stdout(fake_gpu, tmp_path, capsys):
    assert cli.main(["run", "--json", "-", program(tmp_path, RACY)]) == 0
    (race,) = json.loads(capsys.readouterr().out)
    assert (race["kind"], race["first"]["name"], race["second"]["name"]) == ("RAW", "matmul", "postscale")
    assert not (tmp_path / "-").exists()


def test_old_output_spellings_still_work_with_a_note(fake_gpu, tmp_path, capsys):
    reports, ops = tmp_path / "r.json", tmp_path / "o.json"
    assert cli.main(["run", "--report-json", str(reports), "--trace-json", str(ops), program(tmp_path, RACY)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "streamcheck run: note: --report-json is now --json; the old spelling still works" in err
    assert "streamcheck run: note: --trace-json is now --ops-json; the old spelling still works" in err
    assert [r["second"]["name"] for r in json.loads(reports.read_text())] == ["postscale"]
    assert len(json.loads(ops.read_text())) > 120  # every recorded operation


def test_a_capture_midway_says_in_one_line_that_the_python_checker_took_over(fake_gpu, tmp_path, capsys):
    from streamcheck.core import fast

    if fast.unavailable():
        pytest.skip(f"the native checker is not built here: {fast.unavailable()}")
    captured = RACY + (
        "rec.gpu.current = s1\n"
        "rec.capture_begin(s1, None, lambda: rec.gpu.capturing.add(s1.ptr))\n"
        "rec.launch('captured', lambda: None, stream=s1, writes=(z,))\n"
        "rec.capture_end(s1, lambda: rec.gpu.capturing.discard(s1.ptr))\n")
    assert cli.main(["run", program(tmp_path, captured)]) == 0
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "checked in Python" in line]
    assert line.startswith("streamcheck: checked in Python from operation ") and "a CaptureBegin the native" in line
    assert "RAW race" in err  # the race before the capture is still reported
    assert cli.main(["run", program(tmp_path, RACY)]) == 0
    assert "checked in Python" not in capsys.readouterr().err


def test_a_refused_record_is_an_internal_error_exit_3_with_the_record(fake_gpu, tmp_path, capsys):
    refused = RACY.replace("stream=s2, reads=(y,))", "stream=s1, reads=(y,))") + (
        "from streamcheck.core import trace as T\n"
        "rec.record(T.EventRecord(rec.tid(), rec.site(), event=999, stream=0))  # an event never created\n")
    assert cli.main(["run", "--error-exitcode", "0", program(tmp_path, refused)]) == run_command.INTERNAL_ERROR == 3
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("streamcheck: refused record #")]
    assert "EventRecord(" in line and "event=999" in line and "unknown event 999" in line
    assert "the check is incomplete (a refused record can hide a race): exit status 3" in err


@pytest.mark.parametrize("body, status, line", [
    ("raise KeyboardInterrupt  # Ctrl-C while `import torch` runs\n", 130,
     "streamcheck: interrupted (Ctrl-C) before the program imported CuPy or torch; nothing was recorded, nothing "
     "written"),
    ("print('no GPU library')\n", 0, "streamcheck: the program imported neither CuPy nor torch; nothing was recorded"),
], ids=["interrupted", "no-gpu-library"])
def test_a_run_that_never_recorded_says_why_in_its_last_line(body, status, line, monkeypatch, tmp_path, capsys):
    from streamcheck.record import instrument

    monkeypatch.setattr("streamcheck.record.gpu.cuda_device_present", lambda: True)
    monkeypatch.setattr("streamcheck.record.gpu.gpu_library_installed", lambda: True)

    class NeverStarted:  # the import hook, before the program imported CuPy or torch
        session = None

        def __init__(self, **options):
            pass

        def remove(self):
            pass

    monkeypatch.setattr(instrument, "StartAtImport", NeverStarted)
    out = tmp_path / "races.json"
    assert cli.main(["run", "--json", str(out), program(tmp_path, body)]) == status
    assert capsys.readouterr().err.splitlines()[-1] == line
    assert not out.exists()


def test_skip_without_gpu_exits_0_with_one_line(script, monkeypatch, capsys):
    monkeypatch.setattr("streamcheck.record.gpu.cuda_device_present", lambda: False)
    assert cli.main(["run", "--skip-without-gpu", script]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # the script did not run
    (line,) = captured.err.splitlines()
    assert line.startswith(f"streamcheck run: skipped {script}: no GPU here") and "--skip-without-gpu" in line


def test_outputs_are_checked_before_the_run(fake_gpu, tmp_path, capsys):
    ran = program(tmp_path, "print('ran')\n")
    assert cli.main(["run", "--timeline", str(tmp_path / "t.svg"), ran]) == 2
    assert cli.main(["run", "--trace", str(tmp_path / "no" / "t.json"), ran]) == 2
    captured = capsys.readouterr()
    assert "ran" not in captured.out
    assert "the timeline is a PNG" in captured.err and "does not exist" in captured.err
