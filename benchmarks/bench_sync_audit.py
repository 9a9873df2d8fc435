"""The sync audit's cost on the repro's generations (CPU): the trace of
`streamcheck repro implicit-join --tokens N` on the sim, buggy (SyncPlan.implicit_join()) and
fixed (SyncPlan.correct()), audited; median of repeats, with the checks made and one plain
happens-before check of the same trace beside it for scale. Target: <= 10 s each for 300 tokens.

    python benchmarks/bench_sync_audit.py [--tokens 300] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

from flashnorm_kernels.generation import run_generation
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, encode, load_fixture_model
from streamcheck.analyses.sync_audit import audit
from streamcheck.core.hb import check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = load_fixture_model("tiny_llama_zen")
    prompt = encode(PROMPT)
    print(f"tokens={args.tokens} repeats={args.repeats}")
    for name, plan in (("implicit_join", SyncPlan.implicit_join()), ("correct", SyncPlan.correct())):
        trace = run_generation(model, prompt, args.tokens, plan, backend="sim", policy="eager").device.trace
        audits, checks = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = audit(trace)
            audits.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            check(trace)
            checks.append(time.perf_counter() - t0)
        a, c = statistics.median(audits), statistics.median(checks)
        print(f"{name}: {len(trace)} ops, {len(result.findings)} syncs, {result.checks} checks; audit {a:.2f} s, "
              f"one check {c:.3f} s ({a / c:.0f}x); {result.summary()}")


if __name__ == "__main__":
    main()
