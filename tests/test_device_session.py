"""tests/device_session.py: shards that partition the tests, and a failure log written as
failures happen (once per failure, under xdist too), on a small generated suite."""
from __future__ import annotations

import re

import pytest

from tests.paths import ROOT

PLUGIN = ("-p", "tests.device_session")
SUITE = """
import pytest

@pytest.mark.parametrize("i", range(20))
def test_many(i):
    assert i not in (3, 11), f"planted failure {i}"
"""


def ran(reprec) -> set:
    return {r.nodeid for r in reprec.getreports("pytest_runtest_logreport") if r.when == "call"}


def test_the_shards_partition_the_tests_by_node_id(pytester):
    pytester.makepyfile(test_suite=SUITE)
    everything = ran(pytester.inline_run(*PLUGIN))
    shards = [ran(pytester.inline_run(*PLUGIN, "--shard", f"{k}/3")) for k in (1, 2, 3)]
    assert len(everything) == 20
    assert set().union(*shards) == everything
    assert sum(len(s) for s in shards) == 20 and all(shards)
    again = ran(pytester.inline_run(*PLUGIN, "--shard", "2/3"))
    assert again == shards[1]  # a part is the same part every time


@pytest.mark.parametrize("value", ["0/2", "3/2", "half", "1/0"])
def test_a_bad_shard_is_a_usage_error_that_names_the_option(pytester, value):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*PLUGIN, "--shard", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--shard*{value}*"])


@pytest.mark.parametrize("workers", [None, "2"])
def test_each_failure_is_logged_once_with_its_traceback(pytester, monkeypatch, workers):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_suite=SUITE)
    log = pytester.path / "failures.txt"
    args = [*PLUGIN, "--failures-log", str(log)] + (["-n", workers] if workers else [])
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    text = log.read_text(encoding="utf-8")
    headers = sorted(re.findall(r"^==== (\S+) \((\w+)\)$", text, re.M))
    assert headers == [("test_suite.py::test_many[11]", "call"), ("test_suite.py::test_many[3]", "call")]
    assert "planted failure 3" in text and "planted failure 11" in text
