"""`streamcheck repro implicit-join`: the README's main job."""
import errno
import io
import json
import os
import shutil

import pytest

from flashnorm_kernels.commands import repro
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


def test_cupy_without_a_gpu_exits_2_before_any_header_and_suggests_the_sim(capsys, monkeypatch):
    monkeypatch.setattr("streamcheck.device.backends.gpu_available", lambda: False)
    assert main(["repro", "implicit-join", "--backend", "cupy", "--tokens", "4"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "needs an NVIDIA GPU" in line and "--backend sim" in line


def test_missing_or_corrupt_fixture_exits_2(capsys, tmp_path):
    assert main(["repro", "implicit-join", "--fixtures", str(tmp_path), "--tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "tiny_llama_zen" in err and "train_tiny_model.py" in err
    broken = tmp_path / "tiny_llama_zen"
    shutil.copytree(pytest.importorskip("flashnorm_kernels.testing.fixtures").fixture_dir("tiny_llama_zen"), broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    assert main(["repro", "implicit-join", "--fixtures", str(tmp_path), "--tokens", "4"]) == 2
    assert "model.safetensors" in capsys.readouterr().err


# --- outputs: checked before the runs, written whole, named as written --------------------

@pytest.mark.parametrize("option", ["--trace", "--json", "--timeline"])
def test_an_output_that_is_a_directory_exits_2_before_the_run(capsys, tmp_path, option):
    if option == "--timeline":
        pytest.importorskip("matplotlib")
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8", option, str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no header: nothing ran
    (line,) = captured.err.splitlines()
    assert f"{option} {tmp_path} is a directory" in line and "give a file name" in line
    assert list(tmp_path.iterdir()) == []


def test_an_output_in_a_missing_directory_exits_2_before_the_run(capsys, tmp_path):
    target = tmp_path / "no" / "such" / "race.json"
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8", "--trace", str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"the directory {target.parent} does not exist" in captured.err
    assert not (tmp_path / "no").exists()


def test_json_report_says_what_was_reproduced_with_the_race_reports(capsys, tmp_path):
    report = tmp_path / "repro.json"
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8", "--json", str(report)]) == 0
    assert f"JSON report: {report}" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["bug"] == "implicit-join" and data["reproduced"] is True and data["fixed"] is True
    assert data["replay"] == "streamcheck repro implicit-join --backend sim --tokens 8 --seed 0"
    assert data["delay"]["after"] == 4 and data["delay"]["streams"] == ["layers.0.input_layernorm.A"]
    buggy, fixed = data["implicit_join"], data["correct"]
    assert buggy["tokens_match"] is False and buggy["first_divergence"] == 4
    assert "explained by a one-step lag" in buggy["diagnosis"]
    assert data["reference_text"] == "Beautifu" and data["implicit_join_text"] == "Beauutif"
    assert any(r["kind"] == "RAW" and r["buffer"] == "layers.0.input_layernorm.Y" and r["first"]["name"] == "matmul"
               and r["second"]["name"] == "postscale" for r in buggy["races"]), buggy["races"]
    assert fixed["tokens_match"] is True and fixed["races"] == []


def test_timeline_says_the_file_it_wrote(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8", "--timeline", "mytl"]) == 0
    assert "timeline of the implicit-join run: mytl.png" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mytl.png"]
    assert (tmp_path / "mytl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_with_another_suffix_exits_2(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    assert main(["repro", "implicit-join", "--timeline", str(tmp_path / "tl.svg")]) == 2
    assert "the timeline is a PNG; give a name ending in .png" in capsys.readouterr().err


def test_a_failed_write_exits_2_and_leaves_no_file(capsys, tmp_path, monkeypatch):
    def disk_full(fd):  # the trace is written, but the disk is full when it is flushed (delayed allocation)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    trace = tmp_path / "race.json"
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8", "--trace", str(trace)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"could not write {trace}: No space left on device" in line
    assert list(tmp_path.iterdir()) == []  # neither race.json nor its temporary


# --- too few tokens, and which run the files show ----------------------------------------

def test_too_few_tokens_explains_when_the_first_delay_strikes(capsys):
    # seed 1: the first delay strikes at decode step 4 + 1 % 24 = 5, which yields token 5.
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "5", "--seed", "1"]) == 1
    out = capsys.readouterr().out
    assert "note: the first delay strikes at decode step 5 (4 + seed % 24;" in out
    assert "Use --tokens 6 or more." in out
    assert "result: NOT reproduced (--tokens 5 ends before the first delay, at step 5); fix ok" in out
    # And the rule is true: one more token and it strikes there.
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "6", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "note:" not in out and "first divergence at token 5 of 6" in out


def test_trace_comes_from_the_implicit_join_run_even_when_the_delay_did_not_strike(capsys, tmp_path):
    trace = tmp_path / "race.json"
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "3", "--trace", str(trace)]) == 1
    out = capsys.readouterr().out
    assert f"Perfetto trace of the implicit-join run: {trace}" in out
    assert "the delay did not change the implicit-join run's text; its race is marked all the same" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("RACE:") for e in events)  # SyncPlan.correct()'s run has no race


# --- progress and dependencies' noise -----------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_drawn_on_a_terminal_only_and_dependencies_stay_quiet(capsys, monkeypatch):
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # not a terminal: no bar (and no "Loading weights" from transformers)
    assert "\r" not in captured.out
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before  # restored for the caller

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8"]) == 0
    drawn = terminal.getvalue()
    assert "\r" in drawn and "sequential reference" in drawn and "/24" in drawn  # 3 runs x 8 tokens
    assert "Loading weights" not in drawn
    assert "\r" not in capsys.readouterr().out


def test_progress_is_drawn_on_a_terminal_that_reports_no_width(monkeypatch):
    # A pseudo-terminal nobody sized says 0 columns (IDE consoles, `script`); the bar is drawn all the same.
    import pty
    import select
    import threading

    master, slave = pty.openpty()
    received, done = [], threading.Event()

    def read() -> None:  # until the command is done and the terminal has passed on all it wrote
        while select.select([master], [], [], 0.2)[0] or not done.is_set():
            if select.select([master], [], [], 0)[0]:
                received.append(os.read(master, 4096))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    terminal = open(slave, "w", buffering=1, closefd=True)
    monkeypatch.setattr("sys.stderr", terminal)
    try:
        assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8"]) == 0
    finally:
        terminal.flush()
        done.set()
        reader.join(timeout=10)
        terminal.close()
        os.close(master)
    drawn = b"".join(received).decode(errors="replace")
    assert "sequential reference" in drawn and "/24" in drawn  # 3 runs x 8 tokens


def test_json_dash_is_stdout_and_holds_the_json_alone(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8", "--json", "-"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # nothing else on stdout
    assert report["reproduced"] and report["fixed"] and report["implicit_join"]["races"]
    assert "result: reproduced" in captured.err  # the text goes to stderr instead
    assert list(tmp_path.iterdir()) == []  # no file named `-`


def test_no_bug_named_says_what_its_usage_shows(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["repro"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    usage = err.split("streamcheck repro: error:")[0].split()
    assert usage[:3] == ["usage:", "streamcheck", "repro"] and usage[-1] == "BUG"  # not {implicit-join}
    assert err.rstrip().endswith("error: the following arguments are required: BUG")
