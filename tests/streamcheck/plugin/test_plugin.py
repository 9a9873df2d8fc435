"""The pytest plugin, tested the way users meet it: pytest runs in a subprocess
(pytester.runpytest_subprocess) over small test files, on the sim backend."""
from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import pytest

from streamcheck.plugin import SEED_MOD, compare, per_test_seed, schedule_specs

# A producer on stream A, a consumer on stream B. `racy` never orders them (the
# consumer may read x before it is written); `fixed` makes B wait on an event.
PROGRAMS = '''
import json, os
import numpy as np
import pytest

def produce(x):
    x[...] = np.arange(4, dtype=x.dtype) + 1

def consume(y, x):
    y[...] = x * 2

def program(dev, join):
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc(4, fill=0.0, name="x")
    y = dev.alloc(4, fill=0.0, name="y")
    dev.launch(produce, (x,), stream=a, writes=[x])
    if join:
        b.wait_event(a.record())
    dev.launch(consume, (y, x), stream=b, reads=[x], writes=[y])
    dev.synchronize()
    return dev.host_read(y)

def note(name, value):
    # Tests run in workers under xdist: leave evidence in files, not on stdout.
    with open(os.path.join(os.environ["NOTES"], name), "w") as fh:
        json.dump(value, fh)
'''

SEEDS = PROGRAMS + '''
@pytest.mark.parametrize("i", range(4))
def test_seed(streamcheck_seed, request, i):
    note(f"seed-{i}", [request.node.nodeid, streamcheck_seed])

def test_fixed(run_schedules):
    run = run_schedules(lambda dev: program(dev, join=True))
    assert run.reference.tolist() == [2.0, 4.0, 6.0, 8.0]
    note("fixed", [r.schedule for r in run.results])
'''

RACY = PROGRAMS + '''
def test_racy(run_schedules):
    run_schedules(lambda dev: program(dev, join=False))
'''

HEADER = re.compile(r"^streamcheck: backend=(\w+) policy=(\S+) schedules=(\d+) check=(\w+) --streamcheck-seed=(\d+)$",
                    re.M)


@pytest.fixture(autouse=True)
def _notes_dir(tmp_path, monkeypatch):
    (tmp_path / "notes").mkdir()
    monkeypatch.setenv("NOTES", str(tmp_path / "notes"))
    # A terminal wide enough that no report line wraps, unless a test narrows it.
    monkeypatch.setenv("COLUMNS", "400")


def _run(pytester, tmp_path, *args):
    # Without hypothesis's plugin (these files do not use it): it costs ~1 s of CPU per run.
    return pytester.runpytest_subprocess("--streamcheck-backend=sim", "-p", "no:hypothesispytest", *args)


def _notes(tmp_path) -> dict:
    notes = {p.name: json.loads(p.read_text()) for p in (tmp_path / "notes").iterdir()}
    for p in (tmp_path / "notes").iterdir():
        p.unlink()
    return notes


def _header_seed(result) -> int:
    match = HEADER.search(result.stdout.str())
    assert match, result.stdout.str()
    return int(match.group(5))


def _failure_block(result) -> list:
    """The failure's schedule, mismatch, race report and replay lines (the `E` lines)."""
    return [line for line in result.stdout.lines if line.startswith("E ")]


# --- seeds ----------------------------------------------------------------------------------


def test_same_seed_same_per_test_seeds_and_schedules(pytester, tmp_path):
    pytester.makepyfile(test_seeds=SEEDS)
    first = _run(pytester, tmp_path, "--streamcheck-seed=1234")
    first.assert_outcomes(passed=5)
    assert _header_seed(first) == 1234
    assert "streamcheck: backend=sim policy=delay,random,pct schedules=8 check=on --streamcheck-seed=1234" \
        in first.stdout.str()
    notes = _notes(tmp_path)
    for i in range(4):
        nodeid, seed = notes[f"seed-{i}"]
        assert seed == (1234 + zlib.crc32(nodeid.encode())) % SEED_MOD
    assert len(set(seed for _, seed in (notes[f"seed-{i}"] for i in range(4)))) == 4
    # The same seed again, and a -k subset: the same per-test seeds and the same decisions.
    again = _run(pytester, tmp_path, "--streamcheck-seed=1234", "-k", "seed and 2 or fixed")
    again.assert_outcomes(passed=2, deselected=3)
    renotes = _notes(tmp_path)
    assert renotes["seed-2"] == notes["seed-2"]
    assert renotes["fixed"] == notes["fixed"]
    assert len(set(notes["fixed"])) > 1  # the schedules really differ from each other


