"""Transparency on a real GPU: ordinary, correct CuPy programs behave the same under
`streamcheck run` as under plain `python`.

Each script in tests/gpu_programs/transparency/ (CuPy) and tests/gpu_programs/compiled/ (torch.compile)
runs three times, each in its own process:
twice as `python prog.py` (the two runs must agree, or the program is not deterministic and
the comparison would mean nothing; the first also warms CuPy's kernel cache), then as
`python -m streamcheck.cli run prog.py`. Without --error-exitcode, `streamcheck run` exits with
the script's own status and writes its summary and race report to stderr only
(streamcheck/commands/run.py), so stdout and the exit status must be identical, and stderr must
say that no race was found, with no internal error and no stream-capture error. A script whose
plain run ends in a traceback must end the same way under streamcheck.

Lines among a script's first 20 configure its runs:

    # transparency-env: NAME=VALUE    set for both runs (CuPy reads some variables when it is
                                      imported, and streamcheck imports CuPy before the script)
    # transparency-exit: N            the plain run's expected exit status (default 0)

Wall times (the second plain run and the streamcheck run) are printed as a Markdown table when
the session ends and, if STREAMCHECK_TRANSPARENCY_LOG names a file, written there (under xdist,
one file per worker, suffixed with the worker's id):

    STREAMCHECK_TRANSPARENCY_LOG=transparency.md pytest -m gpu -s tests/streamcheck/record/test_transparency_gpu.py
"""
from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamcheck.device.backends import gpu_available
from tests.paths import GPU_PROGRAMS, ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU and CuPy (CuPy missing or no CUDA device)"),
]

PROGRAMS_DIR = GPU_PROGRAMS / "transparency"
COMPILED_DIR = GPU_PROGRAMS / "compiled"  # torch.compile programs (issue 22): Inductor's kernels, CUDA graph trees
PROGRAMS = sorted(PROGRAMS_DIR.glob("*.py")) + sorted(COMPILED_DIR.glob("*.py"))
TIMEOUT_S = 300  # per run: a hung program fails its test instead of the session
HEADER_LINES = 20
SETTING = re.compile(r"#\s*transparency-(env|exit):\s*(.+?)\s*$")

# streamcheck's own stderr lines (streamcheck/commands/run.py; Session.summary and report)
SUMMARY = re.compile(r"^streamcheck: recorded (\d+) operations on (\d+) stream\(s\), (\d+) host thread\(s\)", re.M)
RACES = re.compile(r"^streamcheck: (\d+) races? found", re.M)
NO_RACES = "streamcheck: no races found"
INTERNAL_ERROR = "internal error"
CAPTURE_ERROR = "stream-capture error"
NOT_INTERCEPTED = "streamcheck: not intercepted in this CuPy version"


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass(frozen=True)
class Row:
    program: str
    status: int
    plain_s: float
    checked_s: float
    operations: str
    streams: str
    threads: str
    result: str


def settings(program: Path) -> tuple[dict, int]:
    """(environment for both runs, expected exit status) from the script's header lines."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMCHECK_RUN"}
    expected = 0
    for line in program.read_text(encoding="utf-8").splitlines()[:HEADER_LINES]:
        match = SETTING.match(line.strip())
        if match is None:
            continue
        kind, value = match.groups()
        if kind == "exit":
            expected = int(value)
        else:
            name, _, val = value.partition("=")
            env[name.strip()] = val.strip()
    return env, expected


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run(cmd: list, env: dict) -> Run:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out after {TIMEOUT_S} s: {' '.join(cmd)}\n--- stdout\n{_text(exc.stdout)}\n"
                    f"--- stderr\n{_text(exc.stderr)}", pytrace=False)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def differences(first: Run, plain: Run, checked: Run) -> list:
    """What differs between the plain run and the streamcheck run, in a few words each."""
    found = []
    if (first.returncode, first.stdout) != (plain.returncode, plain.stdout):
        found.append("the program is not deterministic (two plain runs differ)")
    if checked.returncode != plain.returncode:
        found.append(f"exit status {checked.returncode} instead of {plain.returncode}")
    if checked.stdout != plain.stdout:
        found.append("stdout differs")
    races = RACES.search(checked.stderr)
    if races:
        found.append(f"{races.group(1)} race(s) reported")
    elif NO_RACES not in checked.stderr:
        found.append("no streamcheck report on stderr")
    if INTERNAL_ERROR in checked.stderr:
        found.append("internal error while recording")
    if CAPTURE_ERROR in checked.stderr:
        found.append("stream-capture error reported")
    if "Traceback (most recent call last)" in plain.stderr and last_line(plain.stderr) not in checked.stderr:
        found.append(f"the exception line {last_line(plain.stderr)!r} is missing")
    return found


def format_table(rows: list) -> str:
    lines = [f"Transparency suite: {environment()}", "",
             "| program | exit | plain (s) | streamcheck run (s) | ratio | operations | streams | threads | result |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: r.program):
        ratio = f"{r.checked_s / r.plain_s:.2f}" if r.plain_s > 0 else "-"
        lines.append(f"| {r.program} | {r.status} | {r.plain_s:.2f} | {r.checked_s:.2f} | {ratio} | {r.operations} | "
                     f"{r.streams} | {r.threads} | {r.result} |")
    lines += ["", "plain: the second `python prog.py` (the first warmed CuPy's kernel cache); streamcheck run: "
              "`python -m streamcheck.cli run prog.py`; each is the wall time of a whole process, CuPy's import "
              "and CUDA's start included."]
    return "\n".join(lines) + "\n"


def environment() -> str:
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        name = name.decode() if isinstance(name, bytes) else name
        return (f"{name}, CuPy {cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, "
                f"Python {sys.version.split()[0]}")
    except Exception as exc:  # the table is still worth having without this line
        return f"(device unknown: {exc})"


@pytest.fixture(scope="session")
def timing_table(pytestconfig):
    rows: list = []
    yield rows
    if not rows:
        return
    table = format_table(rows)
    path = os.environ.get("STREAMCHECK_TRANSPARENCY_LOG")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        Path(f"{path}.{worker}" if worker else path).write_text(table, encoding="utf-8")
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:  # none in xdist workers
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            for line in table.splitlines():
                reporter.write_line(line)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_program_behaves_the_same_under_streamcheck_run(program, timing_table):
    env, expected = settings(program)
    first = run([sys.executable, str(program)], env)
    assert first.returncode == expected, (
        f"{program.name} itself exits with {first.returncode}, not {expected}, without streamcheck:\n{first.stderr}")
    plain = run([sys.executable, str(program)], env)
    checked = run([sys.executable, "-m", "streamcheck.cli", "run", str(program)], env)

    found = differences(first, plain, checked)
    summary = SUMMARY.search(checked.stderr)
    ops, streams, threads = summary.groups() if summary else ("-", "-", "-")
    result = "; ".join(found) or "same"
    if NOT_INTERCEPTED in checked.stderr:
        result += f" ({checked.stderr.count(NOT_INTERCEPTED)} entry point(s) not intercepted)"
    timing_table.append(Row(program.name, plain.returncode, plain.seconds, checked.seconds, ops, streams, threads,
                            result))

    diff = "".join(difflib.unified_diff(plain.stdout.splitlines(True), checked.stdout.splitlines(True),
                                        "python prog.py", "streamcheck run prog.py"))
    assert not found, (f"{program.name}: {result}\n--- stdout diff\n{diff or '(none)'}\n"
                       f"--- streamcheck run stderr\n{checked.stderr[-6000:]}\n"
                       f"--- plain stderr\n{plain.stderr[-2000:]}")
