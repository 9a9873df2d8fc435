"""The plugin stays out of the runs that do not use it (streamcheck/plugin/usage.py): installed, it
is loaded by every project in the environment. Header, cache, imports and environment of a
foreign project's run are the same with and without it; a run that uses streamcheck (a test
with its fixtures or markers, or one of its options) gets its header and seed."""
from __future__ import annotations

import json
import re

import numpy  # noqa: F401 (in-process runs drop the modules they import; numpy cannot load twice in a process)
import pytest

from streamcheck.plugin import FIXTURES, MARKERS
from tests.streamcheck.plugin.test_xdist import notes_folder

SEED_LINE = re.compile(r"^streamcheck: backend=\w+ policy=\S+ schedules=\d+ check=\w+ --streamcheck-seed=(\d+)$", re.M)

# A project of its own: a marker named as ours once was, and a conftest that notes what its
# processes imported by the end of collection and which GPUs they were given.
FOREIGN_CONFTEST = '''
import json, os, sys

def pytest_collection_finish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(os.environ["NOTES"], worker), "w") as fh:
        json.dump({"modules": sorted(m for m in ("numpy", "cupy", "torch", "hypothesis") if m in sys.modules)
                   + sorted(m for m in sys.modules if m.startswith("streamcheck") and m != "streamcheck"
                            and not m.startswith("streamcheck.plugin")),
                   "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}, fh)
'''
FOREIGN_TESTS = '''
import pytest

@pytest.mark.gpu_timing
def test_timed():
    pass

def test_plain():
    pass
'''
FOREIGN_INI = "[pytest]\nmarkers =\n    gpu_timing: this project's own timing tests\n"


@pytest.fixture
def notes(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    # This suite may itself run under xdist: the foreign runs are not our workers.
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    return notes_folder(tmp_path, monkeypatch)


def _foreign_project(pytester):
    pytester.makeini(FOREIGN_INI)
    pytester.makeconftest(FOREIGN_CONFTEST)
    pytester.makepyfile(test_foreign=FOREIGN_TESTS)


def _cache_files(pytester) -> set:
    cache = pytester.path / ".pytest_cache"
    return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()} if cache.exists() else set()


def _without_timings_and_plugins(out: str) -> list:
    lines = [line for line in out.splitlines() if not line.startswith("plugins:")]
    return [re.sub(r" in [\d.]+s", " in Ns", line) for line in lines]


def test_a_foreign_suite_runs_the_same_with_and_without_the_plugin(pytester, notes, monkeypatch):
    _foreign_project(pytester)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # a suite whose workers each use both GPUs
    runs = {}
    for name, args in (("with", ()), ("without", ("-p", "no:streamcheck"))):
        cache = pytester.path / ".pytest_cache"
        if cache.exists():
            pytester.run("rm", "-rf", str(cache))
        result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "-p", "no:hypothesispytest", *args)
        result.assert_outcomes(passed=2)  # the project's own gpu_timing test is not skipped
        runs[name] = (result.stdout.str(), _cache_files(pytester), notes())
    (out_with, cache_with, seen_with), (out_without, cache_without, seen_without) = runs["with"], runs["without"]
    assert "streamcheck-" in next(line for line in out_with.splitlines() if line.startswith("plugins:"))
    assert _without_timings_and_plugins(out_with) == _without_timings_and_plugins(out_without)
    assert "streamcheck" not in "\n".join(_without_timings_and_plugins(out_with))
    assert cache_with == cache_without and not any("streamcheck" in name for name in cache_with)
    assert set(seen_with) == {"gw0", "gw1"} and seen_with == seen_without
    for seen in seen_with.values():  # pinning is asked for (--streamcheck-gpus): each worker keeps both GPUs
        assert seen == {"modules": [], "visible": "0,1"}


def test_the_header_says_in_one_line_when_the_python_checker_stands_in(pytester, monkeypatch):
    pytester.makepyfile(test_plain="def test_plain(): pass")
    line = "streamcheck: native checker unavailable (STREAMCHECK_NATIVE_CHECKER=0): using the Python checker"
    monkeypatch.setenv("STREAMCHECK_NATIVE_CHECKER", "0")
    lines = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--streamcheck-check=warn").stdout.lines
    seed = next(i for i, text in enumerate(lines) if SEED_LINE.search(text))
    assert lines[seed + 1] == line and lines.count(line) == 1
    assert line not in pytester.runpytest_inprocess("-p", "no:hypothesispytest").stdout.lines  # unused: silent
    monkeypatch.delenv("STREAMCHECK_NATIVE_CHECKER")
    used = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--streamcheck-check=warn").stdout.str()
    assert SEED_LINE.search(used) and "native checker" not in used  # built here (tests/streamcheck/core/test_fast.py)


