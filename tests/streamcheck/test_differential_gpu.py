"""The same verdict on the GPU and on the sim (issue 37): every torch program of tests/gpu_programs/torch
that the sim emulates runs under `streamcheck run --backend gpu` (the GPU recorder, a real H100/H200)
and under `streamcheck run --backend sim` (the emulation on the CPU), and the two race sets are compared
by kind and by the program's own lines of both accesses. A difference is a bug in one of the two models;
a limit known and documented is listed in LIMITS with its reason (and docs/gpu-results.md's table).

    pytest -m gpu tests/streamcheck/test_differential_gpu.py
    STREAMCHECK_DIFFERENTIAL_TABLE=out.md pytest -m gpu ...   # also writes the table docs/gpu-results.md keeps
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.streamcheck.emulation.test_torch_programs_sim import EMULATED
from tests.streamcheck.record.adapters.test_torch_programs_gpu import (in_program, missing_gpu, parse_header,
                                                                       streamcheck_run)

# program name -> why its GPU and sim verdicts may differ (each a documented limit, never a shrug)
LIMITS: dict = {}


def _races(program: Path, backend: str, json_path: Path) -> tuple:
    """(exit status, {(kind, first line, second line)} of the races between two of the program's own lines,
    stderr)."""
    options = ("--backend", backend) + (("--schedules", "0") if backend == "sim" else ())
    run = streamcheck_run(program, *options, report=json_path)
    found = {(r["kind"], int(r["first"]["site"].rpartition(":")[2]), int(r["second"]["site"].rpartition(":")[2]))
             for r in run.races if in_program(r["first"]["site"], program) and in_program(r["second"]["site"], program)}
    return run.returncode, found, run.stderr


def _table_row(program: Path, gpu: set, sim: set) -> str:
    def words(races):
        return ", ".join(f"{k} {a}->{b}" for k, a, b in sorted(races)) or "clean"
    same = "same" if gpu == sim else ("limit: " + LIMITS[program.name] if program.name in LIMITS else "DIFFERENT")
    return f"| {program.name} | {parse_header(program).kinds or 'clean'} | {words(gpu)} | {words(sim)} | {same} |"


@pytest.mark.gpu
@pytest.mark.parametrize("program", EMULATED, ids=[p.name for p in EMULATED])
def test_the_gpu_and_the_sim_report_the_same_races_at_the_same_lines(program, tmp_path):
    reason = missing_gpu()
    if reason:
        pytest.skip(reason)
    gpu_status, gpu, gpu_err = _races(program, "gpu", tmp_path / "gpu.json")
    sim_status, sim, sim_err = _races(program, "sim", tmp_path / "sim.json")
    table = os.environ.get("STREAMCHECK_DIFFERENTIAL_TABLE")
    if table:
        with open(table, "a", encoding="utf-8") as f:
            f.write(_table_row(program, gpu, sim) + "\n")
    assert gpu_status == 0 and sim_status == 0, f"gpu: {gpu_status}\n{gpu_err[-3000:]}\nsim: {sim_status}\n" \
                                                f"{sim_err[-3000:]}"
    if program.name in LIMITS:
        pytest.skip(f"known limit: {LIMITS[program.name]}")
    assert gpu == sim, f"{program.name}: the GPU reported {sorted(gpu)}, the sim {sorted(sim)}\n--- gpu\n" \
                       f"{gpu_err[-3000:]}\n--- sim\n{sim_err[-3000:]}"
