"""--streamcheck-library (plugin/options.py) and the call sites of a failing test's report
(core/trace.py): the user's line first, the wrapper's as the innermost frame, paths relative to
the rootdir."""
from __future__ import annotations

import streamcheck.device.api  # noqa: F401 (loaded before pytester's module snapshot: numpy loads once per process)

WRAPPER = '''
def write(dev, stream, x):
    dev.launch(lambda v: None, (x,), stream=stream, writes=[x], name="write")
'''
TEST = '''
from wrappers import ops


def test_two_writers(streamcheck_device):
    dev = streamcheck_device
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc(4, fill=0.0, name="x")
    ops.write(dev, a, x)
    ops.write(dev, b, x)
'''


def _project(pytester):
    pytester.mkpydir("wrappers")
    (pytester.path / "wrappers" / "ops.py").write_text(WRAPPER)
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_sites.py").write_text(TEST)
    pytester.makeini("[pytest]\n")  # the rootdir: pytester.path
    pytester.syspathinsert()  # `wrappers` importable, as from an installed project


def test_a_wrapper_named_as_a_library_gives_the_tests_line_and_the_wrapper_as_innermost(pytester):
    _project(pytester)
    result = pytester.runpytest("--streamcheck-library=wrappers", "-p", "no:cacheprovider", "tests")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([  # wrapped at pytester's 80 columns
        "  first:  stream A: `write` writes at tests/test_sites.py:9 (through", "      wrappers/ops.py:3)",
        "  second: stream B: `write` writes at tests/test_sites.py:10 (through", "      wrappers/ops.py:3)"])


def test_without_the_option_the_wrapper_is_the_site(pytester):
    _project(pytester)
    result = pytester.runpytest("-p", "no:cacheprovider", "tests")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*stream A: `write` writes at wrappers/ops.py:3",
                                 "*stream B: `write` writes at wrappers/ops.py:3"])
    assert "through" not in result.stdout.str()


def test_a_library_path_that_does_not_exist_is_a_usage_error(pytester):
    _project(pytester)
    result = pytester.runpytest("--streamcheck-library=wrapers", "tests")
    assert result.ret == 4  # pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*streamcheck: --streamcheck-library='wrapers': */wrapers does not exist; give the "
                                 "directories or files of your own wrappers"])


def test_under_verbose_a_race_report_shows_each_access_s_stack(pytester):
    pytester.makepyfile(helpers="""
        def produce(dev, stream, x):
            dev.launch(lambda y: None, [x], stream=stream, writes=[x], name="produce")
    """, test_racy="""
        from helpers import produce

        def test_racy(run_schedules):
            def program(dev):
                a, b = dev.stream("A"), dev.stream("B")
                x = dev.alloc((4,), name="x", fill=0)
                produce(dev, a, x)
                dev.launch(lambda y: None, [x], stream=b, reads=[x], name="consume")
            run_schedules(program, schedules=1)
    """)
    quiet = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--streamcheck-backend=sim")
    loud = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--streamcheck-backend=sim", "-v")
    quiet.assert_outcomes(failed=1)
    loud.assert_outcomes(failed=1)
    assert not any(" in produce" in line for line in quiet.stdout.lines)
    lines = [line.removeprefix("E").strip() for line in loud.stdout.lines]
    first = lines.index("first:  stream A: `produce` writes at helpers.py:2")
    # the stack: the wrapper, the program, and nothing of the runner that called it
    assert lines[first + 1:first + 3] == ["helpers.py:2 in produce", "test_racy.py:7 in program"], loud.stdout.str()
    assert lines[first + 3].startswith("second:"), loud.stdout.str()
