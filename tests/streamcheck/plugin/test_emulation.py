"""Tests' unmodified torch code on a CPU runner with CUDA emulated on the sim (plugin/emulation.py,
docs/emulation.md): the streamcheck_gpu fixture without a GPU, run_schedules with a torch program,
and --streamcheck-emulate-cuda for a whole suite written for GPUs. Each racy test with its fixed
twin; a race fails the test with the report (the test's own lines) and a replay line that fails
the same way."""
from __future__ import annotations

import re

RACY_STREAM = '''
import torch


def produce_on_a_side_stream():
    side = torch.cuda.Stream()
    x = torch.ones(1 << 12, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2
    return side, x, y  # x too: freed here, its block would be the default stream's again while `side` reads it
'''

GPU_FIXTURE = RACY_STREAM + '''

def test_racy(streamcheck_gpu):
    side, x, y = produce_on_a_side_stream()
    assert (y + 1).sum().item() == 3 * (1 << 12)  # BUG: nothing orders the default stream after `side`


def test_fixed(streamcheck_gpu):
    side, x, y = produce_on_a_side_stream()
    torch.cuda.current_stream().wait_stream(side)
    assert (y + 1).sum().item() == 3 * (1 << 12)
'''

PROGRAMS = '''
import torch


def steps(wait: bool):
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 14, device="cuda")
    out = []
    for step in range(1, 5):
        side.wait_stream(torch.cuda.current_stream())  # the fill waits for the previous read
        with torch.cuda.stream(side):
            x.fill_(float(step))
        if wait:
            torch.cuda.current_stream().wait_stream(side)
        out.append(x * 1.0)  # read on the default stream
    return out


def test_racy(run_schedules):
    run_schedules(lambda: steps(wait=False))


def test_fixed(run_schedules):
    result = run_schedules(lambda: steps(wait=True))
    assert [float(v[0]) for v in result.reference] == [1.0, 2.0, 3.0, 4.0]
'''

PLAIN_SUITE = RACY_STREAM + '''

def test_racy():
    side, x, y = produce_on_a_side_stream()
    assert y.device.type == "cuda" and torch.cuda.is_available()
    assert (y + 1).sum().item() == 3 * (1 << 12)


def test_fixed():
    side, x, y = produce_on_a_side_stream()
    torch.cuda.current_stream().wait_stream(side)
    assert (y + 1).sum().item() == 3 * (1 << 12)
'''


def line_of(pytester, name: str, text: str) -> int:
    """The line of `text` in the test file pytester wrote."""
    lines = (pytester.path / name).read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if text in line)


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:hypothesispytest", "-p", "no:cacheprovider", *args)


def flat(result) -> str:
    """The run's output with its wrapped lines joined (reports wrap at the terminal's width, and
    a failure's lines carry pytest's `E` margin)."""
    lines = [line[1:] if line.startswith("E ") else line for line in result.stdout.str().splitlines()]
    return " ".join(" ".join(lines).split())


def replay_line(result, test: str) -> str:
    """The arguments of the replay line printed for `test` (never wrapped: one paste-able line)."""
    for line in result.stdout.str().splitlines():
        line = line.strip()
        if line.startswith(f"replay: pytest {test} "):
            return line[len("replay: pytest "):]
    raise AssertionError(f"no replay line for {test}:\n{result.stdout.str()}")


def test_streamcheck_gpu_without_a_gpu_runs_the_tests_torch_code_on_the_sim(pytester):
    pytester.makepyfile(test_gpu=GPU_FIXTURE)
    result = run(pytester, "--streamcheck-seed=7")
    result.assert_outcomes(passed=1, failed=1)
    out = flat(result)
    assert "FAILED test_gpu.py::test_racy" in out and "FAILED test_gpu.py::test_fixed" not in out
    mul = line_of(pytester, "test_gpu.py", "y = x * 2")
    assert re.search(rf"RAW race on `torch tensor` .*? first: stream s1: `aten.mul.Tensor` writes at test_gpu.py:{mul} ",
                     out), out
    assert "the test's torch code on the sim (CUDA emulated on the CPU)" in out
    # The replay line runs the failing test again, and it fails the same way.
    again = run(pytester, *replay_line(result, "test_gpu.py::test_racy").split())
    again.assert_outcomes(failed=1)
    assert "RAW race on `torch tensor`" in flat(again)


def test_backend_cupy_still_needs_a_gpu_for_streamcheck_gpu(pytester):
    pytester.makepyfile(test_gpu=GPU_FIXTURE)
    result = run(pytester, "--streamcheck-backend=cupy")
    assert result.ret != 0
    assert "--streamcheck-backend=cupy needs an NVIDIA GPU" in flat(result) + result.stderr.str()


def test_run_schedules_takes_a_torch_program_and_its_race_strikes(pytester):
    pytester.makepyfile(test_programs=PROGRAMS)
    result = run(pytester, "--streamcheck-seed=3", "--streamcheck-schedules=6")
    result.assert_outcomes(passed=1, failed=1)
    out = flat(result)
    assert "FAILED test_programs.py::test_racy" in out
    assert re.search(r"schedule \w+:\d+ gave values that differ from the sequential reference", out), out
    fill = line_of(pytester, "test_programs.py", "x.fill_(")
    assert "RAW race on `torch tensor`" in out and f"`aten.fill_.Scalar` writes at test_programs.py:{fill}" in out
    again = run(pytester, *replay_line(result, "test_programs.py::test_racy").split())
    again.assert_outcomes(failed=1)
    assert "gave values that differ" in flat(again)


def test_a_suite_written_for_gpus_runs_unchanged_with_emulate_cuda(pytester):
    pytester.makepyfile(test_suite=PLAIN_SUITE)
    without = run(pytester)
    without.assert_outcomes(failed=2)  # a CPU-only torch refuses device="cuda"
    result = run(pytester, "--streamcheck-emulate-cuda", "--streamcheck-seed=5")
    result.assert_outcomes(passed=1, failed=1)
    out = flat(result)
    assert "FAILED test_suite.py::test_racy" in out and "RAW race on `torch tensor`" in out
    assert replay_line(result, "test_suite.py::test_racy")


def test_a_refused_surface_fails_the_test_in_one_line_naming_it(pytester):
    pytester.makepyfile(test_refused='''
import torch

def test_backward(streamcheck_gpu):
    w = torch.ones(3, device="cuda", requires_grad=True)
    (w * 2).sum().backward()
''')
    result = run(pytester)
    result.assert_outcomes(failed=1)
    out = flat(result)
    line = line_of(pytester, "test_refused.py", ".backward()")
    # Without --streamcheck-emulate-cuda the run is not re-exec'd with the native guard: autograd is refused.
    assert f"EmulationError: backward() at test_refused.py:{line}: autograd on the sim needs streamcheck's native " \
           "CUDA guard" in out, out
    assert "Aborted" not in out + result.stderr.str() and "Fatal Python error" not in result.stderr.str()
