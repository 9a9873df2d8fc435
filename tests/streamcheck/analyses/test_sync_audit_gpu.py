"""`streamcheck run --audit-syncs` on the GPU: over-synchronized CuPy and torch programs
(tests/gpu_programs/audit_*.py) recorded by the adapters, each synchronization's verdict
from the real trace, with CuPy's `stream.done` and torch's `Event.query()` as polling; and
`--prove`: the removable syncs skipped in reruns (torch's at their Python entry points), the
outputs the same, the script span timed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamcheck.device.backends import gpu_available
from tests.paths import GPU_PROGRAMS, ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not gpu_available(), reason="needs an NVIDIA GPU and CuPy (CuPy missing or no CUDA device here)")]


def _audit(program, tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "streamcheck.cli", "run", "--audit-syncs", "--report-json",
                           str(report), str(GPU_PROGRAMS / program)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1].partition("RESULT ")[2])
    assert result["wrong"] == 0, result
    data = json.loads(report.read_text())
    assert data["races"] == [], proc.stderr
    verdicts = {}
    for finding in data["sync_audit"]["findings"]:
        line = int(finding["site"].rpartition(":")[2])
        verdicts.setdefault(line, set()).add(finding["verdict"])
    return proc, data["sync_audit"], verdicts


def _line(program, text) -> int:
    lines = (GPU_PROGRAMS / program).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_cupy_oversync_verdicts(tmp_path):
    program = "audit_oversync_cupy.py"
    proc, audit, verdicts = _audit(program, tmp_path)
    assert verdicts[_line(program, "a.synchronize()")] == {"device-side suffices"}, proc.stderr
    assert verdicts[_line(program, "the same wait twice")] == {"redundant"}, proc.stderr
    assert verdicts[_line(program, "while not a.done")] == {"timing-dependent"}, proc.stderr
    assert verdicts[_line(program, "get(stream=b)")] == {"host needed"}, proc.stderr
    assert verdicts[_line(program, "Device().synchronize()")] == {"redundant"}, proc.stderr
    assert audit["needed"] < audit["total"], audit


def test_torch_oversync_verdicts(tmp_path):
    program = "audit_oversync_torch.py"
    proc, audit, verdicts = _audit(program, tmp_path)
    assert verdicts[_line(program, "torch.cuda.synchronize()")] == {"device-side suffices"}, proc.stderr
    assert verdicts[_line(program, "while not done.query()")] == {"timing-dependent"}, proc.stderr
    assert verdicts[_line(program, "y[0].item()")] == {"host needed"}, proc.stderr
    assert "redundant" in verdicts[_line(program, "the same wait twice")], proc.stderr
    assert audit["needed"] < audit["total"], audit


def test_the_cupy_backend_answers_queries_and_a_busy_loop_is_clean():
    import numpy as np

    from streamcheck.analyses.sync_audit import Verdict, audit
    from streamcheck.device import Device

    dev = Device("cupy", policy="delay", delay_us=2000, seed=0)
    a = dev.stream("A")
    y = dev.alloc((1 << 16,), name="y", fill=0)
    dev.upload(y, np.full(1 << 16, 5, dtype=np.float32), stream=a)
    polls = 0
    while not a.query():
        polls += 1
    value = dev.host_read(y)
    assert (value == 5).all() and dev.races == []
    (finding,) = [f for f in audit(dev.trace).findings if f.sync.kind == "query"]
    assert finding.verdict is Verdict.TIMING


def test_the_proof_skips_the_removable_cupy_syncs_and_times_the_saving(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "streamcheck.cli", "run", "--audit-syncs", "--prove",
                           str(GPU_PROGRAMS / "audit_oversync_cupy.py")], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    proof = proc.stderr.partition("proof on the GPU:")[2]
    assert "removable on this run" in proof, proc.stderr
    assert proof.count("same output, no new race") == 3, proc.stderr
    assert "time (script span, CUDA events, median of 3" in proof, proc.stderr


def test_torch_decode_loop_verdicts(tmp_path):
    program = "audit_decode_loop_torch.py"
    proc, audit, verdicts = _audit(program, tmp_path)
    numbers = {int(f["site"].rpartition(":")[2]): f["number"] for f in audit["findings"]}
    sync = _line(program, "torch.cuda.synchronize()  #")  # the loop's, not the docstring's
    assert verdicts[sync] == {"redundant"} and numbers[sync] in audit["removed"], proc.stderr
    assert verdicts[_line(program, "side.wait_stream(main)")] == {"necessary"}, proc.stderr
    assert numbers[_line(program, "main.wait_stream(side)")] in audit["keep"], proc.stderr  # the sync's cover
    assert verdicts[_line(program, "h.argmax().item()")] == {"host needed"}, proc.stderr


@pytest.mark.parametrize("program", ["audit_oversync_torch.py", "audit_decode_loop_torch.py"])
def test_the_proof_skips_the_removable_torch_syncs_and_the_outputs_match(program, tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "streamcheck.cli", "run", "--audit-syncs", "--prove",
                           "--json", str(report), str(GPU_PROGRAMS / program)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    proof, audit = data["sync_proof"], data["sync_audit"]
    assert proof["removable"] is True, proc.stderr
    assert sorted(proof["skipped"]) == sorted(audit["removed"] + audit["replaced"]) and proof["skipped"], proof
    kinds = {f["number"]: f["kind"] for f in audit["findings"]}
    assert {kinds[n] for n in proof["skipped"]} & {"device synchronize", "wait_event"}, proof  # torch's own
    assert sum("same output, no new race" in line for line in proof["lines"]) == 3, proc.stderr
    spans = proof["spans_us"]
    assert len(spans["as recorded"]) == len(spans["edited"]) == 3 and min(spans["edited"]) > 0, proof
