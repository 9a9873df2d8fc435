"""What a failure (or a warning) tells a new user, at the edges they hit (issue 31 §4): a program that
returns a device handle, the "to make them strike" hint only where it works, and warn mode's reports."""
from __future__ import annotations

import re

import pytest

PROGRAMS = '''
import threading
import numpy as np

def produce(x):
    x[...] = np.arange(4, dtype=x.dtype) + 1

def consume(y, x):
    y[...] = x * 2

def racy(dev):
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc(4, fill=0.0, name="x")
    y = dev.alloc(4, fill=0.0, name="y")
    dev.launch(produce, (x,), stream=a, writes=[x])
    dev.launch(consume, (y, x), stream=b, reads=[x], writes=[y])
    dev.synchronize()
    return dev.host_read(y)

def host_first(dev):
    # A host thread writes x; the main thread's stream reads it, with no join in between.
    a = dev.stream("A")
    x = dev.alloc(4, fill=0.0, name="x")
    y = dev.alloc(4, fill=0.0, name="y")
    worker = dev.thread(lambda: dev.host_write(x, 1.0))
    worker.start()
    dev.launch(consume, (y, x), stream=a, reads=[x], writes=[y])
    worker.join()
    dev.synchronize()
    return dev.host_read(y)
'''


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no report line wraps


def _run(pytester, *args):
    return pytester.runpytest_subprocess("--streamcheck-backend=sim", "-p", "no:hypothesispytest", *args)


@pytest.mark.parametrize("returned, shown", [
    ("x", "a Buffer (`x`)"),
    ("[dev.get(x), x]", "a Buffer (`x`) at result[1]"),
    ("{'out': x[0:2]}", "a Region (`x` rows [0, 2)) at result['out']"),
])
def test_a_program_returning_a_device_handle_is_refused_up_front(pytester, returned, shown):
    pytester.makepyfile(test_handle=f'''
def test_handle(run_schedules):
    def program(dev):
        x = dev.alloc(4, fill=1.0, name="x")
        return {returned}
    run_schedules(program)
''')
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert (f"streamcheck: run_schedules: the program returned {shown}, a handle to device memory, not its values; "
            "return dev.get(buffer) or dev.host_read(buffer) after a synchronize") in out
    assert "got Buffer(" not in out and "schedule delay:0 gave values" not in out


def test_the_strike_hint_offers_confirm_only_where_it_runs(pytester):
    pytester.makepyfile(test_hint=PROGRAMS + '''
def test_schedules(run_schedules):
    run_schedules(racy, policies=["eager"], schedules=1)

def test_device(streamcheck_device):
    racy(streamcheck_device)

def test_host_first(run_schedules):
    run_schedules(host_first, policies=["eager"], schedules=1)
''')
    result = _run(pytester)
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    # Each test's failure, up to the next one or the summaries (which pytest does not cut under CI=true).
    sections = {name: out.split(f"_ {name} _", 1)[1].split("\n_", 1)[0].split("\n=", 1)[0]
                for name in ("test_schedules", "test_device", "test_host_first")}
    # run_schedules on the sim: confirmation reruns the program, so the hint offers it.
    assert "to make them strike: --streamcheck-confirm holds stream A: `produce`" in sections["test_schedules"]
    # A streamcheck_device test cannot be rerun: the delay by hand, and what confirmation would need.
    device = sections["test_device"]
    assert "--streamcheck-confirm holds" not in device
    assert ("to make them strike: hold stream A: `produce` writes at test_hint.py:14 until `consume` ran: "
            "Device(\"sim\", policy=\"delay\", streams=['A'], kernels=['produce'], steps=8) "
            "(--streamcheck-confirm needs a run_schedules program)") in device
    # A race whose first access is the host's: no schedule can hold it, so neither way is offered.
    host = sections["test_host_first"]
    assert "--streamcheck-confirm" not in host and "Device(\"sim\", policy=\"delay\"" not in host
    assert ("to make them strike: no delay can: the first access (host thread 1: `host write` writes at "
            "test_hint.py:24) is the host's own, which executes when issued; add the missing edge above") in host


