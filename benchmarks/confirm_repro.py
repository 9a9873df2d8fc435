"""The repro's buggy generation as a plain GPU program, to time `streamcheck run --confirm` on it.

    streamcheck run --confirm benchmarks/confirm_repro.py [--tokens 64] [--plan implicit-join|correct]

The fixture model of `streamcheck repro implicit-join` on the GPU, attached with the talk's plan
(SyncPlan.implicit_join(): no join_mm) through the zero-copy CUDA path (hf.attach(model, "cuda")),
generating greedily; no delay and no recording of its own, so `streamcheck run` records its torch and
CuPy work, reports the missing wait, and `--confirm` reruns it once per race. Prints the text.
"""
from __future__ import annotations

import argparse

import torch

from flashnorm_kernels.commands.repro import FIXTURE
from flashnorm_kernels.generation import run_generation_cuda
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, decode, encode, load_fixture_model

PLANS = {"implicit-join": SyncPlan.implicit_join, "correct": SyncPlan.correct}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--plan", choices=sorted(PLANS), default="implicit-join")
    args = parser.parse_args()
    model = load_fixture_model(FIXTURE).to("cuda")
    run = run_generation_cuda(model, encode(PROMPT), args.tokens, PLANS[args.plan](), check=False)
    torch.cuda.synchronize()
    print(decode(run.tokens))


if __name__ == "__main__":
    main()
