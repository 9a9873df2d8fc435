"""pytest-xdist across GPUs (streamcheck/plugin/workers.py, the example database of profiles.py):
pytest runs in a subprocess with `-n`, and the tests inside leave what their worker saw in files.
This machine has no GPU: --streamcheck-gpus=N stands in for N GPUs, and CUDA_VISIBLE_DEVICES for
the GPUs a process may use. `--dist each` runs every test on every worker, so each worker is seen."""
from __future__ import annotations

import json
import re

import pytest

from streamcheck.plugin import per_test_seed
from streamcheck.plugin.workers import pinning, visible_gpus, worker_index

SEEN = '''
import json, os
import pytest

@pytest.mark.parametrize("i", range(2))
def test_seen(streamcheck_seed, request, i):
    from streamcheck.plugin import base_seed
    worker = os.environ["PYTEST_XDIST_WORKER"]
    with open(os.path.join(os.environ["NOTES"], f"{worker}-{i}"), "w") as fh:
        json.dump({"worker": worker, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "nodeid": request.node.nodeid,
                   "base": base_seed(request.config), "seed": streamcheck_seed}, fh)
'''

SEED_HEADER = re.compile(r"--streamcheck-seed=(\d+)$", re.M)


def notes_folder(tmp_path, monkeypatch):
    """A folder the test programs write their notes to ($NOTES), and its reader: the notes so
    far, by file name, each read once."""
    folder = tmp_path / "notes"
    folder.mkdir()
    monkeypatch.setenv("NOTES", str(folder))

    def read() -> dict:
        seen = {p.name: json.loads(p.read_text()) for p in folder.iterdir()}
        for p in folder.iterdir():
            p.unlink()
        return seen
    return read


@pytest.fixture
def notes(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    return notes_folder(tmp_path, monkeypatch)


def run(pytester, *args):
    return pytester.runpytest_subprocess("--streamcheck-backend=sim", "-p", "no:hypothesispytest", "-p", "xdist",
                                         *args)


def test_each_worker_is_pinned_to_its_own_gpu(pytester, notes):
    pytester.makepyfile(test_seen=SEEN)
    result = run(pytester, "-n", "2", "--dist", "each", "--streamcheck-gpus=2")
    result.assert_outcomes(passed=4)
    seen = notes()
    assert {(n["worker"], n["visible"]) for n in seen.values()} == {("gw0", "0"), ("gw1", "1")}
    assert "streamcheck: xdist workers pinned one per GPU (CUDA_VISIBLE_DEVICES): gw0 on GPU 0, gw1 on GPU 1" \
        in result.stdout.str()


def test_fewer_gpus_than_workers_are_shared_round_robin_and_said(pytester, notes):
    pytester.makepyfile(test_seen=SEEN)
    result = run(pytester, "-n", "3", "--dist", "each", "--streamcheck-gpus=2")
    result.assert_outcomes(passed=6)
    assert {(n["worker"], n["visible"]) for n in notes().values()} == {("gw0", "0"), ("gw1", "1"), ("gw2", "0")}
    result.stdout.fnmatch_lines(["streamcheck: 3 xdist workers but 2 GPUs: fewer GPUs than workers, so the run goes "
                                 "on with the GPUs there are and the workers share them round-robin "
                                 "(CUDA_VISIBLE_DEVICES): gw0, gw2 on GPU 0; gw1 on GPU 1"])


def test_workers_take_the_gpus_cuda_visible_devices_lists(pytester, notes, monkeypatch):
    pytester.makepyfile(test_seen=SEEN)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # auto: the GPUs this process may use
    result = run(pytester, "-n", "2", "--dist", "each", "--streamcheck-gpus=auto")
    result.assert_outcomes(passed=4)
    assert {(n["worker"], n["visible"]) for n in notes().values()} == {("gw0", "5"), ("gw1", "7")}


def test_no_gpus_or_no_xdist_pins_nothing(pytester, notes, monkeypatch):
    pytester.makepyfile(test_seen=SEEN.replace('os.environ["PYTEST_XDIST_WORKER"]',
                                               'os.environ.get("PYTEST_XDIST_WORKER", "main")'))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU machine: nothing to pin to
    run(pytester, "-n", "2", "--dist", "each").assert_outcomes(passed=4)
    assert {n["visible"] for n in notes().values()} == {""}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    single = run(pytester, "--streamcheck-gpus=2")  # no workers: the process keeps every GPU
    single.assert_outcomes(passed=2)
    assert {n["visible"] for n in notes().values()} == {None}
    assert "pinned" not in single.stdout.str()


def test_a_bad_gpu_count_is_a_usage_error(pytester):
    pytester.makepyfile(test_seen=SEEN)
    result = run(pytester, "-n", "2", "--streamcheck-gpus=two")
    assert result.ret == 4
    assert "--streamcheck-gpus='two' is not valid; accepted values: auto, or a number of GPUs >= 0" \
        in result.stderr.str()


def test_every_worker_uses_the_controllers_seeds(pytester, notes):
    pytester.makepyfile(test_seen=SEEN)
    result = run(pytester, "-n", "2", "--dist", "each")  # the controller draws the seed
    result.assert_outcomes(passed=4)
    seed = int(SEED_HEADER.search(result.stdout.str()).group(1))
    seen = list(notes().values())
    assert {n["worker"] for n in seen} == {"gw0", "gw1"}
    assert {n["base"] for n in seen} == {seed}
    for n in seen:  # the same test on both workers: the same per-test seed, the controller's
        assert n["seed"] == per_test_seed(seed, n["nodeid"])


# --- the shared example database ------------------------------------------------------------------
# Run 1: only gw0's copy of the property can fail; hypothesis finds and shrinks x = 1000 there and
# saves it (gw1's copy only generates: replaying a passing example would delete it). Run 2 generates
# nothing (phases: reuse only), so a copy fails exactly when it replays gw0's example.
PROPERTY = '''
import os
from hypothesis import Phase, given, settings, strategies as st

FAILS = os.environ["PYTEST_XDIST_WORKER"] in os.environ["FAILS_ON"].split(",")
PHASES = [Phase.reuse] if os.environ.get("REUSE_ONLY") else list(Phase) if FAILS else [Phase.generate]

@settings(phases=PHASES, max_examples=300)
@given(st.integers(0, 10**6))
def test_property(x):
    if FAILS:
        assert x < 1000
'''


def run_property(pytester, monkeypatch, db, fails_on, reuse_only):
    monkeypatch.setenv("FAILS_ON", fails_on)
    if reuse_only:
        monkeypatch.setenv("REUSE_ONLY", "1")
    else:
        monkeypatch.delenv("REUSE_ONLY", raising=False)
    return pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--dist", "each", "-p", "no:cacheprovider",
                                         "--hypothesis-profile=streamcheck-dev", f"--streamcheck-example-db={db}")


