"""Tests' unmodified torch code on a CPU runner with CUDA emulated on the sim (plugin/emulation.py,
docs/emulation.md): the streamcheck_gpu fixture without a GPU, run_schedules with a torch program,
and --streamcheck-emulate-cuda for a whole suite written for GPUs. Each racy test with its fixed
twin; a race fails the test with the report (the test's own lines) and a replay line that fails
the same way."""
from __future__ import annotations

import re

import pytest

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


# --- the emulation for the whole run (issue 36 item 1) ---------------------------------------

GUARDED_SUITE = '''
import pytest
import torch

TEST_CUDA = torch.cuda.is_available()  # module level: read at collection
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def produce_on_a_side_stream():
    side = torch.cuda.Stream()
    x = torch.ones(1 << 12, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2
    return side, x, y


@requires_cuda
def test_racy():
    side, x, y = produce_on_a_side_stream()
    assert (y + 1).sum().item() == 3 * (1 << 12)  # BUG: nothing orders the default stream after `side`


@pytest.mark.skipif(not TEST_CUDA, reason="needs CUDA")
def test_fixed():
    side, x, y = produce_on_a_side_stream()
    torch.cuda.current_stream().wait_stream(side)
    assert (y + 1).sum().item() == 3 * (1 << 12)
'''

TORCH_AT_CONFIGURE = '''
import sys

import pytest


@pytest.hookimpl(trylast=True)  # after every plugin's configure, streamcheck's included
def pytest_configure(config):
    print("torch imported by configure:", "torch" in sys.modules)
'''


def test_skipif_guards_and_module_level_flags_see_the_emulated_gpu(pytester):
    pytester.makepyfile(test_guarded=GUARDED_SUITE)
    pytester.makeconftest(TORCH_AT_CONFIGURE)
    without = run(pytester, "-s")
    without.assert_outcomes(skipped=2)  # a CPU runner: the guards skip, and the plugin stayed out of the way
    assert "torch imported by configure: False" in without.stdout.str()
    result = run(pytester, "--streamcheck-emulate-cuda", "--streamcheck-seed=5")
    result.assert_outcomes(passed=1, failed=1)  # none skipped
    out = flat(result)
    assert "FAILED test_guarded.py::test_racy" in out and "RAW race on `torch tensor`" in out
    mul = line_of(pytester, "test_guarded.py", "y = x * 2")
    assert f"`aten.mul.Tensor` writes at test_guarded.py:{mul}" in out
    # The replay keeps the emulation (without it, the guard would skip the test).
    replay = replay_line(result, "test_guarded.py::test_racy")
    assert "--streamcheck-emulate-cuda" in replay
    again = run(pytester, *replay.split())
    again.assert_outcomes(failed=1)
    assert "RAW race on `torch tensor`" in flat(again)


def test_every_xdist_worker_emulates_from_its_configure(pytester):
    pytester.makepyfile(test_guarded=GUARDED_SUITE)
    result = run(pytester, "--streamcheck-emulate-cuda", "-n", "2", "--streamcheck-seed=5")
    result.assert_outcomes(passed=1, failed=1)
    assert "FAILED test_guarded.py::test_racy" in flat(result)


@pytest.mark.parametrize("how", ["ini", "environment"])
def test_the_ini_option_and_the_environment_variable_turn_it_on(pytester, monkeypatch, how):
    pytester.makepyfile(test_guarded=GUARDED_SUITE)
    if how == "ini":
        pytester.makeini("[pytest]\nstreamcheck_emulate_cuda = true\n")
    else:
        monkeypatch.setenv("STREAMCHECK_EMULATE_CUDA", "1")
    result = run(pytester, "--streamcheck-seed=5")
    result.assert_outcomes(passed=1, failed=1)
    assert "FAILED test_guarded.py::test_racy" in flat(result)
    # The command line still turns it off.
    run(pytester, "--no-streamcheck-emulate-cuda").assert_outcomes(skipped=2)


FRESHNESS = '''
import torch

MODULE_TENSOR = torch.arange(4.0, device="cuda")  # made at collection, on the collection's device
seen = {}


def racy_step():
    side = torch.cuda.Stream()
    x = torch.ones(1 << 10, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2
    return (y + 1).sum()  # BUG: read on the default stream without waiting for `side`


def test_1_racy_and_allocating():
    assert torch.cuda.memory_allocated() == 0
    seen["stream"] = repr(torch.cuda.Stream())
    keep = torch.ones(256, device="cuda")
    assert torch.cuda.memory_allocated() > 0
    racy_step()
    MODULE_TENSOR.add_(1.0)  # written by this test: the next one sees the values it left
    torch.manual_seed(1234)


def test_2_fresh():
    assert torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_allocated() == 0
    assert repr(torch.cuda.Stream()) == seen["stream"]  # numbering restarts at s1
    assert torch.cuda.initial_seed() == 67280421310721  # torch's default CUDA seed, not test 1's 1234
    assert MODULE_TENSOR.tolist() == [1.0, 2.0, 3.0, 4.0]
'''


def test_each_test_starts_from_a_fresh_device(pytester):
    pytester.makepyfile(test_fresh=FRESHNESS)
    result = run(pytester, "--streamcheck-emulate-cuda", "--streamcheck-seed=5", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    out = flat(result)
    # test 1's race fails test 1 only: it does not leak into test 2's report
    assert "FAILED test_fresh.py::test_1_racy_and_allocating" in out and "test_2_fresh FAILED" not in out
    assert "FAILED test_fresh.py::test_2_fresh" not in out, out
    assert "races found in 1 test" in out


HUNG = '''
import time
import torch


def test_loops():
    x = torch.ones(2, device="cuda")
    while True:
        x = x + 1


def test_sleeps():
    time.sleep(1000)


def test_runs_after():
    assert torch.ones(2, device="cuda").sum().item() == 2.0
'''


def test_a_hung_test_fails_with_where_it_was_and_the_next_test_runs(pytester):
    pytester.makepyfile(test_hung=HUNG)
    result = run(pytester, "--streamcheck-emulate-cuda", "--streamcheck-timeout=3", "--durations=0", "-vv")
    result.assert_outcomes(passed=1, failed=2)
    out = flat(result)
    for test, fragment in (("test_loops", "x = x + 1"), ("test_sleeps", "time.sleep(1000)")):
        line = line_of(pytester, "test_hung.py", fragment)
        assert (f"streamcheck: test_hung.py::{test} did not finish within 3 s (--streamcheck-timeout or the "
                f"streamcheck marker's timeout=, for the whole test): interrupted in its call (finished: setup)") in out
        assert f"where it was (innermost last): test_hung.py:{line} in {test}: {fragment}" in out, out
        took = re.search(rf"([\d.]+)s call +test_hung.py::{test}", result.stdout.str())
        assert took and float(took.group(1)) < 3 * 3, result.stdout.str()  # about 3 s plus a margin, not 1000
    assert re.search(r"last recorded operation: \w+ .*? at test_hung.py:\d+ \(in test_loops\)", out), out
