"""The PyTorch bug programs (tests/gpu_programs/torch/) under `streamcheck run`, on a real GPU.

Each `race_*.py` rebuilds a stream-synchronization bug from public projects (allocator reuse
without `record_stream`, missing cross-stream edges, waits on the wrong stream, pinned host
memory rewritten or read too early, an unjoined fork in graph capture, torch <-> CuPy without
an edge, CuPy's pool across threads); its twin `fixed_*.py` (or `ok_*.py`) is the same program
with the fix the projects shipped. The programs are plain torch/CuPy and never import
streamcheck. Their header lines, after the docstring, say what the harness checks:

    # expect: RAW | WAR | WAW | FREE (several: comma-separated) | clean
    #         | capture-error: <CUDA error name>
    # delay: --delay-stream NAME | --delay-kernel NAME (several pairs allowed) | none
    # strikes: yes | no

Every program runs once as `python -m streamcheck.cli run --report-json r.json prog.py` (the way
users run it; the run exits with the program's own status, which must be 0, and prints no
internal error):
- a racy program must be reported with a race of each expected kind whose two accesses are the
  program's own lines (the report's `first`/`second` call sites point into the program file);
  a `capture-error` program must have streamcheck name that CUDA error on stderr;
- a twin must be reported clean: no race, no capture error.
Then the symptom. With `strikes: yes` and a delay, the racy program is rerun with that delay
plus `--delay-us 2000` (a 2 ms spin before each targeted launch or copy) and its RESULT line
must count wrong values; the twin, under the same delay, must count none. With `strikes: yes`
and `delay: none` (CUDA itself refuses the program, whatever the timing) the first run's
RESULT must already count wrong values. `strikes: no` marks races whose wrong value cannot
show in the output; those are checked by their report alone.

The header check at the bottom runs on the CPU too: every program's header parses, every racy
program has exactly one twin with the same delay, and every program compiles.

    pytest -m gpu tests/streamcheck/record/adapters/test_torch_programs_gpu.py
"""
from __future__ import annotations

import functools
import json
import os
import py_compile
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests.paths import GPU_PROGRAMS, ROOT

PROGRAMS_DIR = GPU_PROGRAMS / "torch"
PROGRAMS = sorted(p for p in PROGRAMS_DIR.glob("*.py") if not p.name.startswith("_"))
TIMEOUT_S = 300  # per run: a hung program fails its test instead of the session
DELAY_US = "2000"  # 2 ms: far longer than the other stream's work on 4 MiB buffers

KINDS = ("RAW", "WAR", "WAW", "FREE")
HEADER = re.compile(r"^#\s*(expect|delay|strikes):(.*)$")
DELAY_OPTIONS = ("--delay-stream", "--delay-kernel")
RACY_PREFIX = "race_"
WITHOUT_CUPY = GPU_PROGRAMS / "without_cupy"  # a stub `cupy` package whose import fails
USES_CUPY = re.compile(r"^\s*(import|from)\s+cupy\b|cupy_column", re.M)
TWIN_PREFIXES = ("fixed_", "ok_")
STREAMCHECK_IMPORT = re.compile(r"^\s*(import|from)\s+streamcheck\b", re.M)

INTERNAL_ERROR = "internal error"
NO_RACES = "streamcheck: no races found"
CAPTURE_ERROR = "stream-capture error"  # recorder.format_capture_errors' heading


@dataclass(frozen=True)
class Header:
    kinds: tuple  # race kinds expected; () for a clean program or a capture error only
    capture_error: Optional[str]  # CUDA's error name, e.g. cudaErrorStreamCaptureUnjoined
    delay: tuple  # `streamcheck run` options that make the race strike; () for none
    strikes: bool

    @property
    def clean(self) -> bool:
        return not self.kinds and self.capture_error is None