def test_seed_is_random_per_run_and_last_replays_it(pytester, tmp_path):
    pytester.makepyfile(test_seeds=SEEDS)
    one = _run(pytester, tmp_path, "-k", "not fixed")
    two = _run(pytester, tmp_path, "-k", "not fixed")
    seed_one, seed_two = _header_seed(one), _header_seed(two)
    assert seed_one != seed_two  # random per run (collision chance 2^-32)
    notes_two = _notes(tmp_path)
    last = _run(pytester, tmp_path, "-k", "not fixed", "--streamcheck-seed=last")
    assert _header_seed(last) == seed_two
    assert _notes(tmp_path) == notes_two


def test_xdist_workers_use_the_controllers_seed(pytester, tmp_path):
    pytester.makepyfile(test_seeds=SEEDS, test_racy=RACY)
    result = _run(pytester, tmp_path, "-n", "2")
    result.assert_outcomes(passed=5, failed=1)
    seed = _header_seed(result)  # drawn by the controller, not given
    notes = _notes(tmp_path)
    for i in range(4):
        nodeid, got = notes[f"seed-{i}"]
        assert got == per_test_seed(seed, nodeid)
    # The controller's summary has what the worker found, and a replay with the controller's seed.
    out = result.stdout.str()
    assert "FAILED test_racy.py::test_racy: 1 race (RAW on x)" in out
    assert f"replay: pytest test_racy.py::test_racy --streamcheck-seed={seed} " in out
    # And the schedules the workers ran are the ones a single process runs with that seed.
    single = _run(pytester, tmp_path, f"--streamcheck-seed={seed}", "-k", "fixed")
    single.assert_outcomes(passed=1, deselected=5)
    assert _notes(tmp_path)["fixed"] == notes["fixed"]


# --- failures and replay --------------------------------------------------------------------


def test_racy_test_fails_with_report_and_replay_command_that_reproduces_it(pytester, tmp_path):
    pytester.makepyfile(test_racy=RACY)
    result = _run(pytester, tmp_path, "--streamcheck-seed=7")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "gave values that differ from the sequential reference" in out
    assert "RAW race on `x`" in out
    assert "first:  stream A: `produce` writes at test_racy.py:" in out
    assert "second: stream B: `consume` reads at test_racy.py:" in out
    # The summary lists races per test.
    assert re.search(r"FAILED test_racy.py::test_racy: 1 race \(RAW on x\); \d+ of 8 schedules gave wrong values", out)
    block = _failure_block(result)
    replay = [line for line in block if "replay: pytest" in line]
    assert len(replay) == 1
    command = replay[0].split("replay: ", 1)[1]
    assert "--streamcheck-seed=7" in command and "--streamcheck-replay=" in command
    argv = shlex.split(command)
    assert argv[0] == "pytest" and argv[1] == "test_racy.py::test_racy"
    again = _run(pytester, tmp_path, *argv[1:])
    again.assert_outcomes(failed=1)
    # Same schedule (policy, seed, decisions), same wrong values, same race report, same command.
    strip = re.compile(r"\(\d+ of \d+ schedules wrong\)")
    assert [strip.sub("", line) for line in _failure_block(again)] == [strip.sub("", line) for line in block]
    assert "(1 of 1 schedules wrong)" in again.stdout.str()


def test_races_fail_even_when_values_match_unless_check_is_relaxed(pytester, tmp_path):
    pytester.makepyfile(test_device=PROGRAMS + '''
def test_device(streamcheck_device):
    # Eager: the producer always ran first, so the value is right; the race is still there.
    assert program(streamcheck_device, join=False).tolist() == [2.0, 4.0, 6.0, 8.0]

def test_device_fixed(streamcheck_device):
    assert program(streamcheck_device, join=True).tolist() == [2.0, 4.0, 6.0, 8.0]
''')
    strict = _run(pytester, tmp_path, "--streamcheck-policy=eager", "--streamcheck-seed=3")
    strict.assert_outcomes(failed=1, passed=1)
    out = strict.stdout.str()
    assert "the happens-before checker found 1 race" in out
    assert "missing edge: stream B never waited for an event recorded on stream A" in out
    assert "replay: pytest test_device.py::test_device --streamcheck-seed=3" in out
    warn = _run(pytester, tmp_path, "--streamcheck-policy=eager", "--streamcheck-check=warn")
    warn.assert_outcomes(passed=2)
    assert "PASSED test_device.py::test_device: 1 race (RAW on x)" in warn.stdout.str()
    off = _run(pytester, tmp_path, "--streamcheck-policy=eager", "--streamcheck-check=off")
    off.assert_outcomes(passed=2)
    assert "RAW race" not in off.stdout.str()
    assert "races found in 0 tests" in off.stdout.str()


