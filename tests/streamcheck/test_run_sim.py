"""`streamcheck run --backend sim`: an unmodified torch script on the CPU with CUDA emulated
(commands/run_sim.py, docs/emulation.md): the reference's report, the schedules compared by their
output with a replay line that reproduces the difference, the bad input the issue names."""
from __future__ import annotations

import json
import os
import re
import shlex
import textwrap
import time

import pytest

from streamcheck import cli
from streamcheck.commands.run import TIMED_OUT

RACY = textwrap.dedent('''\
    import torch

    side = torch.cuda.Stream()
    x = torch.zeros(1 << 12, device="cuda")
    torch.cuda.synchronize()
    for step in range(1, 5):
        with torch.cuda.stream(side):
            x.fill_(float(step))
        print(x[0].item())  # BUG: the default stream reads x without waiting for `side`
        torch.cuda.current_stream().wait_stream(side)
''')
FILL, READ = 8, 9  # the lines of the racing accesses

FIXED = RACY.replace("    print(x[0].item())  # BUG: the default stream reads x without waiting for `side`\n",
                     "    torch.cuda.current_stream().wait_stream(side)\n    print(x[0].item())\n")


@pytest.fixture
def script(tmp_path):
    def write(text: str, name: str = "prog.py") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


def test_a_racy_script_is_reported_and_a_schedule_that_strikes_prints_its_replay(script, capsys):
    path = script(RACY)
    assert cli.main(["run", "--backend", "sim", "--schedules", "6", path]) == 0
    captured = capsys.readouterr()
    assert captured.out == "1.0\n2.0\n3.0\n4.0\n"  # the reference's output, printed once
    assert "RAW race on `torch tensor`" in captured.err and f"prog.py:{READ}" in captured.err
    differs = re.findall(r"streamcheck: schedule (\w+) seed (\d+): line \d+: '([\d.]+)' \(the reference printed "
                         r"'([\d.]+)'\)\n  replay: (.*)", captured.err)
    assert differs, captured.err
    policy, seed, got, want, replay = differs[0]
    assert got != want
    # The replay line reruns exactly that schedule: the same difference.
    argv = shlex.split(replay)
    assert argv[:2] == ["streamcheck", "run"] and argv[-1] == path
    assert cli.main(argv[1:]) == 0
    again = capsys.readouterr().err
    assert f"streamcheck: schedule {policy} seed {seed}: line" in again
    assert f"'{got}' (the reference printed '{want}')" in again


def test_the_fixed_twin_is_clean_and_every_schedule_prints_the_same(script, capsys):
    assert FIXED != RACY
    path = script(FIXED)
    assert cli.main(["run", "--backend", "sim", "--schedules", "6", "--error-exitcode", "9", path]) == 0
    err = capsys.readouterr().err
    assert "streamcheck: no races found" in err
    assert "6 schedule(s) on the sim (delay, random, pct): 0 printed other output" in err


def test_a_run_checking_in_python_says_so_in_one_line(script, capsys, monkeypatch):
    line = "streamcheck: native checker unavailable (STREAMCHECK_NATIVE_CHECKER=0): using the Python checker"
    monkeypatch.setenv("STREAMCHECK_NATIVE_CHECKER", "0")
    assert cli.main(["run", "--backend", "sim", "--schedules", "0", script(FIXED)]) == 0
    assert capsys.readouterr().err.count(line + "\n") == 1
    monkeypatch.delenv("STREAMCHECK_NATIVE_CHECKER")
    assert cli.main(["run", "--backend", "sim", "--schedules", "0", script(FIXED)]) == 0
    assert "native checker" not in capsys.readouterr().err  # built here (tests/streamcheck/core/test_fast.py)


def test_error_exitcode_when_a_race_is_found(script, capsys):
    assert cli.main(["run", "--backend", "sim", "--schedules", "0", "--error-exitcode", "9", script(RACY)]) == 9


def test_json_and_trace_are_written_from_the_sim(script, tmp_path, capsys):
    report, trace = tmp_path / "races.json", tmp_path / "trace.json"
    assert cli.main(["run", "--backend", "sim", "--schedules", "0", "--json", str(report), "--trace", str(trace),
                     script(RACY)]) == 0
    races = json.loads(report.read_text())
    assert [r["kind"] for r in races] == ["RAW"] and races[0]["first"]["site"].endswith(f"prog.py:{FILL}")
    assert json.loads(trace.read_text())["traceEvents"]


