"""Option and marker values a new user got wrong: each is refused up front, in one line naming
the option and what it accepts (pytest's usage error, exit status 4), never a traceback and never
accepted as something meaningless (issue 31 §4)."""
from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("args, message", [
    # An empty name between commas is a typo, not a policy.
    (["--streamcheck-policy=delay,,pct"], "--streamcheck-policy='delay,,pct' is not valid; accepted values: "
                                          "a comma-separated list of sequential, eager, delay, random, pct"),
    # Held back for no host call is no delay at all.
    (["--streamcheck-delay-steps=0"], "--streamcheck-delay-steps='0' is not valid; accepted values: an integer >= 1"),
    # As --streamcheck-trace-dir: a typo must not create a tree of directories.
    (["--streamcheck-example-db=/nonexistent/db"], "--streamcheck-example-db='/nonexistent/db': the directory "
                                                   "/nonexistent does not exist; create it or choose another place"),
])
def test_meaningless_values_are_usage_errors(pytester, args, message):
    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
    assert not (pytester.path.parent / "nonexistent").exists()


def test_seed_last_without_a_stored_seed_suggests_an_integer_not_last_again(pytester):
    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    result = pytester.runpytest_inprocess("--streamcheck-seed=last", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert "no previous seed is stored" in error
    assert "run once without it or pass an integer in [0, 4294967296)" in error
    assert "`last`" not in error.split("no previous seed is stored")[1]


@pytest.mark.parametrize("marker, message", [
    ("schedules='3'", "@pytest.mark.streamcheck on test_marked.py::test_marked: schedules='3' is not valid; "
                      "accepted values: an integer >= 1"),
    ("schedules=True", "schedules='True' is not valid; accepted values: an integer >= 1"),
    ("policies=5", "policies='5' is not valid; accepted values: a comma-separated string or a list of sequential, "
                   "eager, delay, random, pct"),
    ("policies=['delay', 7]", "policies=\"['delay', 7]\" is not valid"),
    ("policies='delay,,pct'", "policies='delay,,pct' is not valid"),
    ("check='loud'", "check='loud' is not valid; accepted values: on, warn, off"),
    ("check=['on']", "check=\"['on']\" is not valid; accepted values: on, warn, off"),
    ("timeout='soon'", "timeout='soon' is not valid; accepted values: a number of seconds >= 0"),
    ("timeout=None", "timeout='None' is not valid; accepted values: a number of seconds >= 0"),
])
@pytest.mark.parametrize("fixture", ["run_schedules", "streamcheck_device"])
def test_a_bad_marker_value_fails_its_test_in_one_line_not_a_traceback(pytester, marker, message, fixture):
    # The test fails (its neighbours run), with the message alone: no frame of the plugin's.
    pytester.makepyfile(test_marked=f'''
import pytest

@pytest.mark.streamcheck({marker})
def test_marked({fixture}):
    if callable({fixture}):
        {fixture}(lambda dev: 0)

def test_other():
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1, outcomes
    out = result.stdout.str()
    assert message in out
    section = out.split("test_marked _", 1)[1].split("short test summary")[0]
    assert "Traceback" not in section and "streamcheck/plugin/" not in section, section
    assert not re.search(r"\.py:\d", section) and "During handling" not in section, section