def test_marker_overrides_options(pytester, tmp_path):
    pytester.makepyfile(test_marked=PROGRAMS + '''
@pytest.mark.streamcheck(schedules=3, policies=["random"])
def test_marked(run_schedules):
    run = run_schedules(lambda dev: program(dev, join=True))
    note("marked", [r.spec.label for r in run.results])

@pytest.mark.streamcheck(check="off")
def test_unchecked(run_schedules):
    run = run_schedules(lambda dev: program(dev, join=False), policies=["eager"], schedules=2)
    note("unchecked", [len(run.races), [r.spec.label for r in run.results]])

@pytest.mark.streamcheck(schedules=0)
def test_bad_marker(run_schedules):
    run_schedules(lambda dev: 0)
''')
    result = _run(pytester, tmp_path, "--streamcheck-schedules=5", "--streamcheck-policy=delay")
    result.assert_outcomes(passed=2, failed=1)
    notes = _notes(tmp_path)
    assert notes["marked"] == ["random:0", "random:1", "random:2"]
    assert notes["unchecked"] == [0, ["eager:0", "eager:1"]]
    assert "@pytest.mark.streamcheck on test_marked.py::test_bad_marker: schedules='0' is not valid; " \
           "accepted values: an integer >= 1" in result.stdout.str()
    # The header's settings are the session's: it says which tests run others.
    assert ("streamcheck: @pytest.mark.streamcheck overrides these in 3 tests: test_marked.py::test_marked "
            "(policy=random schedules=3); test_marked.py::test_unchecked (check=off); test_marked.py::test_bad_marker "
            "(schedules=0)") in result.stdout.lines


def test_trace_dir_gets_the_failing_runs_trace(pytester, tmp_path):
    pytester.makepyfile(test_racy=RACY)
    result = _run(pytester, tmp_path, "--streamcheck-seed=7", "--streamcheck-trace-dir=traces")
    result.assert_outcomes(failed=1)
    out = pytester.path / "traces" / "test_racy.py_test_racy"
    result.stdout.fnmatch_lines([f"*trace files: {out}/ (perfetto.json for ui.perfetto.dev, timeline.png*"])
    ops = json.loads((out / "trace.json").read_text())
    assert [op["name"] for op in ops if op["op"] == "Launch"] == ["produce", "consume"]
    report = (out / "report.txt").read_text()
    assert "RAW race on `x`" in report
    # The schedule of the failing run, as the failure printed it.
    decisions = re.search(r"decisions (\S+)$", result.stdout.str(), re.M).group(1)
    assert f", decisions {decisions}" in report
    assert "not written" not in report, report
    assert "traceEvents" in json.loads((out / "perfetto.json").read_text())
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- reports: junitxml, terminal width, long decisions, trace dir, `last` ----------------------

JUNIT = PROGRAMS + '''
def test_racy_run(run_schedules):
    run_schedules(lambda dev: program(dev, join=False))

@pytest.mark.streamcheck(check="warn")
def test_warned(streamcheck_device):
    assert program(streamcheck_device, join=False).tolist() == [2.0, 4.0, 6.0, 8.0]

def test_own_failure(streamcheck_device):
    program(streamcheck_device, join=False)
    assert False, "the test's own assertion"
'''
PRODUCE_LINE = PROGRAMS.splitlines().index("    dev.launch(produce, (x,), stream=a, writes=[x])") + 1


