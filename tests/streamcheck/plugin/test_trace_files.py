"""--streamcheck-trace-dir: a failing test's directory appears complete or not at all, even when
pytest is killed while writing it; the next run removes what the killed one left; a trace
directory that cannot be written is one line beside the race report, never an error in its place."""
from __future__ import annotations

import os

from tests.paths import FAULT_INJECTION

RACY = '''
import numpy as np

def produce(x):
    x[...] = 1.0

def consume(y, x):
    y[...] = x * 2

def test_racy(run_schedules):
    def program(dev):
        a, b = dev.stream("A"), dev.stream("B")
        x, y = dev.alloc(4, fill=0.0, name="x"), dev.alloc(4, fill=0.0, name="y")
        dev.launch(produce, (x,), stream=a, writes=[x])
        dev.launch(consume, (y, x), stream=b, reads=[x], writes=[y])  # no wait: a race
        dev.synchronize()
        return dev.host_read(y)
    run_schedules(program, policies=["eager"], schedules=1)
'''
FILES = ["perfetto.json", "report.txt", "timeline.png", "trace.json"]


def _run(pytester, *args):
    return pytester.runpytest_subprocess("--streamcheck-backend=sim", "-p", "no:hypothesispytest",
                                         "-p", "no:cacheprovider", "--streamcheck-trace-dir=traces", *args)


def _complete_or_absent(traces) -> list:
    """The test directories under `traces`, each of which must hold every file."""
    shown = [p for p in sorted(traces.iterdir()) if not p.name.startswith(".")]
    for test_dir in shown:
        assert sorted(os.listdir(test_dir)) == FILES, test_dir
    return [p.name for p in shown]


def test_sigkill_while_writing_leaves_no_partial_directory_and_the_next_run_cleans_up(pytester, monkeypatch):
    pytester.makepyfile(test_racy=RACY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAULT_INJECTION),
                                                                     os.environ.get("PYTHONPATH")])))
    # Killed when trace.json and perfetto.json are written and timeline.png is next.
    monkeypatch.setenv("STREAMCHECK_TEST_FAULT", "KILL before streamcheck.timeline.render_timeline")
    killed = _run(pytester)
    assert killed.ret == -9
    traces = pytester.path / "traces"
    assert _complete_or_absent(traces) == []
    assert [p.name.startswith(".test_racy.py_test_racy.") for p in traces.iterdir()] == [True], os.listdir(traces)

    monkeypatch.delenv("STREAMCHECK_TEST_FAULT")
    again = _run(pytester)
    again.assert_outcomes(failed=1)
    assert _complete_or_absent(traces) == ["test_racy.py_test_racy"]
    assert sorted(os.listdir(traces)) == ["test_racy.py_test_racy"]  # the leftover is gone


def test_an_unwritable_trace_dir_still_reports_the_race(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no report line wraps
    pytester.makepyfile(test_racy=RACY)
    (pytester.path / "traces").write_text("a file where the directory should be\n")
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "RAW race on `x`" in out
    assert "INTERNALERROR" not in out and "Traceback" not in out
    # One line, wherever pytest shows it (in the failure, and again in a summary where CI asks for one).
    said = {line.partition("trace files: ")[2] for line in result.stdout.lines if "trace files: " in line}
    assert said == {(f"could not be written to {pytester.path / 'traces'}/test_racy.py_test_racy/ "
                     f"(File exists: {pytester.path / 'traces'}); give --streamcheck-trace-dir a writable directory")}
