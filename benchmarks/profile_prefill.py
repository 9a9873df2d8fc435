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


def fused_rms_matmul(torch):
    """The experiment of item 7's second half: the 1/RMS row scale in the GEMM's epilogue. One
    Triton kernel computes out = diag(1/rms(x)) · (x · W*ᵀ): the sum of squares of each row of x
    is accumulated from the x tiles the matmul loads anyway, and applied to the fp32 accumulator
    before the store (FlashNorm's deferred normalization without a second kernel or stream).
    None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_stages=stages, num_warps=warps)
               for bm, bn, bk, stages, warps in ((128, 128, 64, 4, 8), (128, 256, 64, 3, 8), (64, 128, 64, 4, 4),
                                                 (64, 256, 64, 4, 8), (16, 128, 128, 4, 4))]

    @triton.autotune(configs=configs, key=["M", "N", "K"])
    @triton.jit
    def rms_matmul(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, eps,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        in_group = GROUP_M * tiles_n  # grouped order: neighbouring programs share W* tiles in L2
        first_m = (pid // in_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % group_m
        pid_n = (pid % in_group) // group_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        in_m, in_n = rm < M, rn < N
        x_tile = x_ptr + rm[:, None] * stride_xm + rk[None, :]
        w_tile = w_ptr + rn[None, :] * stride_wn + rk[:, None]  # a [BK, BN] tile of W*ᵀ
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        squares = tl.zeros((BM,), dtype=tl.float32)
        for _ in range(0, K, BK):  # K % BK == 0 (checked by the caller)
            a = tl.load(x_tile, mask=in_m[:, None], other=0.0)
            b = tl.load(w_tile, mask=in_n[None, :], other=0.0)
            acc = tl.dot(a, b, acc)
            af = a.to(tl.float32)
            squares += tl.sum(af * af, axis=1)
            x_tile += BK
            w_tile += BK
        scale = tl.rsqrt(squares / K + eps)
        out = (acc * scale[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], out, mask=in_m[:, None] & in_n[None, :])

    def run(x, w):
        m, k = x.shape
        n = w.shape[0]
        assert k % 128 == 0 and x.is_contiguous() and w.is_contiguous()
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        grid = lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)  # noqa: E731
        rms_matmul[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), EPS)
        return out
    return run


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


def profile_rows(torch, bench, fused, m: int, d: int, n: int, repeats: int) -> dict:
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
    if fused is not None:
        paths["triton rms·matmul (epilogue)"] = lambda: fused(x, w_attached)
    with torch.no_grad():
        steps, replays = 20, 20
        graphs = {}
        failed = {}
        for name, fn in list(paths.items()):
            before = attached.forget_previous_step if name == "attached" else None
            try:
                graphs[name] = bench.capture(torch, fn, steps, before_capture=before, after_capture=before)
            except Exception as exc:  # the experiment only: its failure is a result, not the end of the run
                if not name.startswith("triton"):
                    raise
                failed[name] = f"{type(exc).__name__}: {exc}"[:2000]
                del paths[name]
                torch.cuda.synchronize()
        times = {order: bench.interleaved_medians(torch, graphs, steps, replays, repeats, shuffle=order == "shuffled")
                 for order in ("fixed", "shuffled")}
        kernels = {name: kernels_of(torch, fn) for name, fn in paths.items()}
    reference = paths["folded(attached W*)"]().float()
    errors = {name: float((fn().float() - reference).abs().max() / reference.abs().max())
              for name, fn in paths.items() if name.startswith(("triton", "attached"))}
    stats = {name: {"mean": float(t.float().mean()), "std": float(t.float().std()),
                    "zero_frac": float((t == 0).float().mean())}
             for name, t in (("w", w), ("w_folded", w_folded), ("attached W*", w_attached))}
    return {"M": m, "d": d, "n": n, "us": times, "kernels": kernels, "weight_stats": stats, "errors": errors, "failed": failed,
            "addresses": {"w": w.data_ptr() % 4096, "w_folded": w_folded.data_ptr() % 4096,
                          "attached W*": w_attached.data_ptr() % 4096}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="256,512", help="comma-separated M (d=4096, n=12288)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("profile_prefill: needs an NVIDIA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    bench = _bench_norm_proj()
    fused = fused_rms_matmul(torch)
    rows = [profile_rows(torch, bench, fused, int(m), 4096, 12288, args.repeats) for m in args.rows.split(",")]
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
        for name, why in row["failed"].items():
            print(f"  {name} failed: {why}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "profile_prefill.json"), "w", encoding="utf-8") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