def _junit_cases(path) -> dict:
    """name -> (failure text or None, {property name: value}) from a junitxml file."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        failure = case.find("failure")
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases[case.get("name")] = (None if failure is None else failure.text, properties)
    return cases


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["single", "xdist"])
def test_junitxml_gets_the_race_reports(pytester, tmp_path, xdist):
    pytester.makeini("[pytest]\n")
    (pytester.mkdir("sub") / "test_junit.py").write_text(JUNIT)
    result = _run(pytester, tmp_path, "--streamcheck-policy=eager", "--streamcheck-seed=7", "--junitxml=out.xml",
                  *xdist)
    result.assert_outcomes(failed=2, passed=1)
    cases = _junit_cases(pytester.path / "out.xml")
    assert set(cases) == {"test_racy_run", "test_warned", "test_own_failure"}
    racy_text, _ = cases["test_racy_run"]
    assert "values matched the reference in all 8 schedules" in racy_text
    own_text, _ = cases["test_own_failure"]
    assert "the test's own assertion" in own_text  # the race report beside the test's own failure
    for text in (racy_text, own_text):
        assert "RAW race on `x` bytes [0, 16)" in text
        assert "missing edge: stream B never waited for an event recorded on stream A" in text
    assert cases["test_warned"][0] is None  # passed: the property alone carries the report
    for name, (_, properties) in cases.items():
        found = json.loads(properties["streamcheck"])
        [race] = found["races"]
        assert (race["kind"], race["buffer"], race["start"], race["stop"]) == ("RAW", "x", 0, 16), name
        # Relative to the rootdir, as node ids are; not the bare file name.
        assert race["first"]["site"] == f"sub/test_junit.py:{PRODUCE_LINE}", name
        assert race["first"]["name"] == "produce" and race["second"]["name"] == "consume"
        assert found["replay"].startswith(f"pytest sub/test_junit.py::{name} --streamcheck-seed=7 "), name
        assert found["schedule"].startswith("eager:0 = eager schedule seed "), name
    assert json.loads(cases["test_racy_run"][1]["streamcheck"])["schedules"] == 8


def test_reports_wrap_at_the_terminal_width_and_replay_lines_stay_whole(pytester, tmp_path, monkeypatch):
    pytester.makepyfile(test_racy=RACY)
    wide = _run(pytester, tmp_path, "--streamcheck-seed=7")
    monkeypatch.setenv("COLUMNS", "72")  # what pytest's TerminalWriter reads when stdout is no terminal
    narrow = _run(pytester, tmp_path, "--streamcheck-seed=7")
    wide_block, block = _failure_block(wide), _failure_block(narrow)
    assert max(len(line) for line in wide_block) > 100  # there was something to wrap
    assert len(block) > len(wide_block)
    long = [line for line in block if len(line) > 72]
    assert len(long) == 1 and "replay: pytest test_racy.py::test_racy" in long[0]  # pasted back whole
    assert long[0] in wide_block
    # No word lost or moved: the wrapped text is the unwrapped one.
    assert " ".join(line[1:] for line in block).split() == " ".join(line[1:] for line in wide_block).split()
    # Continuation lines are indented four past the line they continue.
    edge = next(i for i, line in enumerate(block) if "missing edge:" in line)
    assert block[edge].startswith("E         missing edge: stream B never waited")
    assert block[edge + 1].startswith("E             ") and not block[edge + 1][14].isspace()
    # The terminal summary too, but for its replay line.
    summary = narrow.stdout.str().split("= streamcheck =")[1].splitlines()[1:]
    # ours only, up to pytest's next section (under CI=true pytest never truncates its short summary)
    summary = summary[:next((i for i, line in enumerate(summary) if line.startswith("=")), len(summary))]
    assert summary[0].startswith("FAILED test_racy.py::test_racy: 1 race (RAW on x);")
    assert summary[1].startswith("    ") and "replay:" not in summary[1]
    assert all(len(line) <= 72 for line in summary if "replay: pytest" not in line)


LONG_DECISIONS = PROGRAMS + '''
def test_long(run_schedules):
    def steps(dev):
        a, b = dev.stream("A"), dev.stream("B")
        x = dev.alloc(4, fill=0.0, name="x")
        y = dev.alloc(4, fill=0.0, name="y")
        for _ in range(60):
            dev.launch(produce, (x,), stream=a, writes=[x])
            dev.launch(consume, (y, x), stream=b, reads=[x], writes=[y])
        dev.synchronize()
        return dev.host_read(y)
    run_schedules(steps, policies=["random"], schedules=1)
'''


def test_long_decisions_are_elided_in_the_message_and_kept_whole_elsewhere(pytester, tmp_path):
    pytester.makepyfile(test_long=LONG_DECISIONS)
    result = _run(pytester, tmp_path, "--streamcheck-seed=7", "--streamcheck-trace-dir=traces", "--junitxml=out.xml")
    result.assert_outcomes(failed=1)
    report = (pytester.path / "traces" / "test_long.py_test_long" / "report.txt").read_text()
    full = re.search(r"^schedule: random\(seed=\d+\) schedule seed \d+, decisions (\S+)$", report, re.M).group(1)
    assert len(full) > 200
    shown = re.search(r"schedule: random:0 = random\(seed=\d+\) schedule seed \d+, decisions (.*)$",
                      result.stdout.str(), re.M).group(1)
    assert shown == (f"{full[:40]}[...]{full[-20:]} ({len(full)} characters; all of them in report.txt under "
                     "--streamcheck-trace-dir and in --junitxml)")
    assert full not in result.stdout.str()
    _, properties = _junit_cases(pytester.path / "out.xml")["test_long"]
    assert json.loads(properties["streamcheck"])["schedule"].endswith(f", decisions {full}")


def test_one_schedule_is_one_schedule_and_its_trace_is_the_one_named(pytester, tmp_path):
    pytester.makepyfile(test_one=PROGRAMS + '''
def test_one(run_schedules):
    run_schedules(lambda dev: program(dev, join=False), policies=["eager"], schedules=1)
''')
    result = _run(pytester, tmp_path, "--streamcheck-seed=5", "--streamcheck-trace-dir=traces")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "values matched the reference in the 1 schedule (the race has not struck yet)" in out
    assert "streamcheck: 1 test, 1 schedule, races found in 1 test; --streamcheck-seed=5" in out
    seed = schedule_specs(per_test_seed(5, "test_one.py::test_one"), ("eager",), 1)[0].seed
    assert f"schedule: eager:0 = eager schedule seed {seed}, decisions" in out
    # The trace files come from that schedule, not from the sequential reference.
    report = (pytester.path / "traces" / "test_one.py_test_one" / "report.txt").read_text()
    assert f"\nschedule: eager schedule seed {seed}, decisions" in report


def test_relative_trace_dir_is_taken_from_where_pytest_started(pytester, tmp_path, monkeypatch):
    pytester.makeini("[pytest]\n")
    sub = pytester.mkdir("sub")
    (sub / "test_racy.py").write_text(RACY)
    monkeypatch.chdir(sub)  # the rootdir stays pytester.path (its pytest.ini)
    result = _run(pytester, tmp_path, "--streamcheck-seed=7", "--streamcheck-trace-dir=traces", "--junitxml=out.xml")
    result.assert_outcomes(failed=1)
    assert (sub / "out.xml").is_file()  # where --junitxml put its file: the trace dir goes beside it
    traces = sub / "traces" / "sub_test_racy.py_test_racy"
    assert "RAW race on `x`" in (traces / "report.txt").read_text()
    assert f"trace files: {traces}/" in result.stdout.str()
    assert not (pytester.path / "traces").exists()
    # From an ini file, relative to the rootdir, as cache_dir is.
    pytester.makeini("[pytest]\nstreamcheck_trace_dir = ini-traces\n")
    _run(pytester, tmp_path, "--streamcheck-seed=7").assert_outcomes(failed=1)
    assert (pytester.path / "ini-traces" / "sub_test_racy.py_test_racy" / "report.txt").is_file()


def test_last_is_the_last_run_not_a_collect_only(pytester, tmp_path):
    pytester.makepyfile(test_seeds=SEEDS)
    ran = _run(pytester, tmp_path, "--streamcheck-seed=1111", "-k", "not fixed")
    ran.assert_outcomes(passed=4)
    collected = _run(pytester, tmp_path, "--streamcheck-seed=2222", "--co")
    assert _header_seed(collected) == 2222 and "5 tests collected" in collected.stdout.str()
    assert _header_seed(_run(pytester, tmp_path, "--co")) != 1111  # a random one, not stored either
    last = _run(pytester, tmp_path, "--streamcheck-seed=last", "-k", "not fixed")
    assert _header_seed(last) == 1111


# --- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--streamcheck-policy=delay,bogus"], "--streamcheck-policy='delay,bogus' is not valid; accepted values: "
                                           "a comma-separated list of sequential, eager, delay, random, pct"),
    (["--streamcheck-seed=abc"], "--streamcheck-seed='abc' is not valid; accepted values: an integer in"),
    (["--streamcheck-schedules=0"], "--streamcheck-schedules='0' is not valid; accepted values: an integer >= 1"),
    (["--streamcheck-backend=tpu"], "--streamcheck-backend='tpu' is not valid; accepted values: auto, sim, cupy"),
    (["--streamcheck-check=maybe"], "--streamcheck-check='maybe' is not valid; accepted values: on, warn, off"),
    (["--streamcheck-replay=delay"], "--streamcheck-replay='delay' is not valid; accepted values: POLICY:INDEX"),
    (["-o", "streamcheck_delay_steps=-1"], "ini option streamcheck_delay_steps='-1' is not valid"),
    (["--streamcheck-seed=last", "-p", "no:cacheprovider"], "no previous seed is stored"),
    # As repro and fuzz refuse an output file there: a typo must not create a tree of directories.
    (["--streamcheck-trace-dir=/nonexistent/dir"], "--streamcheck-trace-dir='/nonexistent/dir': the directory "
                                                   "/nonexistent does not exist; create it or choose another place"),
])
def test_bad_option_values_are_usage_errors(pytester, args, message):
    # In-process: pytest stops in pytest_configure, before any test runs, so nothing leaks.
    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_disabled_plugin_leaves_no_options_or_fixtures(pytester):
    pytester.makepyfile(test_uses=RACY)
    no_option = pytester.runpytest_inprocess("-p", "no:streamcheck", "--streamcheck-seed=1")
    assert no_option.ret == pytest.ExitCode.USAGE_ERROR
    assert "unrecognized arguments: --streamcheck-seed=1" in no_option.stderr.str()
    no_fixture = pytester.runpytest_subprocess("-p", "no:streamcheck")
    no_fixture.assert_outcomes(errors=1)
    assert "fixture 'run_schedules' not found" in no_fixture.stdout.str()
    assert "streamcheck: backend=" not in no_fixture.stdout.str()


LOADED = '''
import sys

def test_loaded(streamcheck_seed, run_schedules, request):
    names = {name for name, _ in request.config.pluginmanager.list_name_plugin()}
    assert {f"streamcheck.plugin.{feature}" for feature in ("options", "seeds", "reporting", "fixtures",
                                                            "profiles")} <= names
    assert not {"cupy", "torch", "hypothesis", "streamcheck.device.api"} & set(sys.modules)
'''


@pytest.mark.parametrize("how", [["-n", "2"], ["-p", "streamcheck.plugin"]], ids=["entry-point-xdist", "dash-p"])
def test_the_plugin_loads_its_features_without_warnings_or_heavy_imports(pytester, tmp_path, monkeypatch, how):
    # Each feature module is a plugin pytest imports itself; one imported too early makes pytest
    # warn that it cannot rewrite it (an error under -W error). -p: as without the entry point.
    if how[0] == "-p":
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_loaded=LOADED)
    result = _run(pytester, tmp_path, "-W", "error", *how)
    result.assert_outcomes(passed=1)
    assert HEADER.search(result.stdout.str())


def test_hypothesis_profiles_are_selectable(pytester, monkeypatch):
    pytester.makepyfile(test_profile='''
from hypothesis import settings
import os

def test_profile():
    current = settings.default
    name = os.environ["WANT"]
    assert settings.get_current_profile_name() == name
    if name == "streamcheck-ci":
        assert current.derandomize and current.print_blob and current.max_examples <= 50
    else:
        assert current.max_examples >= 10_000
''')
    monkeypatch.setenv("WANT", "streamcheck-ci")
    monkeypatch.setenv("STREAMCHECK_HYPOTHESIS_PROFILE", "ci")  # the short name works in the environment
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
    monkeypatch.setenv("WANT", "streamcheck-fuzz")  # the command line wins over the environment
    pytester.runpytest_subprocess("--hypothesis-profile=streamcheck-fuzz").assert_outcomes(passed=1)


# --- edges: what the plugin refuses, and says why ------------------------------------------------

EDGES = PROGRAMS + '''
def test_no_schedules(run_schedules):
    run_schedules(lambda dev: program(dev, join=True), schedules=0)

def test_negative_schedules(run_schedules):
    run_schedules(lambda dev: program(dev, join=True), schedules=-2)

def test_generator(run_schedules):
    def steps(dev):  # the docs' decode, without list(...)
        yield program(dev, join=True)
    run_schedules(steps)
'''


def _inprocess(pytester, *args):
    return pytester.runpytest_inprocess("--streamcheck-backend=sim", "-p", "no:hypothesispytest", *args)


def test_run_schedules_refuses_no_schedules_and_a_program_that_returns_a_generator(pytester):
    pytester.makepyfile(test_edges=EDGES)
    result = _inprocess(pytester)
    result.assert_outcomes(failed=3)  # a clean program too: no schedule ran, so nothing was checked
    out = result.stdout.str()
    assert "streamcheck: run_schedules(schedules=...)='0' is not valid; accepted values: an integer >= 1" in out
    assert "streamcheck: run_schedules(schedules=...)='-2' is not valid" in out
    assert ("TypeError: streamcheck: run_schedules: the program returned a generator, which runs only when iterated, "
            "after its schedule; return a list of it (return list(...))") in out
    assert "IndexError" not in out and "schedules wrong" not in out


MARKED_SIXTEEN = PROGRAMS + '''
@pytest.mark.streamcheck(policies=["delay"], schedules=16)
def test_sixteen(run_schedules):
    run = run_schedules(lambda dev: program(dev, join=True))
    note("ran", [r.spec.label for r in run.results])
'''


@pytest.mark.parametrize("replay", ["random:0", "delay:16", "delay:99"])
def test_a_replay_the_test_never_runs_is_refused_with_the_ones_it_does(pytester, tmp_path, replay):
    pytester.makepyfile(test_marked=MARKED_SIXTEEN)
    result = _inprocess(pytester, f"--streamcheck-replay={replay}")
    result.assert_outcomes(failed=1)
    assert (f"streamcheck: --streamcheck-replay={replay} is not a schedule this test runs (its policies and count "
            "come from the options, its marker or run_schedules' arguments); accepted values: delay:0 to delay:15") \
        in result.stdout.str()
    assert not (tmp_path / "notes" / "ran").exists()


def test_a_replay_the_test_runs_runs_it_alone(pytester, tmp_path):
    pytester.makepyfile(test_marked=MARKED_SIXTEEN)
    _inprocess(pytester, "--streamcheck-replay=delay:15").assert_outcomes(passed=1)
    assert _notes(tmp_path)["ran"] == ["delay:15"]


def test_a_replay_line_names_the_policies_and_count_that_make_its_schedule(pytester):
    # The schedule a replay names must be one of the test's: with the session's own policies and
    # count, the replay line carries them.
    pytester.makepyfile(test_racy=RACY)
    options = ("--streamcheck-seed=7", "--streamcheck-policy=random", "--streamcheck-schedules=12")
    first = _inprocess(pytester, *options)
    first.assert_outcomes(failed=1)
    [command] = [line.split("replay: ", 1)[1] for line in _failure_block(first) if "replay: pytest" in line]
    argv = shlex.split(command)
    assert argv[2:5] == ["--streamcheck-seed=7", "--streamcheck-backend=sim", "--streamcheck-policy=random"]
    assert argv[5] == "--streamcheck-schedules=12" and argv[6].startswith("--streamcheck-replay=random:")
    again = _inprocess(pytester, *argv[1:])
    again.assert_outcomes(failed=1)
    assert "(1 of 1 schedules wrong)" in again.stdout.str()


@pytest.mark.parametrize("section", ["tool.pytest.ini_options", "tool.pytest"])
def test_the_policy_ini_takes_a_toml_list_as_the_marker_does(pytester, section):
    pytester.makepyprojecttoml(f'[{section}]\nstreamcheck_policy = ["random", "pct"]\n')
    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    result = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--co")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    assert "streamcheck: backend=" in result.stdout.str() and " policy=random,pct " in result.stdout.str()
    pytester.makepyprojecttoml(f'[{section}]\nstreamcheck_policy = ["random", "bogus"]\n')
    bad = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--co")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "ini option streamcheck_policy='random,bogus' is not valid" in bad.stderr.str()


# A recording on a machine without a GPU: the recorder on a Gpu that knows no library. The
# test records what no CUDA program could (a synchronize of a stream never created): the
# checker refuses it, a hole in the trace where a race could hide.
REFUSED = '''
import types
import pytest
import streamcheck.record.gpu
import streamcheck.record.instrument
from streamcheck.record import recorder
from streamcheck.core import trace as T

@pytest.fixture(autouse=True)
def a_recording_without_a_gpu(monkeypatch):
    monkeypatch.setattr(streamcheck.record.gpu, "cuda_device_present", lambda: True)
    monkeypatch.setattr(streamcheck.record.instrument, "start",
                        lambda **kw: recorder.Recorder(types.SimpleNamespace(library_dirs=()), **kw))
    monkeypatch.setattr(streamcheck.record.instrument, "stop", lambda: None)

def test_refused(streamcheck_gpu):
    streamcheck_gpu.record(T.StreamSync(0, streamcheck_gpu.site(), stream=99))

def test_accepted(streamcheck_gpu):
    streamcheck_gpu.record(T.StreamSync(0, streamcheck_gpu.site(), stream=0))
'''


def test_a_record_the_checker_refuses_fails_a_streamcheck_gpu_test_with_the_record(pytester):
    pytester.makepyfile(test_refused=REFUSED)
    # auto, not sim: --streamcheck-backend=sim runs streamcheck_gpu's code with CUDA emulated instead.
    result = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)  # test_refused passed its call and errs in teardown
    out = result.stdout.str()
    assert "ERROR at teardown of test_refused" in out
    assert "streamcheck: 1 internal error of the recorder: the trace is incomplete, so the check is too" in out
    assert re.search(r"^E?\s+StreamSync at .*: unknown stream 99", out, re.M), out
    assert re.search(r"^E?\s+refused record #1: StreamSync\(thread=0, site=.*stream=99", out, re.M), out
    assert "replay: pytest test_refused.py::test_refused --streamcheck-seed=" in out


# --- the pieces, directly -----------------------------------------------------------------------


def test_schedule_seeds_name_a_schedule_for_good():
    specs = schedule_specs(99, ("delay", "random"), 6)
    assert [s.label for s in specs] == ["delay:0", "random:0", "delay:1", "random:1", "delay:2", "random:2"]
    # The k-th schedule of a policy keeps its seed whatever the count or the other policies.
    alone = schedule_specs(99, ("random",), 3)
    assert [s.seed for s in alone] == [s.seed for s in specs if s.policy == "random"]
    assert schedule_specs(99, ("delay", "random"), 6, replay=("random", 2)) == [specs[5]]
    assert len({s.seed for s in specs}) == 6
    assert schedule_specs(100, ("delay",), 1)[0].seed != specs[0].seed


def test_compare_reports_the_first_difference():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert compare(a, a.copy()) is None
    nan = np.full(3, np.nan, np.float32)
    assert compare(nan, nan.copy()) is None  # garbage in both: same garbage, same result
    b = a.copy()
    b[1, 2] += 1e-6
    assert compare(a, b) == ("result: 1 of 6 elements differ (exact); first at (1, 2): "
                             "got np.float32(5.000001), want np.float32(5.0)")
    assert compare(a, b, atol=1e-5) is None
    assert "float64[2, 3], the reference is float32[2, 3]" in compare(a, b.astype(np.float64))
    assert compare({"out": [a, 1]}, {"out": [a, 2]}) == "result['out'][1]: got 2, want 1"
    assert compare((a,), (a, a)) == "result: 2 items, the reference has 1"


def test_streamcheck_gpu_on_the_cupy_backend_skips_with_the_reason_without_a_gpu(pytester, monkeypatch):
    monkeypatch.setattr("streamcheck.record.gpu.cuda_device_present", lambda: False)
    monkeypatch.setattr("streamcheck.plugin.options.BACKENDS", ("auto", "sim", "cupy"))
    pytester.makepyfile("""
        import streamcheck.plugin.options as options

        def test_uses_the_gpu(streamcheck_gpu):
            raise AssertionError("must not run without a GPU")
    """)
    pytester.makeconftest("""
        import pytest
        import streamcheck.plugin.options as options

        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):  # as if --streamcheck-backend=cupy had found a GPU at start-up
            settings = config.stash[options.SETTINGS_KEY]
            config.stash[options.SETTINGS_KEY] = type(settings)(**{**settings.__dict__, "backend": "cupy"})
    """)
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider", "--streamcheck-seed=1")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*streamcheck_gpu with --streamcheck-backend=cupy needs an NVIDIA GPU*"])