"""`streamcheck fuzz --workers N`: pytest -n N over the fuzz's worker test, on the sim (CPU workers
here; on a machine with GPUs each worker is pinned to one, see tests/streamcheck/plugin/test_xdist.py).
Worker K draws from seed + K and runs its share of --examples, so a run over two workers is the
union of two single runs, merged into one table."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from streamcheck import cli


def fuzz_json(capsys, tmp_path, name, *args) -> tuple:
    target = tmp_path / f"{name}.json"
    status = cli.main(["fuzz", "--backend", "sim", "--steps", "2", "--quiet", "--json", str(target), *args])
    out = capsys.readouterr()
    return status, json.loads(target.read_text()), out.out, out.err


def fuzz_json_alone(tmp_path, name, *args) -> dict:
    """A single-process run in a process of its own, as the workers are: nothing a test before it
    left in this process (hypothesis's settings, caches) can change what it draws."""
    target = tmp_path / f"{name}.json"
    subprocess.run([sys.executable, "-m", "streamcheck", "fuzz", "--backend", "sim", "--steps", "2", "--quiet",
                    "--json", str(target), *args], capture_output=True, text=True, timeout=300)
    return json.loads(target.read_text())


def per_plan(data) -> dict:
    return {json.dumps(p["plan"], sort_keys=True): (p["runs"], p["races"], p["wrong"]) for p in data["plans_tried"]}


def test_two_workers_run_the_examples_of_two_seeds_and_merge_them(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    status, both, out, err = fuzz_json(capsys, tmp_path, "both", "--workers", "2", "--examples", "13", "--seed", "5")
    assert status == 1  # findings: --plans all leaves edges out on purpose
    assert both["examples"] == 13 and both["workers"] == 2 and both["worker_examples"] == [7, 6]
    assert "--workers 2 --seed 5 --examples 13" in both["repeat"]
    assert "2 workers (seeds 5..6)" in out and "repeat: streamcheck fuzz" in out and "approximately" not in out
    # Worker 0 ran seed 5's first 7 examples, worker 1 seed 6's first 6: the same as two single runs.
    zero = fuzz_json_alone(tmp_path, "zero", "--examples", "7", "--seed", "5")
    one = fuzz_json_alone(tmp_path, "one", "--examples", "6", "--seed", "6")
    merged = per_plan(zero)
    for plan, counts in per_plan(one).items():
        old = merged.get(plan, (0, 0, 0))
        merged[plan] = tuple(a + b for a, b in zip(old, counts))
    assert per_plan(both) == merged
    assert both["findings"] == zero["findings"] + one["findings"]
    # A first finding keeps what replays it: its token runs the same example here.
    first = next(p["first_finding"] for p in both["plans_tried"] if p["first_finding"])
    assert cli.main(["fuzz", "--replay", first["replay"]]) == 1
    assert first["decisions"] in capsys.readouterr().out
    # And the same command again prints the same table.
    _, again, _, _ = fuzz_json(capsys, tmp_path, "again", "--workers", "2", "--examples", "13", "--seed", "5")
    assert per_plan(again) == per_plan(both) and again["plans_tried"] == both["plans_tried"]


def test_fewer_gpus_than_workers_say_so_and_go_on(capsys, tmp_path, monkeypatch):
    # No GPU here: pytest's own PYTEST_ADDOPTS stands in for a machine with one.
    monkeypatch.setenv("PYTEST_ADDOPTS", "--streamcheck-gpus=1")
    status, data, out, err = fuzz_json(capsys, tmp_path, "one_gpu", "--workers", "2", "--examples", "4", "--seed", "1",
                                       "--plans", "safe")
    assert status == 0 and data["examples"] == 4 and data["findings"] == 0  # safe plans: nothing to find
    assert ("streamcheck: 2 xdist workers but 1 GPU: fewer GPUs than workers, so the run goes on with the GPUs "
            "there are and the workers share them round-robin (CUDA_VISIBLE_DEVICES): gw0, gw1 on GPU 0") in err


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers 0: need an integer >= 1"),
    (["--workers", "-3"], "--workers -3: need an integer >= 1"),
    (["--workers", "2", "--replay", "missing=none"], "--replay runs one example here: drop --workers"),
    (["--example-db", "somewhere"], "--example-db is the database --workers N shares"),
])
def test_bad_worker_options_exit_2(capsys, args, message):
    assert cli.main(["fuzz", "--examples", "3", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamcheck fuzz: error: ") and message in err and len(err.splitlines()) == 1


# A crash in the workers: a pytest plugin (loaded in every worker through PYTEST_ADDOPTS) makes the
# fuzz raise on the workers CRASH_ON names, on a seventh of the data seeds or on the one CRASH_DATA names.
CRASHY = '''
import os
from flashnorm_kernels.commands import fuzz

original = fuzz.run_example

def run_example(example, backend="sim", timeout=None):
    crash = os.environ.get("CRASH_DATA")
    if os.environ["PYTEST_XDIST_WORKER"] in os.environ["CRASH_ON"].split(",") and (
            example.data_seed % 7 == 3 if crash is None else example.data_seed == int(crash)):
        raise RuntimeError(f"injected crash on data seed {example.data_seed}")
    return original(example, backend, timeout)

fuzz.run_example = run_example
'''


def test_a_crash_saved_in_the_shared_database_is_replayed_first_by_every_worker(capsys, tmp_path, monkeypatch):
    (tmp_path / "crashy.py").write_text(CRASHY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p crashy")
    monkeypatch.setenv("CRASH_ON", "gw0,gw1")
    db = tmp_path / "examples"
    found = cli.main(["fuzz", "--workers", "2", "--examples", "60", "--seed", "4", "--steps", "2", "--quiet",
                      "--example-db", str(db)])
    err = capsys.readouterr().err
    assert found == 1 and "the pytest run over 2 workers failed" in err
    data = re.search(r"RuntimeError: injected crash on data seed (\d+)", err).group(1)
    assert int(data) % 7 == 3
    # Now only that example crashes. The workers' own examples (seeds 9 and 10) do not: over a fresh
    # database nothing crashes...
    monkeypatch.setenv("CRASH_DATA", data)
    # (Shares of 10: the replayed examples count against a worker's share too.)
    args = ["fuzz", "--workers", "2", "--examples", "20", "--seed", "9", "--steps", "2", "--quiet", "--example-db"]
    assert cli.main([*args, str(tmp_path / "fresh")]) in (0, 1)  # findings or none, no crash
    assert "injected crash" not in capsys.readouterr().err
    # (and nothing was saved there: the example that ends a worker's share is not a failure)
    assert not any(p.is_file() for p in (tmp_path / "fresh").rglob("*"))
    # ...but over the database of the first run both workers replay the crash before anything else.
    assert cli.main([*args, str(db)]) == 1
    err = capsys.readouterr().err
    assert err.count(f"RuntimeError: injected crash on data seed {data}") >= 2 and "[gw0]" in err and "[gw1]" in err


# --- progress and the budget over workers (issue 21), without starting pytest ---------------


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_workers_counts_add_up_to_one_bar(tmp_path):
    from flashnorm_kernels.commands.fuzz import Progress, WorkerProgress, run_example, worker_counts
    from flashnorm_kernels.commands.fuzz import Example, Tally

    token = ("missing=join_mm,post=caller,side=non_blocking,caller=legacy,M=1,d=8,n=4,dtype=float32,policy=delay,"
             "seed={},delay_steps=8,pct_depth=2,delay_us=200,steps=3,data=0")
    assert worker_counts(tmp_path) == (Tally(), None)  # nobody began
    for k, seeds in enumerate(((0, 1), (5,))):
        tally = Tally()
        for seed in seeds:
            tally.add(run_example(Example.parse(token.format(seed))), unsafe=True)
        progress = WorkerProgress(tmp_path / f"gw{k}.progress")
        progress.restart()
        progress.close(tally)
    merged, running = worker_counts(tmp_path)
    assert (merged.examples, merged.found, len(merged.plans)) == (3, 3, 1)  # one plan, seen by both workers
    assert running is not None and running >= 0
    terminal = Terminal()
    Progress(examples=6, stream=terminal).update(merged, force=True)
    assert "3/6 examples  1 plans  3 findings" in terminal.getvalue()


def test_a_budget_over_workers_ends_at_its_wall_clock_time(tmp_path):
    import time

    from flashnorm_kernels.commands.fuzz import Progress, fuzz, wait_for_workers

    start = time.time()
    assert fuzz(backend="sim", profile="streamcheck-fuzz", seed=1, stop_at=start - 1).examples == 0
    # Workers still starting when the budget ends are stopped at once (here: a child that would sleep 60 s).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    terminal = Terminal()
    output, stopped = wait_for_workers(child, tmp_path, Progress(budget=5.0, stream=terminal), 2, time.time())
    assert stopped and child.returncode is not None and time.time() - start < 30
    assert "\r" in terminal.getvalue() and "0 examples" in terminal.getvalue()


@pytest.mark.parametrize("overhead, running, words", [
    (20.0, 4.0, "the 2 workers took 20.0 s to start and stop (pytest, xdist, the imports) and 4.0 s to run"),
    (10.0, 0.0, "the budget ran out while the 2 workers were starting"),
])
def test_workers_say_what_they_cost_when_they_cannot_pay_off(overhead, running, words):
    from flashnorm_kernels.commands.fuzz import workers_cost_note

    assert words in workers_cost_note(2, overhead, running)
    assert workers_cost_note(2, 5.0, 50.0) is None  # long enough: no note
