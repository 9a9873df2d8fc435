"""RMSNorm + projection on one GPU (bf16): the baselines against FlashNorm's dual-stream path.

    python benchmarks/bench_norm_proj.py [--shapes 1x4096x12288,...] [--repeats 15]

Every path is timed the same way: `steps` calls captured in one CUDA graph
(torch.cuda.CUDAGraph), the graph replayed `replays` times between two CUDA events,
time per call = elapsed / (replays * steps); the median of `repeats` such samples,
taken round-robin over the paths so that clock and power drift hits all alike.
Graph replay takes Python and launch overhead out, as an inference engine does.

Paths, for x [M, d] and a projection [n, d]:
- hf_eager:   transformers' LlamaRMSNorm (fp32 norm, cast, gain) then F.linear
- rms_norm:   F.rms_norm(x, gain) then F.linear (the fair baseline: fused norm)
- folded:     F.rms_norm(x) without gain then F.linear with W* = W·diag(g) (Prop 1 only)
- matmul:     F.linear(x, W*) alone (what the dual-stream path cannot beat)
- dual_graph: our pipeline, flashnorm_kernels.DeferredNormProjection with SyncPlan.correct(),
              issued through the device API on Device("cupy", check=False, caller="torch")
              (the legacy caller stream maps to torch's current stream), captured in the
              graph: matmul on stream A (torch/cuBLAS), RMS on stream B (our CUDA kernel),
              post-scale on the caller after both joins, every edge an event. The device
              API's Python cost is paid at capture time only, as for the baselines.
- dual_raw:   the same kernels, streams and events launched by hand (no device API):
              a cross-check that the pipeline adds nothing on the GPU.
- dual_raw_4chunks (M >= 1024, experiment): as dual_raw, but the matmul is issued in 4
              row blocks, each with its own join event, so the post-scale of block k
              overlaps the matmul of block k+1.
- dual_eager: the pipeline called eagerly (no graph), CUDA events around many steps:
              bound by the host (device-API bookkeeping), reported for information.
- attached:   what a model runs: flashnorm_kernels.hf_cuda.CudaNormProjection (hf.attach(model, "cuda"))
              on a norm and a Linear, captured: the dual-stream path below prefill_rows rows, the
              pre-scaled path (F.rms_norm without gain, F.linear with W*) from there on.

Targets (docs/benchmarks.md): dual-stream >= 1.40x faster than hf_eager at M=1 and within 1.10x of
matmul alone; not slower than rms_norm at prefill. Prints a markdown table; writes JSON
to $OUT/bench_norm_proj.json when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

SHAPES = ((1, 4096, 12288), (16, 4096, 12288), (512, 4096, 12288), (4096, 4096, 12288))
EPS = 1e-5


def _parse_shapes(text: str):
    shapes = []
    for item in text.split(","):
        try:
            m, d, n = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {item!r} is not MxDxN (e.g. 1x4096x12288)") from None
        shapes.append((m, d, n))
    return tuple(shapes)


def _hf_rmsnorm(torch, d: int, eps: float):
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        return LlamaRMSNorm(d, eps=eps)
    except ImportError:  # transformers missing: the same forward, written out
        class LlamaRMSNorm(torch.nn.Module):
            def __init__(self, hidden, eps):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(hidden))
                self.variance_epsilon = eps

            def forward(self, h):
                dtype = h.dtype
                h = h.to(torch.float32)
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
                return self.weight * h.to(dtype)

        return LlamaRMSNorm(d, eps)


def _cupy_stream(cupy, torch_stream):
    """A CuPy stream object for a torch stream (same CUDA stream)."""
    ptr = torch_stream.cuda_stream
    if ptr == 0:
        return cupy.cuda.Stream.null

    class _Protocol:
        def __cuda_stream__(self):
            return (0, ptr)

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_Protocol())
    return cupy.cuda.ExternalStream(ptr)


def capture(torch, fn, steps: int, before_capture=None, after_capture=None):
    """`steps` calls of `fn` captured in one CUDA graph, after a warm-up off the default
    stream (torch's capture recipe: cuBLAS workspaces, lazy loads, allocator warm)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if before_capture:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            fn()
    if after_capture:
        after_capture()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_us(torch, graph, steps: int, replays: int) -> float:
    """One sample: µs per call over `replays` back-to-back replays between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (replays * steps)


def interleaved_medians(torch, graphs: dict, steps: int, replays: int, repeats: int, *, shuffle: bool = True,
                        seed: int = 0) -> dict:
    """Median per path, sampling the paths round-robin so that clock and power drift
    (a long bf16 GEMM heats the chip) falls on every path alike, in a new seeded order each
    round: in a fixed order a path's place in the round biased its time (profile_prefill.py
    measured a path sampled late in the round up to 6 µs slower at M = 256 with the same kernels)."""
    samples = {name: [] for name in graphs}
    order, rng = list(graphs), random.Random(seed)
    for _ in range(repeats):
        if shuffle:
            rng.shuffle(order)
        for name in order:
            samples[name].append(replay_us(torch, graphs[name], steps, replays))
    return {name: statistics.median(v) for name, v in samples.items()}


def eager_time_us(torch, fn, iters: int, repeats: int):
    """Median µs per call of `fn` issued eagerly, CUDA events around `iters` calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(samples)