def test_header_and_seed_only_where_streamcheck_is_used(pytester):
    pytester.makepyfile(test_plain="def test_plain(): pass")
    plain = pytester.runpytest_inprocess("-p", "no:hypothesispytest")
    plain.assert_outcomes(passed=1)
    assert "streamcheck:" not in plain.stdout.str()
    assert not any("streamcheck" in name for name in _cache_files(pytester))
    # A test that uses a fixture: the header comes after "collected", and its seed is kept for `last`.
    pytester.makepyfile(test_uses="def test_uses(streamcheck_seed): pass")
    used = pytester.runpytest_inprocess("-p", "no:hypothesispytest")
    used.assert_outcomes(passed=2)
    lines = used.stdout.lines
    collected = next(i for i, line in enumerate(lines) if line.startswith("collected 2 items"))
    assert SEED_LINE.match(lines[collected + 1]), lines
    seed = int(SEED_LINE.match(lines[collected + 1]).group(1))
    assert _cache_files(pytester) >= {"v/streamcheck/seed"}
    last = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--streamcheck-seed=last", "test_uses.py")
    assert int(SEED_LINE.search(last.stdout.str()).group(1)) == seed
    # An option given: the run uses streamcheck whatever its tests, and says so at the top.
    option = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--streamcheck-check=warn", "test_plain.py")
    header = option.stdout.str().split("collected")[0]
    assert SEED_LINE.search(header.replace("check=warn", "check=on"))


def test_under_xdist_the_controller_learns_it_from_its_workers(pytester):
    # The controller collects nothing: a worker that collected a test using streamcheck says so.
    pytester.makepyfile(test_uses="def test_uses(streamcheck_seed): pass")
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=1)
    summary = result.stdout.str().split("= streamcheck =")[1]
    seed = int(SEED_LINE.search(summary).group(1))
    assert json.loads((pytester.path / ".pytest_cache" / "v" / "streamcheck" / "seed").read_text()) == seed


def test_a_marker_alone_uses_streamcheck(pytester):
    pytester.makepyfile(test_marked='''
import pytest

@pytest.mark.streamcheck(check="warn")
def test_marked():
    pass
''')
    result = pytester.runpytest_inprocess("-p", "no:hypothesispytest")
    assert "streamcheck: backend=" in result.stdout.str()


def test_loading_the_plugin_imports_nothing_heavy(pytester, notes):
    # Even where they are installed (numpy and torch are here): the header is what imported numpy.
    _foreign_project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest")
    result.assert_outcomes(passed=2)
    assert notes() == {"main": {"modules": [], "visible": None}}


def test_the_names_it_looks_for_are_its_fixtures_and_markers(pytester):
    result = pytester.runpytest_inprocess("--fixtures", "-p", "no:hypothesispytest")
    ours = re.search(r"fixtures defined from streamcheck\.plugin\.fixtures -+\n(.*?)(\n-|\Z)", result.stdout.str(),
                     re.S).group(1)
    assert set(re.findall(r"^(\w+)", ours, re.M)) == set(FIXTURES)
    markers = pytester.runpytest_inprocess("--markers", "-p", "no:hypothesispytest").stdout.str()
    assert {name for name in re.findall(r"^@pytest\.mark\.(\w+)", markers, re.M) if name.startswith("streamcheck")} \
        == set(MARKERS)


def test_a_foreign_fixture_named_as_ours_does_not_use_streamcheck(pytester, notes):
    # A project of its own with a fixture called `run_schedules`: its tests ask for *its* fixture.
    pytester.makeconftest('''
import json, os, sys
import pytest

@pytest.fixture
def run_schedules():
    return lambda fn: fn()

def pytest_sessionfinish(session):
    with open(os.path.join(os.environ["NOTES"], "main"), "w") as fh:
        json.dump(sorted(m for m in sys.modules if m.startswith("streamcheck.core")), fh)
''')
    pytester.makepyfile(test_own="def test_own(run_schedules): assert run_schedules(lambda: 3) == 3")
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest")
    result.assert_outcomes(passed=1)
    assert not [line for line in result.stdout.lines if line.startswith("streamcheck") or "= streamcheck =" in line]
    assert not any("streamcheck" in name for name in _cache_files(pytester))
    assert notes() == {"main": []}


def test_our_fixture_under_a_fixture_that_overrides_it_still_uses_streamcheck(pytester):
    # A conftest fixture of the same name that asks for ours (pytest's override idiom) uses ours.
    pytester.makeconftest('''
import pytest

@pytest.fixture
def streamcheck_seed(streamcheck_seed):
    return streamcheck_seed
''')
    pytester.makepyfile(test_uses="def test_uses(streamcheck_seed): assert isinstance(streamcheck_seed, int)")
    result = pytester.runpytest_inprocess("-p", "no:hypothesispytest")
    result.assert_outcomes(passed=1)
    assert SEED_LINE.search(result.stdout.str())