def test_the_strike_hint_on_the_gpu_backend_does_not_offer_confirm():
    # --streamcheck-confirm reruns on the sim only: with --streamcheck-backend=cupy it is not attempted.
    from streamcheck.device import Device
    from streamcheck.plugin.reporting import strike_hint

    namespace = {}
    exec(PROGRAMS, namespace)
    dev = Device("sim")
    namespace["racy"](dev)
    assert "--streamcheck-confirm holds" in strike_hint(dev.races, confirm_runs=True)
    hint = strike_hint(dev.races, confirm_runs=False)
    assert "--streamcheck-confirm holds" not in hint and "streams=['A'], kernels=['produce']" in hint


def test_a_capture_midway_adds_a_section_saying_the_python_checker_took_over(pytester):
    from streamcheck.core import fast

    if fast.unavailable():
        pytest.skip(f"the native checker is not built here: {fast.unavailable()}")
    pytester.makepyfile(test_captured=PROGRAMS + '''
def test_captured(streamcheck_device):
    racy(streamcheck_device)
    main = streamcheck_device.stream("main")
    main.begin_capture()
    main.end_capture()

def test_plain(streamcheck_device):
    racy(streamcheck_device)
''')
    result = _run(pytester)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    captured = out.split("_ test_captured _", 1)[1].split("_ test_plain _", 1)[0]
    assert "streamcheck checker" in captured
    assert "a CaptureBegin the native checker leaves to it" in captured
    assert "streamcheck checker" not in out.split("_ test_plain _", 1)[1]


def test_warn_mode_prints_the_race_report_not_only_a_summary_line(pytester):
    pytester.makepyfile(test_warned=PROGRAMS + '''
def test_warned(run_schedules):
    run_schedules(racy, policies=["sequential"], schedules=1)
''')
    result = _run(pytester, "--streamcheck-check=warn")
    result.assert_outcomes(passed=1)
    summary = result.stdout.str().split("= streamcheck =", 1)[1]
    assert "PASSED test_warned.py::test_warned: 1 race (RAW on x)" in summary
    report = summary.split("PASSED test_warned.py::test_warned", 1)[1]
    assert "RAW race on `x` bytes [0, 16)" in report
    assert "missing edge: stream B never waited for an event recorded on stream A after `produce`" in report


def test_a_program_returning_an_unsynchronized_download_gets_a_host_read_race(pytester):
    # The host consumes the downloaded bytes (the program's result) before any synchronize: the values are
    # wrong in some schedules, and the race says why in every one.
    pytester.makepyfile(test_download=PROGRAMS + '''
def downloaded(dev, synchronize):
    a = dev.stream("A")
    x = dev.alloc(4, fill=0.0, name="x")
    dev.launch(produce, (x,), stream=a, writes=[x])
    out = dev.download(x, stream=a)
    if synchronize:
        a.synchronize()
    return out

def test_unsynchronized(run_schedules):
    run_schedules(lambda dev: downloaded(dev, False))

def test_synchronized(run_schedules):
    run = run_schedules(lambda dev: downloaded(dev, True))
    assert run.reference.tolist() == [1.0, 2.0, 3.0, 4.0]
''')
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "RAW race on `download of x` bytes [0, 16)" in out
    assert "first:  stream A: `copy D2H` writes at test_download.py:35" in out
    assert "second: host thread 0: `the program's result` reads at test_download.py:41" in out
    assert "FAILED test_download.py::test_unsynchronized: 1 race (RAW on download of x)" in out


def test_a_failure_labels_each_seed_it_prints(pytester):
    # The schedule's own seed and the run's (which the replay line passes) are two numbers: each says which.
    pytester.makepyfile(test_seeds=PROGRAMS + '''
def test_racy(run_schedules):
    run_schedules(racy, policies=["delay"], schedules=4)
''')
    result = _run(pytester, "--streamcheck-seed=1")
    result.assert_outcomes(failed=1)
    failure = result.stdout.str().split("_ test_racy _", 1)[1].split("= streamcheck =", 1)[0]
    assert re.search(r"schedule: delay:\d = delay\(steps=8\) schedule seed \d+, decisions", failure)
    assert "replay: pytest test_seeds.py::test_racy --streamcheck-seed=1 " in failure
    assert not re.search(r"(?<!schedule) seed \d", failure), failure