def test_confirm_on_the_sim_reads_the_stale_value(script, capsys):
    assert cli.main(["run", "--backend", "sim", "--schedules", "0", "--confirm", script(RACY)]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"race 1 \(RAW on `torch tensor`, prog.py:{FILL} -> prog.py:{READ}\): confirmed on the sim", err), err


def test_a_script_whose_output_differs_between_two_sequential_runs_is_not_compared(script, capsys):
    path = script("import os\nimport torch\nprint(torch.ones(2, device='cuda').sum().item(), os.urandom(8).hex())\n")
    assert cli.main(["run", "--backend", "sim", "--schedules", "3", path]) == 0
    err = capsys.readouterr().err
    assert "streamcheck: the script is not deterministic: a second sequential run printed other output" in err
    assert "are not compared" in err and "replay:" not in err


# The interrupt may land in a weakref callback, which swallows it (Python reports it as unraisable); the
# time limit interrupts again until the script's frames are left, so that report is expected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("body, hung", [
    ("x = torch.ones(2, device='cuda')\nwhile True:\n    x = x + 1\n", "prog.py:4 in <module>: x = x + 1"),
    ("import time\ntime.sleep(1000)\n", "prog.py:3 in <module>: time.sleep(1000)"),  # blocked in one C call
])
def test_a_script_that_never_returns_is_interrupted_at_its_timeout(script, capsys, monkeypatch, body, hung):
    path = script("import torch\n" + body)
    monkeypatch.chdir(os.path.dirname(path))
    start = time.perf_counter()
    assert cli.main(["run", "--backend", "sim", "--timeout", "3", path]) == TIMED_OUT
    assert time.perf_counter() - start < 3 * 3
    err = capsys.readouterr().err
    assert ("streamcheck run: timed out: the reference run did not finish within the run's limit of 3 s (--timeout, "
            "for all runs together); finished: nothing") in err
    assert f"streamcheck run: where the script was (innermost last):\n  {hung}\n" in err
    assert "test_run_sim.py" not in err  # the frames of the script, not of whoever ran the command


COUNTED = textwrap.dedent('''\
    import os
    import torch

    # Each run adds a line; the fourth (the reference, the determinism rerun, a schedule, then this) never ends.
    with open("runs.txt", "a") as f:
        f.write("run\\n")
    with open("runs.txt") as f:
        runs = len(f.readlines())
    x = torch.ones(2, device="cuda")
    while runs >= 4:
        x = x + 1
    print(x.sum().item())
''')


def test_one_timeout_bounds_all_the_runs_and_says_what_finished(script, capsys, monkeypatch):
    path = script(COUNTED)
    monkeypatch.chdir(os.path.dirname(path))
    start = time.perf_counter()
    assert cli.main(["run", "--backend", "sim", "--schedules", "4", "--timeout", "4", path]) == TIMED_OUT
    assert time.perf_counter() - start < 3 * 4
    err = capsys.readouterr().err
    assert ("streamcheck run: timed out: schedule random seed 1 did not finish within the run's limit of 4 s "
            "(--timeout, for all runs together); finished: the reference, the determinism rerun, 1 of 4 schedules") \
        in err, err
    assert "  prog.py:11 in <module>: x = x + 1" in err
    assert "streamcheck: 1 of 4 schedule(s) on the sim" in err  # the ones that ran are still compared