def parse_header(path: Path) -> Header:
    """The program's `# expect:`, `# delay:` and `# strikes:` lines; ValueError naming the file
    and what is wrong."""
    found: dict = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = HEADER.match(line.strip())
        if match is None:
            continue
        key, value = match.group(1), match.group(2).strip()
        if key in found:
            raise ValueError(f"{path.name}:{number}: a second `# {key}:` line")
        found[key] = value
    missing = [key for key in ("expect", "delay", "strikes") if key not in found]
    if missing:
        raise ValueError(f"{path.name}: no `# {missing[0]}:` line")

    expect, kinds, capture_error = found["expect"], (), None
    if expect.startswith("capture-error:"):
        capture_error = expect.partition(":")[2].strip()
        if not re.fullmatch(r"cudaError\w+", capture_error):
            raise ValueError(f"{path.name}: `# expect: capture-error:` needs CUDA's error name, got {capture_error!r}")
    elif expect != "clean":
        kinds = tuple(k.strip() for k in expect.split(","))
        bad = [k for k in kinds if k not in KINDS]
        if bad or len(set(kinds)) != len(kinds):
            raise ValueError(f"{path.name}: `# expect: {expect}`: kinds are {', '.join(KINDS)} (each once), "
                             "or `clean`, or `capture-error: <name>`")

    delay = () if found["delay"] == "none" else tuple(shlex.split(found["delay"]))
    pairs = list(zip(delay[::2], delay[1::2]))
    if len(delay) % 2 or any(option not in DELAY_OPTIONS or name.startswith("-") for option, name in pairs):
        raise ValueError(f"{path.name}: `# delay: {found['delay']}`: `none`, or pairs of "
                         f"{' / '.join(DELAY_OPTIONS)} NAME")

    if found["strikes"] not in ("yes", "no"):
        raise ValueError(f"{path.name}: `# strikes: {found['strikes']}`: yes or no")
    return Header(kinds, capture_error, delay, found["strikes"] == "yes")


def twin_of(racy: Path) -> list:
    """The fixed twins of `race_X.py`: fixed_X.py and ok_X.py, those that exist."""
    base = racy.name[len(RACY_PREFIX):]
    return [racy.with_name(prefix + base) for prefix in TWIN_PREFIXES if racy.with_name(prefix + base).exists()]


def racy_of(twin: Path) -> Path:
    prefix = next(p for p in TWIN_PREFIXES if twin.name.startswith(p))
    return twin.with_name(RACY_PREFIX + twin.name[len(prefix):])


# --- on the GPU ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def missing_gpu() -> str:
    """Why these programs cannot run here ('' when they can)."""
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA (torch is not installed)"
    if not torch.cuda.is_available():
        return f"needs an NVIDIA GPU that torch can use (torch {torch.__version__} sees no CUDA device)"
    try:
        import cupy  # noqa: F401
    except ImportError as exc:
        return f"needs CuPy next to CUDA torch (import cupy failed: {exc})"
    return ""


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    races: list  # the --report-json reports (hb.Race.to_dict), [] when not asked for

    def result(self) -> dict:
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"no RESULT line\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-6000:]}"
        return json.loads(lines[-1][len("RESULT "):])

    def describe(self) -> str:
        return f"exit status {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-8000:]}"


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def streamcheck_run(program: Path, *options: str, report: Optional[Path] = None, env: Optional[dict] = None,
                    ops: Optional[Path] = None) -> Run:
    cmd = [sys.executable, "-m", "streamcheck.cli", "run", *options]
    if report is not None:
        cmd += ["--report-json", str(report)]
    if ops is not None:
        cmd += ["--ops-json", str(ops)]
    cmd.append(str(program))
    env = {**{k: v for k, v in os.environ.items() if k != "STREAMCHECK_RUN"}, **(env or {})}
    try:
        # cwd=ROOT: the report's call sites are relative to the working directory.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out after {TIMEOUT_S} s: {' '.join(cmd)}\n--- stdout\n{_text(exc.stdout)[-3000:]}\n"
                    f"--- stderr\n{_text(exc.stderr)[-6000:]}", pytrace=False)
    data = json.loads(report.read_text(encoding="utf-8")) if report is not None and report.exists() else []
    races = data["races"] if isinstance(data, dict) else data  # a dict when free hazards (or more) follow
    return Run(proc.returncode, proc.stdout, proc.stderr, races)


def in_program(site: str, program: Path) -> bool:
    """Whether a report's `path:line` call site is a line of `program`."""
    path, _, line = site.rpartition(":")
    return line.isdigit() and (ROOT / path).resolve() == program.resolve()


def own_races(races: list, kind: str, program: Path) -> list:
    return [r for r in races if r["kind"] == kind
            and in_program(r["first"]["site"], program) and in_program(r["second"]["site"], program)]


