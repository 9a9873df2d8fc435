"""Where the attached module's prefill time goes (issue 22, item 7): one variable changed at a time.

    python benchmarks/profile_prefill.py [--rows 256,512] [--repeats 9]

The attached module's pre-scaled path issues the same two kernels as bench_norm_proj's `folded`
(F.rms_norm without gain, F.linear with W*), yet measured 4-7 µs slower at M = 256 and 512. The
differences between the two: the weight tensor (its values and its address), the output kept alive
until the next step (StepPerInput holds it), the input a fresh view, and the module's Python. Each
variant below changes one of them; all are timed as bench_norm_proj times them (steps captured in one
CUDA graph, replays between CUDA events, medians sampled round-robin), in the same order every
round (as bench_norm_proj sampled them before) and in a new seeded order each round, and the
kernels each path issues are listed from torch.profiler, with their device times.

What it found on the H200 (docs/benchmarks.md, 2026-12-02): the kernels were the same, and the gap
came from the fixed order. Shuffled, every variant read within a few per cent of the others, so
bench_norm_proj now shuffles.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

EPS = 1e-5


def _bench_norm_proj():
    path = Path(__file__).with_name("bench_norm_proj.py")
    spec = importlib.util.spec_from_file_location("bench_norm_proj", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernels_of(torch, fn) -> list:
    """(kernel name, device µs) for each kernel one call of `fn` launches."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    found = []
    for event in prof.events():
        if event.device_type.name == "CUDA":
            found.append((event.name[:90], round(event.device_time, 1)))
    return found


def profile_rows(torch, bench, m: int, d: int, n: int, repeats: int) -> dict:
    import torch.nn.functional as F

    from flashnorm_kernels.fold import layout_for
    from flashnorm_kernels.hf_cuda import CudaNormProjection
    from flashnorm_kernels.plan import SyncPlan

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(m, d, generator=gen) * 2).to(dev, bf16)
    gain = (1 + 0.2 * torch.randn(d, generator=gen)).to(dev)
    w = (torch.randn(n, d, generator=gen) / d ** 0.5).to(dev, bf16)
    w_folded = (w.float() * gain[None, :]).to(bf16)
    gain_bf16 = gain.to(bf16)
    norm = bench._hf_rmsnorm(torch, d, EPS).to(dev, bf16)
    linear = torch.nn.Linear(d, n, bias=False).to(dev, bf16)
    with torch.no_grad():
        norm.weight.copy_(gain_bf16)
        linear.weight.copy_(w)
    attached = CudaNormProjection("profile", norm, [linear], layout_for("llama").gain, eps=EPS,
                                  plan=SyncPlan.correct(), max_tokens=m)
    w_attached = attached.weight
    w_copy = w_attached.clone()  # the attached weight's values at a fresh address
    kept = []

    def keep(out):
        kept[:] = [out]  # as StepPerInput: the output lives until the next step's replaces it
        return out

    paths = {
        "rms_norm(w)": lambda: F.linear(F.rms_norm(x, (d,), gain_bf16, EPS), w),
        "folded(w_folded)": lambda: F.linear(F.rms_norm(x, (d,), None, EPS), w_folded),
        "folded(attached W*)": lambda: F.linear(F.rms_norm(x, (d,), None, EPS), w_attached),
        "folded(W* copy)": lambda: F.linear(F.rms_norm(x, (d,), None, EPS), w_copy),
        "folded(w_folded), output kept": lambda: keep(F.linear(F.rms_norm(x, (d,), None, EPS), w_folded)),
        "matmul(w)": lambda: F.linear(x, w),
        "matmul(w_folded)": lambda: F.linear(x, w_folded),
        "matmul(attached W*)": lambda: F.linear(x, w_attached),
        "attached": lambda: attached.outputs(x[:])[0],
        "attached _prescaled direct": lambda: attached._prescaled(x)[0],
    }
    with torch.no_grad():
        steps, replays = 20, 20
        graphs = {}
        for name, fn in paths.items():
            before = attached.forget_previous_step if name == "attached" else None
            graphs[name] = bench.capture(torch, fn, steps, before_capture=before, after_capture=before)
        times = {order: bench.interleaved_medians(torch, graphs, steps, replays, repeats, shuffle=order == "shuffled")
                 for order in ("fixed", "shuffled")}
        kernels = {name: kernels_of(torch, fn) for name, fn in paths.items()}
    reference = paths["folded(attached W*)"]().float()
    errors = {name: float((fn().float() - reference).abs().max() / reference.abs().max())
              for name, fn in paths.items() if name.startswith("attached")}
    stats = {name: {"mean": float(t.float().mean()), "std": float(t.float().std()),
                    "zero_frac": float((t == 0).float().mean())}
             for name, t in (("w", w), ("w_folded", w_folded), ("attached W*", w_attached))}
    return {"M": m, "d": d, "n": n, "us": times, "kernels": kernels, "weight_stats": stats, "errors": errors,
            "addresses": {"w": w.data_ptr() % 4096, "w_folded": w_folded.data_ptr() % 4096,
                          "attached W*": w_attached.data_ptr() % 4096}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="256,512", help="comma-separated M (d=4096, n=12288)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    try:
        rows_wanted = [int(m) for m in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: comma-separated positive integers (M), got {args.rows!r}")
    if not rows_wanted or min(rows_wanted) < 1:
        parser.error(f"--rows: comma-separated positive integers (M), got {args.rows!r}")
    import torch

    if not torch.cuda.is_available():
        print("profile_prefill: needs an NVIDIA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    bench = _bench_norm_proj()
    rows = [profile_rows(torch, bench, m, 4096, 12288, args.repeats) for m in rows_wanted]
    for row in rows:
        print(f"\nM={row['M']} d={row['d']} n={row['n']} (µs per call, median of {args.repeats})")
        fixed, shuffled = row["us"]["fixed"], row["us"]["shuffled"]
        print(f"  {'path':34s} {'fixed order':>12s} {'shuffled':>12s}  (µs; x rms_norm)")
        for name in fixed:
            print(f"  {name:34s} {fixed[name]:7.1f} {fixed[name] / fixed['rms_norm(w)']:4.2f}x"
                  f" {shuffled[name]:7.1f} {shuffled[name] / shuffled['rms_norm(w)']:4.2f}x")
        for name, ks in row["kernels"].items():
            print(f"  kernels of {name}: " + "; ".join(f"{k} {t}" for k, t in ks))
        print(f"  weights: {row['weight_stats']}  address mod 4096: {row['addresses']}")
        print(f"  max relative error vs folded(attached W*): {row['errors']}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "profile_prefill.json"), "w", encoding="utf-8") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
