"""Edges a newcomer hits on the `streamcheck` command line (issue 15): help for every
subcommand and option, --version, and commands that stay quiet and check their input first.

The tests that block an import or read what a log file receives run the command in a
subprocess, so the blocked module and the real stderr are that process's alone.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

from flashnorm_kernels.testing.fixtures import fixture_dir
from streamcheck import cli
from tests.paths import ROOT

BLOCK_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; "  # `import matplotlib` now raises ImportError
MAIN = "from streamcheck.cli import main; sys.exit(main(sys.argv[1:]))"


def streamcheck(*argv, prelude="import sys; ", cwd=ROOT) -> subprocess.CompletedProcess:
    """`streamcheck ARGV...` in a fresh interpreter; stdout and stderr are pipes, as in a CI log."""
    return subprocess.run([sys.executable, "-c", prelude + MAIN, *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def subcommand_parsers():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return parser, sub


# --- help and version ---------------------------------------------------------------------

def test_every_subcommand_and_option_has_help():
    parser, sub = subcommand_parsers()
    listed = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(listed) == set(sub.choices) == {"repro", "run", "fuzz", "demo"}
    for name, subparser in sub.choices.items():
        assert listed[name], f"`streamcheck {name}` has no help line in `streamcheck --help`"
        assert subparser.description, f"`streamcheck {name} --help` has no description"
        for action in subparser._actions:
            assert action.help, f"`streamcheck {name}`: {action.option_strings or action.dest} has no help text"


def test_demo_help_explains_its_seed(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "implicit-join pattern in ten device calls" in out
    (seed_line,) = [line for line in out.splitlines() if line.strip().startswith("--seed")]
    assert "delay schedule" in seed_line


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"streamcheck {metadata.version('streamcheck')}"


# --- repro checks what it will need before the runs ---------------------------------------

def test_repro_timeline_without_matplotlib_fails_before_the_run(tmp_path):
    png = tmp_path / "x.png"
    proc = streamcheck("repro", "implicit-join", "--backend", "sim", "--tokens", "8", "--timeline", str(png),
                       prelude=BLOCK_MATPLOTLIB)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # no header, no run: the check comes first
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--timeline needs matplotlib" in lines[0] and "streamcheck[plot]" in lines[0]
    assert not png.exists()


def test_repro_into_a_log_has_no_progress_frames_or_dependency_notices(tmp_path):
    # A fixture whose config allows fewer positions than prompt + tokens: transformers would
    # print its "friendly reminder" about the predefined maximum length.
    fixtures = tmp_path / "fixtures"
    model = fixtures / "tiny_llama_zen"
    shutil.copytree(fixture_dir("tiny_llama_zen"), model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 36  # the prompt is 34 tokens
    (model / "config.json").write_text(json.dumps(config))

    proc = streamcheck("repro", "implicit-join", "--backend", "sim", "--tokens", "8", "--fixtures", str(fixtures))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: reproduced" in proc.stdout
    assert proc.stderr == ""  # no "Loading weights" bar, no max-length reminder
    assert "\r" not in proc.stdout


def test_race_reports_wrap_at_the_terminal_width_only_on_a_terminal(monkeypatch):
    import io

    from streamcheck.commands import report_width

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setenv("COLUMNS", "57")
    assert report_width(Terminal()) == 57
    assert report_width(io.StringIO()) is None  # a log file or a pipe keeps whole lines


# --- demo and pipes -------------------------------------------------------------------------

def demo_lines(capsys, *argv) -> list:
    assert cli.main(["demo", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_demo_seed_picks_the_schedule(capsys):
    struck, missed = demo_lines(capsys, "--seed", "0"), demo_lines(capsys, "--seed", "2")
    assert "seed=0 schedule=" in struck[0] and "seed=2 schedule=" in missed[0]
    assert struck[0].split("schedule=")[-1] != missed[0].split("schedule=")[-1]  # seed 0 holds A, seed 2 does not
    assert struck[1].startswith("  out = [0. 0. 0. 0.]") and "did not strike" not in struck[1]
    assert "(this seed's delay did not strike; the race is reported all the same)" in missed[1]
    for lines in (struck, missed):
        assert any(line.startswith("RAW race on `Y`") for line in lines)  # reported whatever the schedule


def test_output_into_a_closed_pipe_ends_quietly():
    # `streamcheck demo | head -1`: the reader is gone before the output is written.
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-c", "import sys; " + MAIN, "demo"], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert proc.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports for `cat`


def test_demo_writes_its_reports_as_json_as_the_other_commands_do(capsys, tmp_path):
    # The README says --json works in every command.
    out = tmp_path / "demo.json"
    assert cli.main(["demo", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["struck"] is True and written["seed"] == 0
    assert written["out"][:4] == [0.0, 0.0, 0.0, 0.0] and written["expected"][0] > 0
    [race] = written["implicit_join"]["races"]
    assert (race["kind"], race["buffer"]) == ("RAW", "Y") and f"RAW race on `{race['buffer']}`" in text
    assert written["fixed"]["races"] == []
    # `--json -`: the JSON alone on stdout, the text on stderr.
    assert cli.main(["demo", "--json", "-"]) == 0
    streams = capsys.readouterr()
    [on_stdout] = json.loads(streams.out)["implicit_join"]["races"]
    assert [on_stdout[key] for key in ("kind", "buffer", "missing_edge")] == \
        [race[key] for key in ("kind", "buffer", "missing_edge")]
    assert "RAW race on `Y`" in streams.err


def test_demo_refuses_a_json_file_it_cannot_write(capsys, tmp_path):
    assert cli.main(["demo", "--json", str(tmp_path / "missing" / "demo.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamcheck demo: --json ") and "does not exist" in err and "Traceback" not in err