def test_a_failure_one_worker_found_replays_on_another(pytester, monkeypatch, tmp_path):
    pytester.makepyfile(test_property=PROPERTY)
    db = tmp_path / "examples"
    found = run_property(pytester, monkeypatch, db, "gw0", reuse_only=False)
    found.assert_outcomes(passed=1, failed=1)  # only gw0's copy can fail
    assert "x=1000" in found.stdout.str()
    assert any(p.is_file() for p in db.rglob("*"))  # saved where the option says
    replayed = run_property(pytester, monkeypatch, db, "gw0,gw1", reuse_only=True)
    replayed.assert_outcomes(failed=2)  # gw1 too, which never found it: replayed from the database
    assert replayed.stdout.str().count("x=1000") >= 2 and "[gw1]" in replayed.stdout.str()
    # Control: another (empty) database, and the reuse-only run has nothing to replay (hypothesis
    # skips a test that ran no example).
    empty = run_property(pytester, monkeypatch, tmp_path / "other", "gw0,gw1", reuse_only=True)
    empty.assert_outcomes(skipped=2)


def test_the_example_database_must_be_a_directory(pytester, tmp_path):
    pytester.makepyfile(test_property=PROPERTY)
    (tmp_path / "file").write_text("")
    result = pytester.runpytest_subprocess("--hypothesis-profile=streamcheck-dev",
                                           f"--streamcheck-example-db={tmp_path / 'file'}")
    assert result.ret == 4 and "is a file; name a directory" in result.stderr.str()


# --- the pieces -----------------------------------------------------------------------------------

def test_visible_gpus_stops_where_cuda_does(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3,-1,4")
    assert visible_gpus() == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() is None
    assert worker_index("gw12") == 12 and worker_index("w1") is None
    assert pinning(["0"], 2).startswith("streamcheck: 2 xdist workers but 1 GPU: fewer GPUs than workers")


TIMING = '''
import pytest

@pytest.mark.streamcheck_gpu_timing
def test_timing():
    pass
'''


@pytest.mark.parametrize("args, outcome", [
    (("-n", "2", "--streamcheck-gpus=1"), {"skipped": 1}),  # two workers share the one GPU
    (("-n", "2", "--streamcheck-gpus=0"), {"skipped": 1}),  # none pinned: both on every GPU
    (("-n", "2", "--streamcheck-gpus=2"), {"passed": 1}),  # one GPU each
    (("--streamcheck-gpus=1",), {"passed": 1}),  # no xdist: the GPU is the test's
])
def test_a_timing_test_runs_only_with_its_gpu_to_itself(pytester, notes, args, outcome):
    pytester.makepyfile(test_timing=TIMING)
    result = run(pytester, *args, "-rs")
    result.assert_outcomes(**outcome)
    if "skipped" in outcome:
        result.stdout.fnmatch_lines(["*timing test: it needs the GPU to itself and 2 xdist workers share*; run it "
                                     "without -n*"])
