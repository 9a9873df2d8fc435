"""The PyTorch bug programs of tests/gpu_programs/torch/ on the sim, on this CPU: the same
headers as on a GPU (tests/streamcheck/record/adapters/test_torch_programs_gpu.py) decide what each must
show.

- A racy program reports a race of each expected kind between two of its own lines, and its
  RESULT line counts wrong values in at least one of a handful of seeded schedules (the header's
  delay, then random and PCT ones): the stale reads really happen.
- Its twin reports no race and never computes a wrong value under the same schedules, and the
  sync audit runs on it (the same verdicts with the native checker as with hb.Checker).
- A program CUDA refuses at capture gets CUDA's error name, as the GPU run prints it.
- What the sim does not emulate is said in one line naming it (CuPy, make_graphed_callables),
  or, for CUDA graph trees, in a notice while the compiled code runs as eager operators.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.streamcheck.record.adapters.test_torch_programs_gpu import PROGRAMS, USES_CUPY, parse_header

from streamcheck.emulation.script import run_script

SCHEDULES = (("random", 0), ("random", 1), ("pct", 0), ("pct", 1))  # after the header's delay
GRAPHED_CALLABLES = re.compile(r"make_graphed_callables\(")
GRAPH_TREES = re.compile(r"mode=\"reduce-overhead\"|torch\.compiler\.cudagraph_mark_step_begin")


def _kind(program: Path) -> str:
    text = program.read_text(encoding="utf-8")
    if USES_CUPY.search(text):
        return "cupy"
    if GRAPHED_CALLABLES.search(text):
        return "graphed-callables"
    if GRAPH_TREES.search(text):
        return "graph-trees"
    return "emulated"


EMULATED = [p for p in PROGRAMS if _kind(p) == "emulated"]
REFUSED = [p for p in PROGRAMS if _kind(p) in ("cupy", "graphed-callables")]
GRAPH_TREE_PROGRAMS = [p for p in PROGRAMS if _kind(p) == "graph-trees"]


def result(run) -> dict:
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line; status {run.status}\n{run.stdout[-2000:]}\n{run.error[-3000:]}{run.refused}"
    return json.loads(lines[-1][len("RESULT "):])


def own_kinds(run, program: Path) -> set:
    """Kinds of the races whose two accesses are lines of `program`."""
    return {r.kind for r in run.device.races
            if Path(r.first.site.file).name == program.name and Path(r.second.site.file).name == program.name}


def schedules(header) -> list:
    """(policy, seed, parameters) of the runs that try to make a race strike."""
    runs = []
    for option, name in zip(header.delay[::2], header.delay[1::2]):
        runs.append(("delay", 0, {"streams": [name]} if option == "--delay-stream" else {"kernels": [name]}))
    return runs + [(policy, seed, {}) for policy, seed in SCHEDULES]


@pytest.mark.parametrize("program", EMULATED, ids=[p.name for p in EMULATED])
def test_program_is_reported_as_on_a_gpu_and_its_race_strikes_on_the_sim(program):
    header = parse_header(program)
    first = run_script(str(program))
    assert first.refused == "" and first.error == "", f"{program.name}: {first.refused}{first.error}"
    assert first.status == 0, first.stdout
    if header.capture_error is not None:
        assert [e.code for e in first.capture_errors] == [header.capture_error], first.stdout
        assert result(first)["wrong"] > 0  # CUDA refused the graph whatever the timing
        return
    assert own_kinds(first, program) == set(header.kinds), first.device.report()
    assert result(first)["wrong"] == 0, "the sequential reference must compute the right values"
    wrong = []
    for policy, seed, params in schedules(header):
        run = run_script(str(program), policy=policy, seed=seed, check=False, **params)
        assert run.status == 0 and run.error == "", run.error
        wrong.append(result(run)["wrong"])
    if header.clean:
        assert wrong == [0] * len(wrong), f"{program.name}, a fixed twin, went wrong: {wrong}"
    elif header.strikes:
        assert any(wrong), f"{program.name}: no schedule made its race strike: {wrong}"


@pytest.mark.parametrize("program", REFUSED, ids=[p.name for p in REFUSED])
def test_what_the_sim_does_not_emulate_is_refused_in_one_line_naming_it(program):
    run = run_script(str(program))
    assert run.status == 2 and run.error == ""
    assert "\n" not in run.refused
    named = "CuPy" if _kind(program) == "cupy" else "make_graphed_callables"
    assert named in run.refused and "--backend gpu" in run.refused, run.refused
    assert f"{program.name}:" in run.refused or "import cupy" in run.refused, run.refused


# torch.compiler.cudagraph_mark_step_begin imports Inductor's graph trees, which import torch.utils.mkldnn,
# whose class body uses torch.jit.script_method: torch's own deprecation, raised inside the program's import.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("program", GRAPH_TREE_PROGRAMS, ids=[p.name for p in GRAPH_TREE_PROGRAMS])
def test_graph_trees_are_named_as_not_emulated_and_the_program_runs_eagerly(program):
    run = run_script(str(program))
    assert run.status == 0 and run.error == "" and run.refused == "", run.error
    assert any("CUDA graph trees are not emulated" in notice for notice in run.notices), run.notices
    assert result(run)["wrong"] == 0


def test_every_torch_program_is_in_one_of_the_groups():
    assert len(EMULATED) >= 20 and set(EMULATED) | set(REFUSED) | set(GRAPH_TREE_PROGRAMS) == set(PROGRAMS)


FIXED = [p for p in EMULATED if p.name.startswith("fixed_")]


@pytest.mark.parametrize("program", FIXED, ids=lambda p: p.name)
def test_the_sync_audit_runs_on_every_fixed_program_with_either_checker(program, monkeypatch):
    """`--audit-syncs` on each fixed twin (CUDA graphs, captures, host threads, pinned memory among
    them): it reports no race of the program's own, gives every synchronization a verdict, and says
    the same with the native checker as with the Python one (hb.Checker, the reference)."""
    from streamcheck.analyses import sync_audit
    from streamcheck.core import hb

    run = run_script(str(program))
    assert run.status == 0 and not run.refused, run.error
    ops = list(run.device.trace)
    audited = sync_audit.audit(ops)
    assert audited.races == ()
    assert [f.number for f in audited.findings] == list(range(1, len(sync_audit.find_syncs(ops)) + 1))
    monkeypatch.setattr(sync_audit, "new_checker", hb.Checker)
    assert sync_audit.audit(ops).format() == audited.format()


RACY = [p for p in EMULATED if p.name.startswith("race_") and parse_header(p).capture_error is None]


@pytest.mark.parametrize("program", RACY, ids=lambda p: p.name)
def test_every_racy_programs_report_is_the_same_from_either_checker(program):
    """The native checker's reports come from a replay up to the last new race and the later
    occurrences folded in: on each racy program, the same report text, hazards and witnesses as
    hb.Checker's (the reference) for the same trace."""
    from streamcheck.core import fast, hb

    run = run_script(str(program))
    native = run.device.checker
    assert isinstance(native, fast.NativeChecker) and native.races, "the run must be checked natively and race"
    reference = hb.Checker()
    for op in run.device.trace:
        reference.feed(op)
    assert hb.format_report(native.races) == hb.format_report(reference.races)
    assert [h.to_dict() for h in native.hazards] == [h.to_dict() for h in reference.hazards]
    for race in reference.races:
        assert native.witness(race, latest=True) == reference.witness(race, latest=True)
    if native.native:  # (a graph hands over to hb.Checker) these programs race first in their first steps
        assert native.replayed < len(run.device.trace)
