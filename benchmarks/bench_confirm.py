"""Wall time of `streamcheck run --confirm` on the racy programs of tests/gpu_programs/.

    python benchmarks/bench_confirm.py [--repeats 3] [--jobs 4] [--programs 'race_*'] [--suite all|cupy|torch]

Per program: the median wall time of `streamcheck run prog.py` (the check alone) and of
`streamcheck run --confirm prog.py` (the check plus one rerun per race, more when a rerun asks for
eager kernel loading or a longer delay), the races, how many were confirmed, and the reruns
(the replay lines' count of `--confirm-probe`). The ratio is what confirmation costs on top of a
check. `--jobs` programs run at once (each run is one process and a few ms of GPU work, so
programs hardly contend for the GPU; the host's cores are what they share). Prints a markdown
table; writes JSON to $OUT/bench_confirm.json when OUT is set.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "gpu_programs"


def _run(program: Path, confirm: bool) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "streamcheck.cli", "run", "--report-json", str(report)]
        cmd += ["--confirm"] if confirm else []
        start = time.perf_counter()
        subprocess.run(cmd + [str(program)], cwd=ROOT, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - start
        races = json.loads(report.read_text()) if report.exists() else []
    return seconds, races


def measure(program: Path, repeats: int) -> dict:
    plain = [_run(program, False)[0] for _ in range(repeats)]
    confirmed_runs = [_run(program, True) for _ in range(repeats)]
    races = confirmed_runs[-1][1]
    verdicts = [r.get("confirmation", {}) for r in races]
    return {"program": f"{program.parent.name}/{program.name}", "races": len(races),
            "confirmed": sum(1 for v in verdicts if v.get("confirmed")),
            "plain_s": statistics.median(plain), "confirm_s": statistics.median(s for s, _ in confirmed_runs),
            "not_confirmed": [v.get("text", "")[:160] for v in verdicts if not v.get("confirmed")]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--programs", default="race_*", help="glob over program names (default race_*)")
    parser.add_argument("--suite", choices=("all", "cupy", "torch"), default="all",
                        help="tests/gpu_programs/ (cupy), its torch/ folder (torch), or both")
    args = parser.parse_args()
    dirs = {"all": (PROGRAMS, PROGRAMS / "torch"), "cupy": (PROGRAMS,), "torch": (PROGRAMS / "torch",)}[args.suite]
    programs = sorted(p for d in dirs for p in d.glob("*.py") if fnmatch.fnmatch(p.name, args.programs))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda p: measure(p, args.repeats), programs))
    print("| program | races | confirmed | run (s) | run --confirm (s) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['program']} | {r['races']} | {r['confirmed']} | {r['plain_s']:.2f} | {r['confirm_s']:.2f} | "
              f"{r['confirm_s'] / r['plain_s']:.1f}x |")
    total_races = sum(r["races"] for r in rows)
    total_confirmed = sum(r["confirmed"] for r in rows)
    plain = sum(r["plain_s"] for r in rows)
    confirm = sum(r["confirm_s"] for r in rows)
    print(f"\n{total_confirmed} of {total_races} races confirmed over {len(rows)} programs; "
          f"total {plain:.1f} s checked, {confirm:.1f} s checked and confirmed ({confirm / plain:.1f}x; "
          f"median of {args.repeats}, {args.jobs} programs at a time)")
    for r in rows:
        for text in r["not_confirmed"]:
            print(f"not confirmed: {r['program']}: {text}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_confirm.json"), "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "repeats": args.repeats, "jobs": args.jobs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