def bench_shape(torch, cupy, m: int, d: int, n: int, args) -> dict:
    import torch.nn.functional as F

    from flashnorm_kernels import kernels_cuda
    from flashnorm_kernels.pipeline import DeferredNormProjection
    from flashnorm_kernels.plan import SyncPlan
    from streamcheck.device import Device

    dev = torch.device("cuda")
    bf16 = torch.bfloat16
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(m, d, generator=gen) * 2).to(dev, bf16)
    gain = (1 + 0.2 * torch.randn(d, generator=gen)).to(dev)
    w = (torch.randn(n, d, generator=gen) / d ** 0.5).to(dev, bf16)
    w_folded = (w.float() * gain[None, :]).to(bf16)  # Prop 1, folded in fp32
    gain_bf16 = gain.to(bf16)

    norm = _hf_rmsnorm(torch, d, EPS).to(dev, bf16)
    with torch.no_grad():
        norm.weight.copy_(gain_bf16)

    big = m * n >= 1 << 24
    steps = 4 if big else 20
    replays = 5 if big else 20
    errors = {}

    @torch.no_grad()
    def hf_eager():
        return F.linear(norm(x), w)

    @torch.no_grad()
    def rms_norm():
        return F.linear(F.rms_norm(x, (d,), gain_bf16, EPS), w)

    @torch.no_grad()
    def folded():
        return F.linear(F.rms_norm(x, (d,), None, EPS), w_folded)

    @torch.no_grad()
    def matmul():
        return F.linear(x, w_folded)

    reference = hf_eager().float()

    def rel_err(out) -> float:
        return float((out.float() - reference).abs().max() / reference.abs().max())

    graphs = {name: capture(torch, fn, steps)
              for name, fn in (("hf_eager", hf_eager), ("rms_norm", rms_norm), ("folded", folded), ("matmul", matmul))}

    # --- our pipeline through the device API, captured ---------------------------------
    device = Device("cupy", check=False, caller="torch")
    module = DeferredNormProjection(device, [w_folded.float().cpu().numpy()], eps=EPS, plan=SyncPlan.correct(),
                                    dtype="bfloat16", max_tokens=m, name="bench")
    xbuf = module.alloc_input(m, name="x")
    # Same bf16 bits as x: no rounding on the way.
    device.upload(xbuf, x.view(torch.int16).cpu().numpy().view(module.storage.alloc_dtype), stream=device.legacy)
    device.synchronize()
    kernels_cuda.compile_kernels()
    outs = []

    def dual_step():
        outs[:] = module(xbuf)

    graphs["dual_graph"] = capture(torch, dual_step, steps, before_capture=module.forget_previous_step,
                                   after_capture=module.forget_previous_step)
    device.synchronize()
    out_bits = cupy.asnumpy(outs[0].array())
    errors["dual_graph"] = rel_err(torch.from_numpy(module.decode(out_bits)).to(dev))

    # --- the same kernels by hand --------------------------------------------------------
    y = torch.empty(m, n, device=dev, dtype=bf16)
    out = torch.empty(m, n, device=dev, dtype=bf16)
    r = torch.empty(m, device=dev, dtype=torch.float32)
    x_cp, y_cp, out_cp = (cupy.from_dlpack(t.view(torch.int16)) for t in (x, y, out))
    r_cp = cupy.from_dlpack(r)
    stream_a, stream_b = torch.cuda.Stream(), torch.cuda.Stream()
    fork, join_rms = torch.cuda.Event(), torch.cuda.Event()
    chunk_done = [torch.cuda.Event() for _ in range(8)]
    columns = [(0, n)]

    def dual_raw(chunks: int = 1):
        # chunks > 1: an experiment. The post-scale of row block k (caller) overlaps the
        # matmul of block k+1 (A); each block has its own join_mm event.
        caller = torch.cuda.current_stream()
        fork.record(caller)
        stream_a.wait_event(fork)
        stream_b.wait_event(fork)
        with _cupy_stream(cupy, stream_b):
            kernels_cuda.rms(x_cp, r_cp, eps=EPS, dtype="bfloat16")
        join_rms.record(stream_b)
        caller.wait_event(join_rms)
        bounds = [m * k // chunks for k in range(chunks + 1)]
        for k in range(chunks):
            lo, hi = bounds[k], bounds[k + 1]
            with torch.cuda.stream(stream_a):
                torch.matmul(x[lo:hi], w_folded.t(), out=y[lo:hi])
            chunk_done[k].record(stream_a)
            caller.wait_event(chunk_done[k])
            with _cupy_stream(cupy, caller):
                kernels_cuda.postscale(y_cp[lo:hi], r_cp[lo:hi], out_cp[lo:hi], columns=columns, dtype="bfloat16")
        return out

    graphs["dual_raw"] = capture(torch, dual_raw, steps)
    errors["dual_raw"] = rel_err(dual_raw())
    if m >= 1024:
        graphs["dual_raw_4chunks"] = capture(torch, lambda: dual_raw(4), steps)
        errors["dual_raw_4chunks"] = rel_err(dual_raw(4))

    # --- what a model runs: hf.attach(model, "cuda")'s module, its path chosen by M ----------
    from flashnorm_kernels.fold import layout_for
    from flashnorm_kernels.hf_cuda import CudaNormProjection

    linear = torch.nn.Linear(d, n, bias=False).to(dev, bf16)
    with torch.no_grad():
        linear.weight.copy_(w)
    attached = CudaNormProjection("bench", norm, [linear], layout_for("llama").gain, eps=EPS, plan=SyncPlan.correct(),
                                  max_tokens=m)

    @torch.no_grad()
    def attached_step():
        return attached.outputs(x[:])[0]  # a new view each call: one step each (outputs() caches per tensor)

    # The war edge's event of the step before a capture was recorded outside it: waiting on it
    # inside is refused (cudaErrorInvalidValue), so the capture starts afresh, as decode_with_graph's does.
    graphs["attached"] = capture(torch, attached_step, steps, before_capture=attached.forget_previous_step,
                                 after_capture=attached.forget_previous_step)
    errors["attached"] = rel_err(attached_step())

    times = interleaved_medians(torch, graphs, steps, replays, args.repeats)
    if not args.no_eager:
        times["dual_eager"] = eager_time_us(torch, dual_step, iters=20 if big else 200, repeats=max(3, args.repeats // 3))
    return {"M": m, "d": d, "n": n, "dtype": "bfloat16", "us": times, "max_rel_err_vs_hf": errors,
            "attached_path": "pre-scaled" if m >= attached.prefill_rows else "dual-stream"}


def format_table(rows) -> str:
    cols = ["hf_eager", "rms_norm", "folded", "matmul", "dual_graph", "dual_raw", "dual_raw_4chunks", "dual_eager",
            "attached"]
    head = ("| M | d | n | " + " | ".join(f"{c} µs" for c in cols)
            + " | hf/dual | dual/matmul | dual/rms_norm | attached path | hf/attached | attached/rms_norm |")
    lines = [head, "|" + "---|" * (3 + len(cols) + 6)]
    for row in rows:
        t = row["us"]
        dual, att = t["dual_graph"], t["attached"]
        cells = [f"{t[c]:.1f}" if c in t else "-" for c in cols]
        lines.append(f"| {row['M']} | {row['d']} | {row['n']} | " + " | ".join(cells)
                     + f" | {t['hf_eager'] / dual:.2f}x | {dual / t['matmul']:.2f}x | {dual / t['rms_norm']:.2f}x"
                     + f" | {row['attached_path']} | {t['hf_eager'] / att:.2f}x | {att / t['rms_norm']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=_parse_shapes, default=SHAPES, help="comma-separated MxDxN")
    parser.add_argument("--repeats", type=int, default=15, help="samples per path (median reported)")
    parser.add_argument("--no-eager", action="store_true", help="skip the eager device-API timing")
    args = parser.parse_args(argv)

    try:
        import cupy
        import torch
    except ImportError as exc:
        print(f"bench_norm_proj: needs torch (CUDA build) and CuPy: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_norm_proj: needs an NVIDIA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2

    started = time.time()
    rows = []
    for m, d, n in args.shapes:
        rows.append(bench_shape(torch, cupy, m, d, n, args))
        print(f"  {m}x{d}x{n}: " + ", ".join(f"{k} {v:.1f}" for k, v in rows[-1]["us"].items()), file=sys.stderr)
    table = format_table(rows)
    gpu = torch.cuda.get_device_name()
    print(f"norm + projection, bf16, CUDA-graph replay, median of {args.repeats} ({gpu}, torch {torch.__version__}, "
          f"cupy {cupy.__version__})\n")
    print(table)
    for row in rows:
        print(f"max relative error vs hf_eager at M={row['M']}: "
              + ", ".join(f"{k} {v:.1e}" for k, v in row["max_rel_err_vs_hf"].items()))
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "bench_norm_proj.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "cupy": cupy.__version__, "repeats": args.repeats,
                       "seconds": round(time.time() - started, 1), "rows": rows, "table": table}, f, indent=2)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
