"""`streamcheck fuzz --workers N`: pytest -n N over the fuzz's worker test, on the sim (CPU workers
here; on a machine with GPUs each worker is pinned to one, see tests/streamcheck/plugin/test_xdist.py).
Worker K draws from seed + K and runs its share of --examples, so a run over two workers is the
union of two single runs, merged into one table."""
from __future__ import annotations

import json

import pytest

from streamcheck import cli


def fuzz_json(capsys, tmp_path, name, *args) -> tuple:
    target = tmp_path / f"{name}.json"
    status = cli.main(["fuzz", "--backend", "sim", "--steps", "2", "--quiet", "--json", str(target), *args])
    out = capsys.readouterr()
    return status, json.loads(target.read_text()), out.out, out.err


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
    _, zero, _, _ = fuzz_json(capsys, tmp_path, "zero", "--examples", "7", "--seed", "5")
    _, one, _, _ = fuzz_json(capsys, tmp_path, "one", "--examples", "6", "--seed", "6")
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
