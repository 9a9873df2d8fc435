"""`streamcheck repro implicit-join`: the README's main job."""
import json
import shutil

import pytest

from streamcheck.backends import gpu_available
from streamcheck.cli import main


def test_repro_on_the_sim_shows_the_stutter_the_race_and_the_fix(capsys, tmp_path):
    trace = tmp_path / "race.json"
    status = main(["repro", "implicit-join", "--backend", "sim", "--tokens", "48", "--seed", "0",
                   "--trace", str(trace)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "sequential reference" in out and "implicit join under delay" in out
    # The one-step stutter, side by side with the reference line.
    assert any(line.startswith("≠ Beautiful is better than ugly.") and line.endswith("| Beauutiful is better than ugly.")
               for line in out.splitlines()), out
    assert "explained by a one-step lag" in out
    assert "RAW race on `layers.0.input_layernorm.Y`" in out
    assert "never waited for an event recorded on stream layers.0.input_layernorm.A after `matmul`" in out
    assert "SyncPlan.correct() under the same delay: tokens match the sequential reference" in out
    assert "Replay: streamcheck repro implicit-join --backend sim --tokens 48 --seed 0" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("RACE:") for e in events)


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "0"], "--tokens must be at least 1"),
    (["--backend", "tpu"], "unknown backend 'tpu'"),
])
def test_bad_options_exit_2(capsys, argv, message):
    assert main(["repro", "implicit-join", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU error")
def test_cupy_without_a_gpu_exits_2(capsys):
    assert main(["repro", "implicit-join", "--backend", "cupy", "--tokens", "4"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


def test_missing_or_corrupt_fixture_exits_2(capsys, tmp_path):
    assert main(["repro", "implicit-join", "--fixtures", str(tmp_path), "--tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "tiny_llama_zen" in err and "train_tiny_model.py" in err
    broken = tmp_path / "tiny_llama_zen"
    shutil.copytree(pytest.importorskip("streamcheck.fixtures").fixture_dir("tiny_llama_zen"), broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    assert main(["repro", "implicit-join", "--fixtures", str(tmp_path), "--tokens", "4"]) == 2
    assert "model.safetensors" in capsys.readouterr().err