def assert_ran_cleanly(run: Run, what: str) -> None:
    assert INTERNAL_ERROR not in run.stderr, f"{what}: streamcheck had an internal error\n{run.describe()}"
    assert run.returncode == 0, f"{what}: the program must exit 0 under streamcheck run\n{run.describe()}"


@pytest.mark.gpu
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_program_is_reported_as_labelled_and_strikes_under_its_delay(program, tmp_path):
    reason = missing_gpu()
    if reason:
        pytest.skip(reason)
    header = parse_header(program)
    first = streamcheck_run(program, report=tmp_path / "races.json")
    assert_ran_cleanly(first, program.name)
    summary = "\n".join(f"  {r['kind']} {r['first']['site']} -> {r['second']['site']}: {r['missing_edge']}"
                        for r in first.races) or "  (none)"

    if header.clean:
        assert first.races == [], f"{program.name} is a fixed twin, yet races were reported:\n{summary}\n" \
                                  f"{first.describe()}"
        assert NO_RACES in first.stderr, first.describe()
        assert CAPTURE_ERROR not in first.stderr, first.describe()
    for kind in header.kinds:
        assert own_races(first.races, kind, program), (
            f"{program.name}: no {kind} race between two of its own lines; reported:\n{summary}\n{first.describe()}")
    if header.capture_error is not None:
        assert header.capture_error in first.stderr, (
            f"{program.name}: streamcheck did not name {header.capture_error}\n{first.describe()}")

    result = first.result()
    if header.clean:
        assert result["wrong"] == 0, f"{program.name} computes wrong values without any delay: {result}"
    if not header.delay:
        if header.strikes:  # refused by CUDA whatever the timing: the first run already shows it
            assert result["wrong"] > 0, f"{program.name} was expected to go wrong: {result}\n{first.describe()}"
        return
    if not header.clean and not header.strikes:
        return
    options = (*header.delay, "--delay-us", DELAY_US)
    delayed = streamcheck_run(program, *options)
    assert_ran_cleanly(delayed, f"{program.name} {' '.join(options)}")
    result = delayed.result()
    if header.clean:
        assert result["wrong"] == 0, (f"{program.name} went wrong under {' '.join(options)} (the delay that breaks "
                                      f"{racy_of(program).name}): {result}")
        assert result["observed"] == result["expected"]
    else:
        assert result["wrong"] > 0, (f"{program.name}: the race did not strike under {' '.join(options)}: "
                                     f"{result}\n{delayed.describe()}")


TORCH_ONLY = [p for p in PROGRAMS if not USES_CUPY.search(p.read_text(encoding="utf-8"))
              and parse_header(p).delay and (parse_header(p).strikes or parse_header(p).clean)]


@pytest.mark.gpu
@pytest.mark.parametrize("program", TORCH_ONLY, ids=[p.name for p in TORCH_ONLY])
def test_program_strikes_under_torch_sleep_delays_without_cupy(program, tmp_path):
    """Issue 22, item 6: where CuPy is not installed, the delays are torch's own bounded sleep
    kernel; a racy program still goes wrong under its declared delay, its twin still does not,
    and the report is the same."""
    reason = missing_gpu()
    if reason:
        pytest.skip(reason)
    header = parse_header(program)
    options = (*header.delay, "--delay-us", DELAY_US)
    # `import cupy` fails in the run, as where CuPy is not installed
    hidden = os.pathsep.join(p for p in (str(WITHOUT_CUPY), os.environ.get("PYTHONPATH", "")) if p)
    delayed = streamcheck_run(program, *options, report=tmp_path / "races.json", env={"PYTHONPATH": hidden})
    what = f"{program.name} {' '.join(options)} without CuPy"
    assert_ran_cleanly(delayed, what)
    result = delayed.result()
    if header.clean:
        assert delayed.races == [] and result["wrong"] == 0, f"{what}: {result}\n{delayed.describe()}"
        return
    for kind in header.kinds:
        assert own_races(delayed.races, kind, program), f"{what}: no {kind} race reported\n{delayed.describe()}"
    assert result["wrong"] > 0, f"{what}: the race did not strike: {result}\n{delayed.describe()}"


# --- on the CPU too -----------------------------------------------------------------------

