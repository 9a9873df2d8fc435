"""Long-generation timings on the CPU (sim backend), all in one run:

- 1,024 new tokens of the fixture under `delay` with the talk's plan (checker on): target <= 60 s;
- the same with the correct plan, the plain model alone for scale;
- `streamcheck repro implicit-join` end to end (three 300-token generations): target <= 2 minutes.

    python benchmarks/bench_generation.py [--repeats 3] [--tokens 1024]
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from flashnorm_kernels.commands.repro import strike_policy
from flashnorm_kernels.generation import run_generation
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, encode, load_fixture_model


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_fixture_model("tiny_llama_zen")
    ids = encode(PROMPT)
    n = args.tokens
    strike = strike_policy("sim", 0)

    def plain():
        with torch.no_grad():
            t = torch.tensor([ids])
            model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=n, min_new_tokens=n)

    rows = [
        ("plain model.generate (no pipeline)", median_seconds(plain, args.repeats)),
        ("implicit_join under delay, checker on", median_seconds(
            lambda: run_generation(model, ids, n, SyncPlan.implicit_join(), policy="delay", **strike), args.repeats)),
        ("correct under delay, checker on", median_seconds(
            lambda: run_generation(model, ids, n, SyncPlan.correct(), policy="delay", **strike), args.repeats)),
    ]
    exe = Path(sys.executable).with_name("streamcheck")
    repro = median_seconds(lambda: subprocess.run([str(exe), "repro", "implicit-join", "--backend", "sim"],
                                                  check=True, capture_output=True), 1)
    rows.append(("streamcheck repro implicit-join (3 x 300 tokens, process start included)", repro))
    print(f"| what ({n} new tokens, median of {args.repeats}) | seconds |\n|---|---|")
    for what, seconds in rows:
        print(f"| {what} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
