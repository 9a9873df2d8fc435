"""`streamcheck fuzz` as a user meets it: repeatable runs, Ctrl-C, --json, refused replay
tokens and output that fits the terminal. (The plans, the oracle and the replay of one
example are tested in test_fuzz_plans.py.)"""
from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from flashnorm_kernels.commands import fuzz as fuzz_command
from flashnorm_kernels.commands.fuzz import Example, Progress, Tally, run_example
from streamcheck import cli
from tests.sigint import sigint_from_a_terminal

TIMES = re.compile(r"in [\d.]+ s \([\d.]+ examples/s\)")
# A token with every field, for the refused-field tests (the talk's plan, a delay schedule).
TOKEN = ("missing=join_mm,post=caller,side=non_blocking,caller=legacy,M=1,d=8,n=4,dtype=float32,policy=delay,"
         "seed=3,delay_steps=8,pct_depth=2,delay_us=200,steps=3,data=0")


@pytest.fixture
def columns(monkeypatch):
    """Set the terminal width shutil.get_terminal_size reports."""
    def set_width(width: int) -> None:
        monkeypatch.setenv("COLUMNS", str(width))
    return set_width


def _fuzz(capsys, *args) -> tuple:
    status = cli.main(["fuzz", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def _masked(text: str) -> str:
    return TIMES.sub("in T s (R examples/s)", text)


def _with(token: str, field: str, value: str) -> str:
    return re.sub(rf"(^|,){field}=[^,]*", rf"\g<1>{field}={value}", token)


# --- repeating a run ---------------------------------------------------------------------------


def test_the_same_seed_and_count_print_the_same_table(capsys, columns):
    columns(120)
    args = ["--examples", "150", "--seed", "7", "--steps", "2", "--max-rows", "60"]
    first = _fuzz(capsys, *args)
    again = _fuzz(capsys, *args)
    assert first[0] == again[0] == 1
    assert first[1].startswith("streamcheck fuzz: 150 examples in ")
    assert "seed 7" in first[1] and first[1].count("replay: ") > 20  # a table worth comparing
    assert _masked(first[1]) == _masked(again[1])  # byte for byte, times aside
    other_seed = _fuzz(capsys, *args[:3], "8", *args[4:])
    assert _masked(other_seed[1]) != _masked(first[1])


def test_a_budget_run_prints_the_command_that_repeats_it(capsys, columns):
    # A budget stops wherever the machine's speed puts it; the repeat line names that count,
    # and the same seed's first N examples are the same whether a budget or a count cut them.
    columns(1000)
    status, out, _ = _fuzz(capsys, "--budget", "0.5s", "--seed", "4", "--plans", "unsafe", "--steps", "2")
    assert status == 1
    repeat = re.search(r"^repeat: (streamcheck fuzz .*)$", out, re.M).group(1)
    count = int(re.search(r"--examples (\d+)$", repeat).group(1))
    assert out.startswith(f"streamcheck fuzz: {count} examples in ")
    argv = shlex.split(repeat)
    assert argv[:2] == ["streamcheck", "fuzz"] and "--seed" in argv and "4" in argv
    status, again, _ = _fuzz(capsys, *argv[2:])
    assert status == 1
    assert _masked(again) == _masked(out)


def test_a_seedless_run_prints_the_seed_it_drew(capsys, columns):
    columns(1000)
    _, out, _ = _fuzz(capsys, "--examples", "40", "--steps", "2")
    seed = re.search(r"^repeat: streamcheck fuzz .* --seed (\d+) --examples 40$", out, re.M).group(1)
    _, again, _ = _fuzz(capsys, "--examples", "40", "--steps", "2", "--seed", seed)
    assert _masked(again) == _masked(out)


def test_help_says_only_a_count_repeats_exactly(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["fuzz", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--examples N" in text
    assert "Only a count, not a time budget, repeats a run exactly" in text
    assert "130 interrupted" in text
    assert "Fuzz the sync plans of FlashNorm's dual-stream pipeline" in text
    assert "streamcheck run script.py" in text  # what to use for one's own program


def test_a_fuzz_run_leaves_no_hypothesis_folder_in_the_working_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    proc = subprocess.run([sys.executable, "-m", "streamcheck", "fuzz", "--examples", "2", "--steps", "2", "--seed",
                           "1", "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    assert "found" in proc.stdout or "examples" in proc.stdout, proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--examples", "0"], "--examples 0: need an integer >= 1"),
    (["--examples", "-3"], "--examples -3: need an integer >= 1"),
    (["--timeout", "-1"], "--timeout -1: need a number of seconds >= 0 (0: no limit)"),
    (["--timeout", "nan"], "--timeout nan: need a number of seconds >= 0 (0: no limit)"),
])
def test_bad_example_counts_exit_2(capsys, args, message):
    status, out, err = _fuzz(capsys, *args)
    assert status == 2 and out == ""
    assert err == f"streamcheck fuzz: error: {message}\n"


def test_a_budget_and_a_count_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["fuzz", "--budget", "1s", "--examples", "10"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# --- Ctrl-C ---------------------------------------------------------------------------------------


def _interrupt_at(monkeypatch, call: int, interrupt) -> None:
    """Make the `call`-th example interrupt the run (after `call - 1` complete ones)."""
    calls = []

    def run(example, backend="sim", timeout=None):
        calls.append(example)
        if len(calls) == call:
            interrupt()
        return run_example(example, backend, timeout)

    monkeypatch.setattr(fuzz_command, "run_example", run)


def test_ctrl_c_prints_the_table_so_far_and_exits_130(capsys, columns, monkeypatch, tmp_path):
    columns(1000)

    def ctrl_c():
        raise KeyboardInterrupt

    _interrupt_at(monkeypatch, 31, ctrl_c)
    report = tmp_path / "fuzz.json"
    status, out, _ = _fuzz(capsys, "--examples", "500", "--seed", "9", "--steps", "2", "--json", str(report))
    assert status == 130
    first_line = out.splitlines()[0]
    assert first_line.startswith("streamcheck fuzz: 30 examples in ") and first_line.endswith("; interrupted (Ctrl-C)")
    assert "verdict    runs races wrong" in out and "replay: streamcheck fuzz --backend sim --replay" in out
    assert re.search(r"^repeat: .* --seed 9 --examples 30$", out, re.M)
    data = json.loads(report.read_text())
    assert data["interrupted"] is True and data["examples"] == 30
    assert sum(plan["runs"] for plan in data["plans_tried"]) == 30
    # What was printed is what those 30 examples give: the repeat line's run prints the same rows.
    monkeypatch.setattr(fuzz_command, "run_example", run_example)
    status, again, _ = _fuzz(capsys, "--examples", "30", "--seed", "9", "--steps", "2")
    assert status == 1
    assert _masked(again).splitlines()[1:] == _masked(out).splitlines()[1:]


SIGINT_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from streamcheck import cli
    from flashnorm_kernels.commands import fuzz

    real, calls = fuzz.run_example, []

    def run(example, backend="sim", timeout=None):
        calls.append(example)
        if len(calls) == 21:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in the terminal sends
        return real(example, backend, timeout)

    fuzz.run_example = run
    sys.exit(cli.main(["fuzz", "--examples", "5000", "--seed", "3", "--steps", "2"]))
""")


def test_a_real_sigint_still_prints_the_table(tmp_path):
    env = {**os.environ, "COLUMNS": "1000"}
    with sigint_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", SIGINT_SCRIPT], capture_output=True, text=True, env=env,
                                cwd=tmp_path, timeout=300)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    # The signal lands while the 21st example runs: 20 or 21 finished, never the 5000 asked for.
    assert re.match(r"streamcheck fuzz: 2[01] examples in .*; interrupted \(Ctrl-C\)\n", result.stdout)
    assert "verdict    runs races wrong" in result.stdout


# --- --json ---------------------------------------------------------------------------------------


def test_json_holds_every_plan_tried_with_full_replays(capsys, columns, tmp_path):
    columns(1000)
    report = tmp_path / "fuzz.json"
    status, out, _ = _fuzz(capsys, "--examples", "120", "--seed", "5", "--steps", "2", "--max-rows", "2",
                           "--json", str(report))
    assert status == 1
    data = json.loads(report.read_text())
    assert data["examples"] == 120 and data["seed"] == 5 and data["backend"] == "sim"
    assert data["repeat"] == "streamcheck fuzz --backend sim --plans all --steps 2 --seed 5 --examples 120"
    tried = int(re.search(r"plans tried: (\d+)", out).group(1))
    plans = data["plans_tried"]
    assert len(plans) == tried and sum(p["runs"] for p in plans) == 120
    found = [p for p in plans if p["first_finding"]]
    assert len(found) > 2  # more than the two rows the table lists
    assert sum(p["races"] > 0 for p in plans) == int(re.search(r"races found in (\d+) plans", out).group(1))
    # The table's rows come first, in its order, with the same replay tokens.
    printed = re.findall(r"--replay (\S+)", out)
    assert [p["first_finding"]["replay"] for p in plans[:2]] == printed
    for plan in found[:5]:
        finding = plan["first_finding"]
        example = Example.parse(finding["replay"])
        assert example.plan.edges.isdisjoint(plan["plan"]["missing"])
        outcome = run_example(example)
        assert outcome.decisions == finding["decisions"] and outcome.found
        assert finding["replay_command"] == f"streamcheck fuzz --backend sim --replay {finding['replay']}"
        assert finding["races"] == [race.to_dict() for race in outcome.races]


def test_replay_json_has_the_decisions_the_screen_elides(capsys, columns, tmp_path):
    columns(80)
    report = tmp_path / "replay.json"
    token = _with(TOKEN, "steps", "200")
    status, out, _ = _fuzz(capsys, "--replay", token, "--json", str(report))
    assert status == 1
    data = json.loads(report.read_text())
    full = run_example(Example.parse(token)).decisions
    assert len(full) > 5000 and data["decisions"] == full
    assert data["replay"] == token and data["wrong"] is True and data["races"][0]["kind"] == "RAW"
    (line,) = [line for line in out.splitlines() if line.startswith("decisions: ")]
    assert len(line) <= 80
    assert line.endswith(f"... ({len(full):,} in all: see the --json file)")
    assert full.startswith(line[len("decisions: "):line.index("...")])


def test_a_short_decisions_string_is_printed_whole(capsys, columns):
    columns(1000)
    status, out, _ = _fuzz(capsys, "--replay", TOKEN)
    decisions = run_example(Example.parse(TOKEN)).decisions
    assert status == 1 and f"\ndecisions: {decisions}\n" in out


@pytest.mark.parametrize("target, message", [
    (".", "is a directory; name a file to write"),
    ("missing/fuzz.json", "the directory missing does not exist; create it or name another file"),
])
def test_an_unwritable_json_target_exits_2_before_running(capsys, monkeypatch, tmp_path, target, message):
    monkeypatch.chdir(tmp_path)
    status, out, err = _fuzz(capsys, "--examples", "5", "--json", target)
    assert status == 2 and out == ""  # nothing ran
    assert err == f"streamcheck fuzz: error: --json {target}: {message}\n"
    assert os.listdir(tmp_path) == []


# --- refused replay tokens ------------------------------------------------------------------------


@pytest.mark.parametrize("token, message", [
    (_with(TOKEN, "M", "0"), "--replay: M=0: tokens per step must be an integer >= 1"),
    (_with(TOKEN, "dtype", "int8"),
     "--replay: dtype=int8: not a pipeline dtype; use one of float32, float16, bfloat16"),
    (_with(TOKEN, "policy", "bogus"), "--replay: policy=bogus: unknown schedule policy 'bogus'"),
    (_with(TOKEN, "policy", "replay:zz"), "--replay: policy=replay:zz: bad schedule string"),
    (_with(TOKEN, "seed", "abc"), "--replay: seed=abc: the schedule seed must be an integer >= 0"),
    (_with(TOKEN, "seed", "-1"), "--replay: seed=-1: the schedule seed must be an integer >= 0"),
    (_with(TOKEN, "d", "0"), "--replay: d=0: the hidden size must be an integer >= 1"),
    (_with(TOKEN, "n", "-4"), "--replay: n=-4: the output features must be an integer >= 1"),
    (_with(TOKEN, "steps", "1"), "--replay: steps=1: the decode steps must be an integer >= 2"),
    (_with(TOKEN, "pct_depth", "0"), "--replay: pct_depth=0: the pct depth must be an integer >= 1"),
    (_with(TOKEN, "delay_steps", "x"), "--replay: delay_steps=x: the delay in host calls must be an integer"),
    (_with(TOKEN, "data", "-1"), "--replay: data=-1: the data seed must be an integer >= 0"),
    (_with(TOKEN, "missing", "join_mm+nope"), "--replay: missing=join_mm+nope: unknown edges nope"),
    (_with(TOKEN, "post", "X"), "--replay: SyncPlan: post_stream 'X' must be one of"),
    (TOKEN + ",Mx=3", "--replay: 'Mx=3' is not a field of a replay token"),
    (TOKEN + ",M=2", "--replay: M= appears twice"),
    ("missing=none,post=caller", "--replay: the replay token lacks side, caller, M, d, n, dtype, policy, seed"),
])
def test_a_bad_replay_field_is_one_line_and_exit_2(capsys, token, message):
    status, out, err = _fuzz(capsys, "--replay", token)
    assert status == 2 and out == ""
    assert err.startswith(f"streamcheck fuzz: error: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_every_field_the_token_prints_parses_back():
    example = Example.parse(TOKEN)
    assert example.token() == TOKEN
    assert (example.shape.tokens, example.shape.dtype, example.choice.policy, example.steps) == \
        (1, "float32", "delay", 3)


# --- output that fits -------------------------------------------------------------------------


def _replay_commands(out: str) -> list:
    """Each printed replay command, its lines joined as a shell reads them."""
    lines, commands = out.splitlines(), []
    for i, line in enumerate(lines):
        if "replay: streamcheck fuzz" in line:
            block = [line.split("replay: ", 1)[1]]
            while "\n".join(block).count("'") % 2:  # inside the quotes: the argument goes on
                i += 1
                block.append(lines[i])
            commands.append("\n".join(block))
    return commands


def test_the_table_fits_the_terminal_and_its_replays_paste_back(capsys, columns):
    columns(80)
    status, out, _ = _fuzz(capsys, "--examples", "60", "--seed", "3", "--steps", "2", "--max-rows", "5")
    assert status == 1
    assert max(len(line) for line in out.splitlines()) <= 80
    commands = _replay_commands(out)
    assert len(commands) == 5 and all("\n" in command for command in commands)  # the tokens did not fit
    for command in commands:
        argv = shlex.split(command)  # as a shell would split the pasted lines
        assert argv[:4] == ["streamcheck", "fuzz", "--backend", "sim"]
        status, replayed, err = _fuzz(capsys, *argv[2:])
        assert status == 1, err
        example = replayed.split("\nschedule: ")[0]
        assert example.startswith("example: ") and max(len(line) for line in replayed.splitlines()[:3]) <= 80
        (printed,) = shlex.split(example[len("example: "):])
        assert Example.parse(printed) == Example.parse(argv[-1])


def test_a_wide_terminal_keeps_each_replay_on_one_line(capsys, columns):
    columns(400)
    _, out, _ = _fuzz(capsys, "--examples", "60", "--seed", "3", "--steps", "2", "--max-rows", "5")
    replays = [line for line in out.splitlines() if "replay: " in line]
    assert len(replays) == 5
    for line in replays:
        token = line.split("--replay ", 1)[1]
        assert Example.parse(token).token() == token


def test_a_wrapped_token_breaks_only_after_commas():
    lines = fuzz_command.quoted_token_lines("replay: x --replay ", TOKEN, 50, "  ")
    assert all(len(line) <= 50 for line in lines)
    assert lines[0] == "replay: x --replay 'missing=join_mm,post=caller,"
    assert all(line.endswith(",") for line in lines[:-1]) and lines[-1].endswith("'")
    *_, pasted = shlex.split("\n".join(lines))  # a shell keeps the line breaks inside the quotes
    assert pasted != TOKEN and Example.parse(pasted).token() == TOKEN


def test_progress_is_drawn_only_on_a_terminal(capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tally = Tally(examples=12)
    log, terminal = io.StringIO(), Terminal()
    for stream in (log, terminal):
        progress = Progress(examples=50, stream=stream)
        progress.update(tally, force=True)
        progress.close(tally)
    assert log.getvalue() == ""
    assert terminal.getvalue().startswith("\rfuzz [#######") and "12/50 examples" in terminal.getvalue()
    # The command under a captured (not a terminal) stderr: no `\r` frames at all.
    status, _, err = _fuzz(capsys, "--examples", "20", "--seed", "1", "--steps", "2")
    assert status == 1 and err == ""


# --- an example that never finishes --------------------------------------------------------------


# An interrupt can land in hypothesis's gc callback, which swallows it (Python reports it as unraisable);
# run_with_timeout interrupts again until the thread leaves, so the warning is expected, not a fault.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_example_that_hangs_is_reported_with_its_replay_and_the_run_goes_on(capsys, columns, monkeypatch,
                                                                                tmp_path):
    columns(400)  # every replay on one line
    calls = []
    run_program = fuzz_command.run_program

    def hangs_once(plan, shape, device, steps=3, data_seed=0):
        calls.append(data_seed)
        if len(calls) == 3:  # a later example than the first (whose program and reference are calls 1 and 2)
            stuck = device.alloc(1, fill=0.0, name="stuck")
            while device.host_read(stuck)[0] == 0:  # waits for a value nothing writes
                pass
        return run_program(plan, shape, device, steps, data_seed)

    monkeypatch.setattr(fuzz_command, "run_program", hangs_once)
    target = tmp_path / "out.json"
    # 3 s: far more than an example takes on a loaded CI machine (0.5 s was not: an ordinary example
    # there was counted as hung too); the one that hangs never finishes, whatever the limit.
    status, out, err = _fuzz(capsys, "--examples", "4", "--seed", "1", "--steps", "2", "--quiet", "--timeout", "3",
                             "--json", str(target))
    assert status == 1
    data = json.loads(target.read_text())
    assert data["examples"] == 4  # the run went on after it
    (hung,) = [p for p in data["plans_tried"] if p["hung"]]
    assert hung["hung"] == 1
    site = f"test_fuzz_cli.py:{hangs_once.__code__.co_firstlineno + 4} (in hangs_once)"
    assert hung["first_finding"]["hung"] == ("did not finish within 3 s (its thread was interrupted); last recorded "
                                             f"operation: HostAccess `host read` at {site}")
    assert "examples that did not finish: 1" in out
    assert f"hung: did not finish within 3 s (its thread was interrupted); last recorded operation: HostAccess " \
           f"`host read` at {site}" in out
    # Its replay line is in the table, and names the example that hung.
    assert f"--replay {shlex.quote(hung['first_finding']['replay'])}" in out
    assert Example.parse(hung["first_finding"]["replay"]).data_seed == calls[2]


# --- options that are refused or explained (issue 21) ---------------------------------------


def test_a_negative_budget_says_what_a_budget_is(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["fuzz", "--budget", "-5s"])
    assert exc.value.code == 2
    assert "a duration like 60s; a value that starts with '-' is written --budget=-5s" in capsys.readouterr().err
    status, out, err = _fuzz(capsys, "--budget=-5s")
    assert (status, out) == (2, "")
    assert err.strip() == "streamcheck fuzz: error: --budget '-5s': the budget must be positive"


@pytest.mark.parametrize("size", [["--examples", "5"], ["--budget", "10s"]])
def test_replay_refuses_a_run_size_it_would_ignore(capsys, size):
    status, out, err = _fuzz(capsys, "--replay", TOKEN, *size)
    assert (status, out) == (2, "")
    assert f"--replay runs the one example its token describes; {size[0]} sizes a fuzz run: drop {size[0]}" in err


def test_a_plan_whose_first_finding_raced_only_gets_a_replay_of_its_wrong_values(capsys, columns):
    from flashnorm_kernels.commands.fuzz import merge_tallies, summary, summary_json, tally_to_json

    race_only, wrong = (run_example(Example.parse(_with(TOKEN, "seed", seed))) for seed in ("0", "1"))
    assert race_only.races and not race_only.wrong and wrong.wrong  # seed 0 does not strike, seed 1 does
    tally = Tally()
    for outcome in (race_only, wrong):
        tally.add(outcome, unsafe=True)
    merged = merge_tallies([tally_to_json(tally)])  # as --workers hands it over
    for table in (tally, merged):
        text = summary(table, 1.0, "sim", "streamcheck-fuzz", "all", width=400)
        assert f"replay: streamcheck fuzz --backend sim --replay {race_only.example.token()}" in text
        assert f"replay (wrong values): streamcheck fuzz --backend sim --replay {wrong.example.token()}" in text
        (record,) = summary_json(table, 1.0, "sim", "streamcheck-fuzz", "all", 3, 0)["plans_tried"]
        assert record["first_finding"]["replay"] == race_only.example.token()
        assert record["first_wrong_values"]["replay"] == wrong.example.token()
    status, out, _ = _fuzz(capsys, "--replay", wrong.example.token())
    assert status == 1 and "values: WRONG (differ from the sequential run)" in out  # it replays the wrong run


def test_json_dash_is_stdout_and_the_table_goes_to_stderr(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, err = _fuzz(capsys, "--examples", "5", "--seed", "7", "--json", "-")
    data = json.loads(out)  # nothing else on stdout
    assert status == 1 and data["examples"] == 5 and err.startswith("streamcheck fuzz: 5 examples in ")
    status, out, err = _fuzz(capsys, "--replay", TOKEN, "--json", "-")
    assert json.loads(out)["replay"] == TOKEN and err.startswith("example: ")
    assert list(tmp_path.iterdir()) == []
