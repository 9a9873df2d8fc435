"""Programs that misbehave under run_schedules and streamcheck_device (streamcheck/plugin/fixtures.py):
one that never returns, one whose own thread raises, one that raises after some schedules ran.
pytest runs in a subprocess over one file holding all of them, on the sim backend."""
from __future__ import annotations

import json
import re
import time

import pytest

FAULTS = '''
import pytest

def fill(x):
    x[...] = 1.0

def wait_for_a_flag(dev):
    flag = dev.alloc(1, fill=0.0, name="flag")
    while dev.host_read(flag)[0] == 0:  # nothing ever sets it
        pass

def spin(dev):
    n = 0
    while True:  # no device call at all
        n += 1

@pytest.mark.streamcheck(timeout=1)
def test_loop_with_device_calls(run_schedules):
    run_schedules(wait_for_a_flag)

@pytest.mark.streamcheck(timeout=1)
def test_loop_without_device_calls(run_schedules):
    run_schedules(spin)

def test_hangs_only_under_a_schedule(run_schedules):
    def program(dev):
        if dev.schedule.policy.startswith("random"):
            spin(dev)
        return 1
    run_schedules(program, policies=["delay", "random"])

def worker(dev, x):
    dev.launch(fill, (x,), writes=[x])
    raise ValueError("worker gave up")

def with_a_thread(dev):
    x = dev.alloc(1, fill=0.0, name="x")
    t = dev.thread(worker, (dev, x))
    t.start()
    t.join()
    return 1

def test_program_thread_raises(run_schedules):
    run_schedules(with_a_thread)

def test_device_thread_raises(streamcheck_device):
    with_a_thread(streamcheck_device)

runs = []

def test_raises_in_the_third_schedule(run_schedules):
    def program(dev):
        runs.append(1)
        if len(runs) == 4:  # the reference, two schedules, then this one
            raise RuntimeError("third schedule")
        return 1
    run_schedules(program)
'''


def _line_of(fragment: str) -> int:
    """The line of FAULTS that holds `fragment` (the call sites reports name)."""
    return next(n for n, line in enumerate(FAULTS.splitlines(), 1) if fragment in line)


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """One pytest run over FAULTS, shared by the tests below: (stdout, the junitxml properties, seconds)."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("faults")
    (folder / "test_faults.py").write_text(FAULTS)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:hypothesispytest", "-p", "no:cacheprovider",
                             "--streamcheck-backend=sim", "--streamcheck-timeout=1", "--junitxml=out.xml",
                             "-W", "ignore::pytest.PytestUnhandledThreadExceptionWarning", "test_faults.py"],
                            cwd=folder, capture_output=True, text=True, timeout=120, env=_env())
    seconds = time.perf_counter() - start
    import xml.etree.ElementTree as ET

    properties = {}
    for case in ET.parse(folder / "out.xml").getroot().iter("testcase"):
        for prop in case.iter("property"):
            properties[case.get("name")] = json.loads(prop.get("value"))
    return result.stdout, properties, seconds


def _env() -> dict:
    import os

    return dict(os.environ, COLUMNS="400")


def _failure(stdout: str, test: str) -> str:
    """The `E` lines of one test's failure (or error) section."""
    section = re.search(rf"_{{3,}} (?:ERROR at teardown of )?{test} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n={{3,}} )", stdout,
                        re.S)
    assert section, stdout
    return "\n".join(line[1:].strip() for line in section.group(1).splitlines() if line.startswith("E"))


def test_every_fault_fails_and_the_run_ends(faults):
    stdout, _, seconds = faults
    assert re.search(r"5 failed, 1 passed, 1 error in", stdout), stdout
    # Three runs of at most 1 s each, then up to 1 s to unwind each: nothing waits for ever.
    assert seconds < 30


