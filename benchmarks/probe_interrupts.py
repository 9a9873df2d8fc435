"""Ctrl-C during `streamcheck run`, as a terminal sends it: SIGINT to the whole process group
(the run, its re-exec and its reruns), at a seeded random moment. What a user must see: exit
status 130, the one-line "interrupted" account, and what was found so far; never an abort
("terminate called without an active exception", status 134) or a process left behind.

    python benchmarks/probe_interrupts.py [--runs 10] [--seed 0] [--after 0.5 4.0] [-- RUN ARGS...]

Default run: `streamcheck run --confirm tests/gpu_programs/torch/race_pinned_rewritten_by_host.py`
(recording, a report, then confirmation reruns in fresh processes: every stage can be hit).
Prints one line per run (when SIGINT went, status, the last stderr line) and a tally; exit 1 if
any run aborted, hung or left a process.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUN = ["--confirm", str(ROOT / "tests/gpu_programs/torch/race_pinned_rewritten_by_host.py")]
GRACE_S = 60  # after SIGINT, the run must be gone within this


def _default_sigint() -> None:
    """The child starts as from a terminal: SIGINT at its default (this probe may run as a
    background job, which ignores it), in a process group of its own for killpg."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setpgrp()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def one_run(run_args: list, after_s: float) -> dict:
    proc = subprocess.Popen([sys.executable, "-m", "streamcheck.cli", "run", *run_args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        proc.wait(timeout=after_s)
        sent = False  # finished before the interrupt
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        sent = True
    try:
        out, err = proc.communicate(timeout=GRACE_S)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        hung = True
    time.sleep(0.5)
    left = _group_alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    return {"after_s": after_s, "sent": sent, "status": proc.returncode, "hung": hung, "left_behind": left,
            "aborted": proc.returncode in (134, -6) or "terminate called" in err,
            "interrupted_line": "interrupted" in err, "last": (err.strip().splitlines() or [""])[-1][:160],
            "stderr_tail": err[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--after", type=float, nargs=2, default=(0.5, 4.0), metavar=("MIN_S", "MAX_S"))
    ap.add_argument("run_args", nargs="*", help="streamcheck run's arguments (after --)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    results = []
    for i in range(args.runs):
        r = one_run(args.run_args or DEFAULT_RUN, rng.uniform(*args.after))
        results.append(r)
        print(f"run {i}: SIGINT at {r['after_s']:.2f} s{'' if r['sent'] else ' (finished first)'}: status "
              f"{r['status']}{' ABORTED' if r['aborted'] else ''}{' HUNG' if r['hung'] else ''}"
              f"{' LEFT A PROCESS' if r['left_behind'] else ''}; last: {r['last']}", flush=True)
        if r["aborted"] or r["hung"]:
            print(r["stderr_tail"], flush=True)
    bad = [r for r in results if r["aborted"] or r["hung"] or r["left_behind"]]
    sent = [r for r in results if r["sent"]]
    # Killed by SIGINT itself (-2: it landed after Python's finalization gave SIGINT back to its default) is
    # what a shell reports as 130 too.
    print(f"{len(sent)} interrupted, {sum(r['status'] in (130, -2) for r in sent)} with status 130 (or killed by SIGINT), "
          f"{sum(r['interrupted_line'] for r in sent)} said so; {len(bad)} aborted, hung or left a process")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
