"""`streamcheck run --confirm` on a real GPU, over every program of tests/gpu_programs/ (CuPy
classics) and tests/gpu_programs/torch/ (PyTorch bugs rebuilt from public projects).

- Every race a racy program reports is confirmed: its rerun delayed exactly the first access,
  and CUDA events showed the second access start before the first finished. The few races a
  delay cannot invert are listed in NOT_CONFIRMABLE with the reason the verdict must give.
- A clean program reports nothing to confirm and reruns nothing.
- Confirmation never changes the exit status: the same as the run without --confirm.

    pytest -m gpu tests/streamcheck/proofs/test_confirm_gpu.py
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamcheck.device.backends import gpu_available
from tests.paths import GPU_PROGRAMS, ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not gpu_available(), reason="needs an NVIDIA GPU and CuPy (CuPy missing or no CUDA device here)")]

PROGRAMS = sorted(p for d in (GPU_PROGRAMS, GPU_PROGRAMS / "torch") for p in d.glob("*.py")
                  if not p.name.startswith("_"))
RACY = [p for p in PROGRAMS if p.name.startswith(("race_", "raises_after_race"))]
CLEAN = [p for p in PROGRAMS if p.name.startswith(("ok_", "fixed_"))]

# program name -> words the verdict of its unconfirmable race must contain (and why no delay can help)
NOT_CONFIRMABLE = {
    # the missing join is between two nodes of one captured graph: a delay before the launch delays both
    "race_graph_missing_join.py": "nodes of one CUDA graph",
}


def _run(program, tmp_path, *options):
    report = tmp_path / f"{program.stem}.json"
    proc = subprocess.run([sys.executable, "-m", "streamcheck.cli", "run", *options, "--report-json", str(report),
                           str(program)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    data = json.loads(report.read_text()) if report.exists() else []
    races = data["races"] if isinstance(data, dict) else data  # a dict when free hazards (or more) follow
    return proc, races


@pytest.mark.parametrize("program", RACY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_reported_race_is_confirmed_by_its_directed_rerun(program, tmp_path):
    plain, _ = _run(program, tmp_path)
    proc, races = _run(program, tmp_path, "--confirm")
    assert proc.returncode == plain.returncode, proc.stderr  # --confirm never changes the status
    assert "internal error" not in proc.stderr, proc.stderr
    if not races:  # CUDA refuses the program at capture (an unjoined fork): nothing to confirm
        assert "capture error" in proc.stderr and "confirming" not in proc.stderr, proc.stderr
        return
    for race in races:
        verdict = race["confirmation"]
        expected = NOT_CONFIRMABLE.get(program.name)
        if expected is not None and not verdict["confirmed"]:
            assert expected in verdict["text"], verdict
            continue
        assert verdict["confirmed"], f"{program.name}: {race['kind']} {race['first']['site']} -> " \
                                     f"{race['second']['site']}: {verdict['text']}\n{proc.stderr[-3000:]}"
        assert verdict["elapsed_us"] > 0 and 0 < verdict["delay_us"] <= 50_000
        assert "--confirm-probe" in verdict["replay"]


@pytest.mark.parametrize("program", CLEAN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_clean_program_has_nothing_to_confirm_and_keeps_its_status(program, tmp_path):
    proc, races = _run(program, tmp_path, "--confirm")
    assert races == [], proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "confirming" not in proc.stderr and "--confirm-probe" not in proc.stderr


def test_a_replay_line_repeats_the_confirmation(tmp_path):
    program = GPU_PROGRAMS / "race_missing_wait.py"
    _, races = _run(program, tmp_path, "--confirm")
    replay = races[0]["confirmation"]["replay"]
    import shlex

    words = shlex.split(replay)
    assert words[0] == "streamcheck"
    proc = subprocess.run([sys.executable, "-m", "streamcheck.cli", *words[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert "streamcheck: probe: delay" in proc.stderr and "started" in proc.stderr and "before the first finished" \
        in proc.stderr, proc.stderr


# --- the device API on Device("cupy"): the sim's confirmation patterns, timed on the GPU --------
from streamcheck.proofs.confirm_gpu import confirm_device_races  # noqa: E402
from tests.streamcheck.proofs.test_confirm import PAIRS, free_in_use  # noqa: E402


@pytest.mark.parametrize("racy, kinds", [pytest.param(p[1], p[3], id=p[0]) for p in PAIRS])
def test_every_racy_device_api_pattern_is_confirmed_on_the_gpu(racy, kinds):
    verdicts = confirm_device_races(racy)
    assert [v.race.kind for v in verdicts] == kinds
    for v in verdicts:
        assert v.confirmed, v.format()
        assert v.elapsed_us > 0 and v.replay.startswith("Device('cupy', confirm_probe=")


def test_a_free_nothing_reused_is_a_race_on_the_gpu_that_no_delay_can_confirm():
    # CuPy's pool may hand the bytes out without Device("cupy") seeing it (the free is strict there),
    # but in this run no allocation got them: no value can differ, and the verdict says so.
    (v,) = confirm_device_races(free_in_use)
    assert (v.race.kind, v.race.first.name, v.confirmed) == ("FREE", "produce", False)
    assert "no allocation got the freed bytes" in v.format()


@pytest.mark.parametrize("safe", [pytest.param(p[2], id=p[0]) for p in PAIRS]
                         + [pytest.param(lambda d: free_in_use(d, True), id="free-after-wait")])
def test_every_safe_device_api_twin_has_nothing_to_confirm_on_the_gpu(safe):
    assert confirm_device_races(safe) == []