def test_there_are_programs_and_twins():
    racy = [p for p in PROGRAMS if p.name.startswith(RACY_PREFIX)]
    assert len(racy) >= 14, [p.name for p in PROGRAMS]
    assert len(PROGRAMS) == 2 * len(racy), "every program is a racy one or the twin of one"


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_program_header_twin_and_syntax(program, tmp_path):
    header = parse_header(program)
    source = program.read_text(encoding="utf-8")
    assert source.startswith('"""'), f"{program.name}: starts with a docstring saying which bug it rebuilds"
    assert not STREAMCHECK_IMPORT.search(source), f"{program.name}: the programs are plain torch/CuPy"
    assert "report(" in source, f"{program.name}: ends with _torch_common.report (the RESULT line)"
    py_compile.compile(str(program), cfile=str(tmp_path / "program.pyc"), doraise=True)

    if program.name.startswith(RACY_PREFIX):
        assert not header.clean, f"{program.name}: a racy program expects a race or a capture error"
        twins = twin_of(program)
        assert len(twins) == 1, f"{program.name}: needs exactly one twin (fixed_* or ok_*), found {twins}"
        twin = parse_header(twins[0])
        assert twin.delay == header.delay, f"{twins[0].name}: runs under its racy program's delay {header.delay}"
        if header.delay == ():
            assert header.strikes, f"{program.name}: `delay: none` with `strikes: no` checks no symptom at all"
    else:
        assert program.name.startswith(TWIN_PREFIXES), f"{program.name}: named race_*, fixed_* or ok_*"
        assert header.clean, f"{program.name}: a fixed twin expects `clean`"
        assert not header.strikes, f"{program.name}: a fixed twin never goes wrong (`strikes: no`)"
        assert racy_of(program).exists(), f"{program.name}: no racy program {racy_of(program).name}"


@pytest.mark.parametrize("text, message", [
    ("# expect: RAW\n# delay: --delay-stream s1\n", "no `# strikes:` line"),
    ("# expect: RACE\n# delay: none\n# strikes: yes\n", "kinds are"),
    ("# expect: RAW, RAW\n# delay: none\n# strikes: yes\n", "kinds are"),
    ("# expect: capture-error: unjoined\n# delay: none\n# strikes: yes\n", "CUDA's error name"),
    ("# expect: FREE\n# delay: --delay-stream\n# strikes: yes\n", "pairs of"),
    ("# expect: FREE\n# delay: --delay-us 2000\n# strikes: yes\n", "pairs of"),
    ("# expect: WAR\n# delay: none\n# strikes: maybe\n", "yes or no"),
    ("# expect: WAR\n# expect: RAW\n# delay: none\n# strikes: no\n", "a second `# expect:` line"),
])
def test_header_errors_name_the_file_and_the_problem(tmp_path, text, message):
    path = tmp_path / "race_bad.py"
    path.write_text('"""doc"""\n' + text, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_header(path)
    assert "race_bad.py" in str(info.value)


def test_header_parses_every_form(tmp_path):
    path = tmp_path / "race_ok.py"
    path.write_text('"""doc"""\n# expect: RAW, FREE\n# delay: --delay-stream s1 --delay-kernel aten.mul.Tensor\n'
                    "# strikes: yes\nimport torch\n", encoding="utf-8")
    assert parse_header(path) == Header(("RAW", "FREE"), None, ("--delay-stream", "s1", "--delay-kernel",
                                                                "aten.mul.Tensor"), True)
    path.write_text("# expect: capture-error: cudaErrorStreamCaptureUnjoined\n# delay: none\n# strikes: yes\n",
                    encoding="utf-8")
    header = parse_header(path)
    assert header == Header((), "cudaErrorStreamCaptureUnjoined", (), True) and not header.clean
    path.write_text("# expect: clean\n# delay: none\n# strikes: no\n", encoding="utf-8")
    assert parse_header(path).clean


def test_call_sites_match_only_the_program_file():
    program = PROGRAMS_DIR / "race_kv_swap_before_write.py"
    relative = program.relative_to(ROOT)
    assert in_program(f"{relative}:30", program)
    assert in_program(f"{program}:30", program)  # absolute when outside the working directory
    assert not in_program(f"{relative.with_name('_torch_common.py')}:30", program)
    assert not in_program("<string>:1", program)
    assert not in_program(f"{relative}:?", program)
