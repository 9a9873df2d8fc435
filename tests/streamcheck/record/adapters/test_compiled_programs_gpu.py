"""torch.compile under `streamcheck run`, on a real GPU (issue 22, item 1).

The racy PyTorch bug programs whose racy part is a compilable function (tests/gpu_programs/torch/,
those that write their kernels as `@compiled` functions: _torch_common.compiled) run with
STREAMCHECK_PROGRAMS_COMPILE=1, so each of those functions goes through torch.compile (whole graph)
and its work is Inductor's Triton kernels, launched from the generated wrapper:
- the run records Inductor's kernels (`triton_*` launches in --ops-json): the compile did not fall
  back to eager under the recording's dispatch mode;
- a racy program keeps its report: a race of each expected kind between two of its own lines (the
  compiled function's `def` line is the user's frame Dynamo runs);
- under its declared delay the race strikes (the delay is issued before Inductor's launches too);
- its fixed twin stays clean, under the same delay, with the right values.

    pytest -m gpu tests/streamcheck/record/adapters/test_compiled_programs_gpu.py
"""
from __future__ import annotations

import json
import re

import pytest

from tests.streamcheck.record.adapters.test_torch_programs_gpu import (DELAY_US, PROGRAMS, assert_ran_cleanly, missing_gpu,
                                                                own_races, parse_header, streamcheck_run)

USES_COMPILED = re.compile(r"^@compiled$", re.M)
COMPILED = [p for p in PROGRAMS if USES_COMPILED.search(p.read_text(encoding="utf-8"))]
COMPILE_ENV = {"STREAMCHECK_PROGRAMS_COMPILE": "1"}


def inductor_launches(ops_json) -> list:
    return [op["name"] for op in json.loads(ops_json.read_text(encoding="utf-8"))
            if op["op"] == "Launch" and op["name"].startswith("triton_")]


@pytest.mark.gpu
@pytest.mark.parametrize("program", COMPILED, ids=[p.name for p in COMPILED])
def test_compiled_program_keeps_its_report_and_strikes_under_its_delay(program, tmp_path):
    reason = missing_gpu()
    if reason:
        pytest.skip(reason)
    header = parse_header(program)
    first = streamcheck_run(program, report=tmp_path / "races.json", env=COMPILE_ENV, ops=tmp_path / "ops.json")
    what = f"{program.name} compiled"
    assert_ran_cleanly(first, what)
    launched = inductor_launches(tmp_path / "ops.json")
    assert launched, f"{what}: no Inductor kernel was recorded (did torch.compile fall back to eager?)\n" \
                     f"{first.describe()}"
    summary = "\n".join(f"  {r['kind']} {r['first']['site']} -> {r['second']['site']}" for r in first.races)
    if header.clean:
        assert first.races == [], f"{what}: a fixed twin, yet races were reported:\n{summary}\n{first.describe()}"
        assert first.result()["wrong"] == 0
    for kind in header.kinds:
        assert own_races(first.races, kind, program), f"{what}: no {kind} race between two of its own lines; " \
                                                      f"reported:\n{summary}\n{first.describe()}"
    options = (*header.delay, "--delay-us", DELAY_US)
    delayed = streamcheck_run(program, *options, env=COMPILE_ENV)
    assert_ran_cleanly(delayed, f"{what} {' '.join(options)}")
    result = delayed.result()
    if header.clean:
        assert result["wrong"] == 0 and result["observed"] == result["expected"], f"{what}: {result}"
    elif header.strikes:
        assert result["wrong"] > 0, f"{what}: the race did not strike under {' '.join(options)}: {result}\n" \
                                    f"{delayed.describe()}"


def test_the_compiled_programs_are_racy_programs_with_their_twins():
    names = {p.name for p in COMPILED}
    assert len(names) >= 12, sorted(names)
    for name in names:
        other = name.replace("race_", "fixed_", 1) if name.startswith("race_") else name.replace("fixed_", "race_", 1)
        assert other in names, f"{name}: its twin {other} writes its kernels as @compiled functions too"