@pytest.mark.parametrize("test, last", [
    ("test_loop_with_device_calls", f"last recorded operation: HostAccess `host read` at "
                                    f"test_faults.py:{_line_of('while dev.host_read')} (in wait_for_a_flag)"),
    ("test_loop_without_device_calls", "last recorded operation: none (the program made no device call)"),
])
def test_a_program_that_never_returns_fails_within_the_timeout(faults, test, last):
    text = _failure(faults[0], test)
    assert ("streamcheck: the sequential reference run did not finish within 1 s (its thread was interrupted); "
            "the limit is --streamcheck-timeout or the streamcheck marker's timeout=") in text
    assert last in text
    assert "finished: nothing (the sequential reference was running)" in text
    function = "wait_for_a_flag" if "with_device" in test else "spin"
    assert re.search(rf"where it was \(innermost last\):\n.*test_faults.py:\d+ in {function}: ", text), text
    assert f"replay: pytest test_faults.py::{test} --streamcheck-seed=" in text


def test_a_hang_under_one_schedule_names_it_and_replays_it(faults):
    text = _failure(faults[0], "test_hangs_only_under_a_schedule")
    assert "streamcheck: schedule random:0 did not finish within 1 s (its thread was interrupted)" in text
    assert "schedule: random:0 = random schedule seed" in text
    # One limit for the reference and every schedule: what finished before it ran out.
    assert "for the reference and all schedules together" in text
    assert "finished: the sequential reference, 1 of 8 schedules" in text
    assert re.search(r"replay: pytest test_faults.py::test_hangs_only_under_a_schedule --streamcheck-seed=\d+ "
                     r"--streamcheck-backend=sim --streamcheck-replay=random:0", text)
    assert faults[1]["test_hangs_only_under_a_schedule"]["schedules"] == 2  # delay:0, then random:0


def test_a_program_thread_that_raises_fails_the_schedule_with_its_traceback(faults):
    text = _failure(faults[0], "test_program_thread_raises")
    assert ("streamcheck: in the sequential reference run, 1 of the program's threads raised (Device.thread)"
            in text)
    assert f"host thread 1 (`worker`, started at test_faults.py:{_line_of('t.start()')}) raised:" in text
    assert f"line {_line_of('raise ValueError')}, in worker" in text and "ValueError: worker gave up" in text
    assert "threading.py" not in text  # the thread's own frames, from its target on


def test_a_device_thread_that_raises_errors_the_streamcheck_device_test(faults):
    stdout = faults[0]
    assert "ERROR at teardown of test_device_thread_raises" in stdout
    section = stdout.split("ERROR at teardown of test_device_thread_raises", 1)[1]
    assert "streamcheck: 1 of the program's threads raised (Device.thread)" in section
    assert "ValueError: worker gave up" in section and "replay: pytest test_faults.py::test_device_thread_raises" \
        in section


def test_a_program_that_raised_says_how_many_schedules_ran(faults):
    text = _failure(faults[0], "test_raises_in_the_third_schedule")
    assert "RuntimeError: third schedule" in text
    # Two seeds, each labelled: the schedule's own, and the run's that the replay passes (issue 31 §4.8).
    note = re.search(r"streamcheck: raised in schedule pct:0 \(schedule seed \d+, from --streamcheck-seed=(\d+)\), "
                     r"after 2 schedules that ran without raising; replay: pytest "
                     r"test_faults.py::test_raises_in_the_third_schedule --streamcheck-seed=(\d+) "
                     r"--streamcheck-backend=sim --streamcheck-replay=pct:0", " ".join(text.split()))
    assert note is not None, text
    assert note.group(1) == note.group(2)
    assert faults[1]["test_raises_in_the_third_schedule"]["schedules"] == 3


@pytest.mark.parametrize("args, message", [
    (["--streamcheck-timeout=soon"], "streamcheck: --streamcheck-timeout='soon' is not valid; accepted values: "
                                     "a number of seconds >= 0 (0: no limit)"),
    (["-o", "streamcheck_timeout=nan"], "ini option streamcheck_timeout='nan' is not valid"),
])
def test_a_bad_timeout_is_a_usage_error(pytester, args, message):
    pytester.makepyfile(test_one="def test_one(run_schedules):\n    run_schedules(lambda dev: 1)\n")
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest", "--streamcheck-backend=sim", *args)
    assert result.ret == 4 and message in result.stderr.str()
