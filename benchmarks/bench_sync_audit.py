"""The sync audit's cost on the repro's generations (CPU): the trace of
`streamcheck repro implicit-join --tokens N` on the sim, buggy (SyncPlan.implicit_join()) and
fixed (SyncPlan.correct()), audited; median of repeats, with the checks made and one plain
happens-before check of the same trace beside it for scale. Target: <= 10 s each for 300 tokens.
`--against FILE`: another version of streamcheck/analyses/sync_audit.py, timed on the same traces
in the same run, one after the other (before and after a change, on the same machine and load):

    python benchmarks/bench_sync_audit.py [--tokens 300] [--repeats 3]
    git show REF:streamcheck/analyses/sync_audit.py > /tmp/before.py
    python benchmarks/bench_sync_audit.py --against /tmp/before.py
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

from flashnorm_kernels.generation import run_generation
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, encode, load_fixture_model
from streamcheck.analyses import sync_audit
from streamcheck.core.hb import check


def load_against(path: str):
    """The audit module in `path`, imported beside streamcheck.analyses (its relative imports
    resolve to this tree's core)."""
    if not os.path.isfile(path):
        print(f"bench_sync_audit: --against {path}: no such file; write one with "
              "`git show REF:streamcheck/analyses/sync_audit.py > FILE`", file=sys.stderr)
        raise SystemExit(2)
    spec = importlib.util.spec_from_file_location("streamcheck.analyses._against", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", metavar="FILE", help="another sync_audit.py, timed beside this one")
    args = parser.parse_args()
    versions = [("this tree", sync_audit)]
    if args.against:
        versions.insert(0, (os.path.basename(args.against), load_against(args.against)))
    model = load_fixture_model("tiny_llama_zen")
    prompt = encode(PROMPT)
    print(f"tokens={args.tokens} repeats={args.repeats}")
    for name, plan in (("implicit_join", SyncPlan.implicit_join()), ("correct", SyncPlan.correct())):
        trace = run_generation(model, prompt, args.tokens, plan, backend="sim", policy="eager").device.trace
        checks = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            check(trace)
            checks.append(time.perf_counter() - t0)
        c = statistics.median(checks)
        for label, module in versions:
            audits = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                result = module.audit(trace)
                audits.append(time.perf_counter() - t0)
            a = statistics.median(audits)
            print(f"{name} [{label}]: {len(trace)} ops, {len(result.findings)} syncs, {result.checks} checks; "
                  f"audit {a:.2f} s, one check {c:.3f} s ({a / c:.0f}x); {result.summary()}")


if __name__ == "__main__":
    main()
