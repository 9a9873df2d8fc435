"""The sync audit's proof on the GPU, as figures: each over-synchronized program of
tests/gpu_programs/ under `streamcheck run --audit-syncs --prove` (the removable syncs skipped in
reruns under delays, the outputs compared), then its script span timed with CUDA events, as
recorded and with those syncs skipped (median of --repeats each, both under recording), per
step. Prints a markdown table for docs/benchmarks.md. Needs a GPU and torch (CuPy for its row).

    python benchmarks/bench_sync_audit_gpu.py [--steps 16] [--repeats 5] [--programs a.py,b.py]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

from streamcheck.proofs.sync_proof_gpu import time_spans

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS_DIR = os.path.join(ROOT, "tests", "gpu_programs")
# (script, the library it needs, steps per STEPS argument: the decode loop's argument is tokens, of 4 layer steps)
PROGRAMS = (("audit_oversync_torch.py", "torch", 1), ("audit_decode_loop_torch.py", "torch", 4),
            ("audit_oversync_cupy.py", "cupy", 1))


def prove(script: str, args: tuple) -> dict:
    """The --json report of `streamcheck run --audit-syncs --prove script args`."""
    with tempfile.TemporaryDirectory(prefix="bench-sync-audit-") as tmp:
        report = os.path.join(tmp, "report.json")
        proc = subprocess.run([sys.executable, "-m", "streamcheck.cli", "run", "--audit-syncs", "--prove", "--json",
                               report, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0 or not os.path.exists(report):
            raise SystemExit(f"{script}: streamcheck run exited {proc.returncode}\n{proc.stderr[-4000:]}")
        with open(report, encoding="utf-8") as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="the programs' STEPS (the decode loop's tokens)")
    parser.add_argument("--repeats", type=int, default=5, help="timed reruns each, as recorded and edited")
    names = [name for name, _, _ in PROGRAMS]
    parser.add_argument("--programs", default=",".join(names), help=f"comma-separated, of {', '.join(names)}")
    args = parser.parse_args()
    chosen = [n for n in args.programs.split(",") if n]
    unknown = [n for n in chosen if n not in names]
    if unknown or not chosen:
        parser.error(f"--programs: {', '.join(unknown) or '(none)'}: choose from {', '.join(names)}")
    print(f"steps={args.steps} repeats={args.repeats}; script span under recording, CUDA events, median\n")
    print("| program | steps | syncs needed / total | skipped | proof | µs/step as recorded | µs/step edited "
          "| saved per step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, library, per in (p for p in PROGRAMS if p[0] in chosen):
        if importlib.util.find_spec(library) is None:
            print(f"| {name} | | | | {library} not installed | | | |")
            continue
        script, script_args, steps = os.path.join(PROGRAMS_DIR, name), (str(args.steps),), args.steps * per
        data = prove(script, script_args)
        audit, proof = data["sync_audit"], data["sync_proof"]
        verdict = {True: "removable", False: "NOT removable", None: "not claimed"}[proof["removable"]]
        skipped = ", ".join(f"#{n}" for n in proof["skipped"]) or "none"
        row = f"| {name} | {steps} | {audit['needed']} / {audit['total']} | {skipped} | {verdict} |"
        if not proof["skip_syncs"]:
            print(row + " | | |")
            continue
        before, after = time_spans(script, script_args, proof["skip_syncs"], args.repeats)
        if not (before and after):
            print(row + " the timed reruns did not report their span | | |")
            continue
        b, a = statistics.median(before) / steps, statistics.median(after) / steps
        print(f"{row} {b:.1f} | {a:.1f} | {b - a:.1f} µs ({(b - a) / b:.0%}) |")


if __name__ == "__main__":
    main()