def test_timeout_is_the_sims(script, capsys):
    assert cli.main(["run", "--backend", "gpu", "--timeout", "5", script(RACY)]) == 2
    assert "--timeout bounds the sim's runs" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--backend", "sim", "--delay-us", "200"], "--delay-us is for the GPU backend, not the sim; delays on the sim "
                                                "are host steps: --delay-steps N"),
    (["--backend", "gpu", "--schedules", "3"], "--schedules reruns the script under sim schedules; add --backend sim"),
    (["--backend", "gpu", "--policy", "pct"], "--policy reruns the script under sim schedules; add --backend sim"),
    (["--backend", "sim", "--delay-stream", "all"], "--delay-stream all is the GPU's; the sim's delay holds the streams"),
])
def test_options_of_the_other_backend_are_usage_errors(argv, words, script, capsys):
    path = script(RACY)
    assert cli.main(["run", *argv, path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the script ran
    (line,) = captured.err.splitlines()
    assert words in line


@pytest.mark.parametrize("value", ["delay,,pct", "fifo", ""])
def test_a_bad_policy_is_a_usage_error(value, script, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--backend", "sim", "--policy", value, script(RACY)])
    assert exc.value.code == 2
    assert "policies are delay, random, pct" in capsys.readouterr().err


def test_cupy_under_the_sim_is_one_line_and_exit_2(script, capsys):
    path = script("import cupy\nprint('ran')\n")
    assert cli.main(["run", "--backend", "sim", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("streamcheck run: import cupy at prog.py:1 under the sim: CuPy's kernels need a GPU")
    assert "Traceback" not in captured.err


def test_what_is_freed_as_the_script_ends_is_the_scripts_last_line_not_runpys_or_a_threads(script):
    from streamcheck.core import trace as T
    from streamcheck.emulation.script import run_script

    path = script(textwrap.dedent('''\
        import torch

        KEPT = torch.ones(4, device="cuda")  # a global: freed only as the script ends
        print(KEPT.sum().item())
    '''))
    run = run_script(path)
    assert run.status == 0 and run.stdout == "4.0\n"
    frees = [op for op in run.device.trace if type(op) is T.Free]
    kept = [op for op in frees if op.site.line == 4]
    assert kept, [(op.site.file, op.site.line) for op in frees]
    assert not [op for op in frees if "runpy" in op.site.file or "threading" in op.site.file]


def test_a_tensor_that_outlives_the_run_is_not_an_error_at_exit(script):
    import subprocess
    import sys

    path = script(textwrap.dedent('''\
        import torch

        torch.KEPT_BY_A_LIBRARY = torch.arange(4, device="cuda")  # alive until the interpreter exits
        print(torch.KEPT_BY_A_LIBRARY.sum().item())
    '''))
    proc = subprocess.run([sys.executable, "-m", "streamcheck", "run", "--backend", "sim", "--schedules", "1", path],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "6\n", proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("option, value, message", [
    ("--devices", "0", "argument --devices: must be an integer >= 1, got 0"),
    ("--delay-steps", "0", "argument --delay-steps: must be an integer >= 1, got 0"),
])
def test_counts_that_must_be_positive_are_usage_errors(script, capsys, option, value, message):
    path = script(FIXED)
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--backend", "sim", option, value, path])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_delay_stream_name_no_stream_has_is_a_usage_error_naming_it(script, capsys):
    path = script(RACY)
    assert cli.main(["run", "--backend", "sim", "--schedules", "2", "--policy", "delay", "--delay-stream", "s9",
                     "--delay-stream", "s1", path]) == 2
    err = capsys.readouterr().err
    assert "streamcheck run: error: --delay-stream s9: nothing of that name ran in the delay schedules" in err
    assert "--delay-stream s1:" not in err  # s1 exists and held the fill
    assert "this run made s1" in err


def test_a_script_that_raises_is_reported_once_not_as_schedules_that_differ(script, capsys):
    path = script(textwrap.dedent('''\
        import torch

        x = torch.ones(2, device="cuda")
        print(x.sum().item())
        raise ValueError("the script's own failure")
    '''))
    assert cli.main(["run", "--backend", "sim", "--schedules", "3", path]) == 1  # the script's status
    captured = capsys.readouterr()
    assert captured.out == "2.0\n"
    assert captured.err.count("ValueError: the script's own failure") == 1, captured.err
    # The traceback as `python prog.py` prints it: from the script's frame, none of streamcheck's or runpy's.
    assert f'Traceback (most recent call last):\n  File "{path}", line 5, in <module>' in captured.err, captured.err
    assert "streamcheck/emulation" not in captured.err and "runpy" not in captured.err
    assert "3 schedule(s) on the sim (delay, random, pct): 0 printed other output" in captured.err
