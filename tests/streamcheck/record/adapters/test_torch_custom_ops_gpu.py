"""Custom operators (torch.library) under `streamcheck run`, on a real GPU: the programs of
tests/gpu_programs/custom_ops/. Each `race_*.py` runs a custom operator on a side stream that
writes a tensor its schema does not declare written (through a Triton kernel's pointer, by an
operator that declares nothing and returns nothing), then reads it on the default stream with
no wait: a RAW race between the two lines marked `# RACE:`, and the note saying what was assumed. Its `fixed_*.py` twin declares
the write and waits: clean, no note.

    pytest -m gpu tests/streamcheck/record/adapters/test_torch_custom_ops_gpu.py
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.paths import GPU_PROGRAMS, ROOT

from .test_torch_programs_gpu import NO_RACES, assert_ran_cleanly, streamcheck_run

PROGRAMS_DIR = GPU_PROGRAMS / "custom_ops"
RACY = sorted(PROGRAMS_DIR.glob("race_*.py"))
NOTE = "streamcheck: note: custom operator"
# What each racy program's note must say: the operator and the assumption.
ASSUMED = {"race_raw_kernel_returns_nothing.py": ("`sc_programs.fill_raw.default` declares no written argument",
                                                  "every tensor argument is assumed written")}


def _missing(program: Path) -> str:
    if importlib.util.find_spec("torch") is None:
        return "needs torch with CUDA (torch is not installed)"
    import torch

    if not torch.cuda.is_available():
        return f"needs an NVIDIA GPU that torch can use (torch {torch.__version__} sees no CUDA device)"
    if "import triton" in program.read_text(encoding="utf-8") and importlib.util.find_spec("triton") is None:
        return "needs Triton (the operator's kernel is a Triton kernel)"
    return ""


def marked_line(program: Path, mark: str) -> str:
    """`path:line` (relative to the repository, as reports give it) of the line marked `mark`."""
    lines = program.read_text(encoding="utf-8").splitlines()
    (number,) = [i for i, line in enumerate(lines, start=1) if mark in line]
    return f"{program.relative_to(ROOT)}:{number}"


@pytest.mark.gpu
@pytest.mark.parametrize("program", RACY, ids=[p.name for p in RACY])
def test_an_undeclared_write_by_a_custom_operator_races_and_its_fixed_twin_is_clean(program, tmp_path):
    reason = _missing(program)
    if reason:
        pytest.skip(reason)
    racy = streamcheck_run(program, report=tmp_path / "racy.json")
    assert_ran_cleanly(racy, program.name)
    write, read = marked_line(program, "# RACE: the write"), marked_line(program, "# RACE: the read")
    found = [(r["kind"], r["first"]["site"], r["second"]["site"]) for r in racy.races]
    assert ("RAW", write, read) in found, f"{program.name}: no RAW race {write} -> {read}; found {found}\n" \
                                          f"{racy.describe()}"
    notes = [line for line in racy.stderr.splitlines() if line.startswith(NOTE)]
    assert any(all(part in line for part in ASSUMED[program.name]) for line in notes), racy.describe()

    twin = program.with_name("fixed_" + program.name[len("race_"):])
    fixed = streamcheck_run(twin, report=tmp_path / "fixed.json")
    assert_ran_cleanly(fixed, twin.name)
    assert fixed.races == [] and NO_RACES in fixed.stderr, fixed.describe()
    assert NOTE not in fixed.stderr, f"{twin.name} declares its write: nothing to assume\n{fixed.describe()}"


def test_every_racy_program_has_its_twin_and_its_expected_note():
    assert sorted(p.name for p in RACY) == sorted(ASSUMED)
    for program in RACY:
        assert program.with_name("fixed_" + program.name[len("race_"):]).exists(), program.name
        assert marked_line(program, "# RACE: the write") and marked_line(program, "# RACE: the read")
