"""End-to-end greedy decode of a Llama-shaped model with random weights: HF eager against FlashNorm.

    python benchmarks/bench_e2e_decode.py [--batches 1,16] [--new-tokens 64] [--repeats 5] [--variants a,ag,b,c,d]
    python benchmarks/bench_e2e_decode.py --tiny --device cpu --variants a,as,b   # the logic, on a CPU (fp32)

The model is built from a transformers LlamaConfig directly on the device (no download):
default shapes are Llama-2-7B's (hidden 4096, 32 layers, intermediate 11008, 32 heads, 32 KV
heads, vocab 32000), bf16 on CUDA. Weights are seeded normal values (projections std
1/sqrt(fan_in), embeddings std 1); RMSNorm gains are 1 + 0.2·N(0, 1), so folding changes weights.

Variants, on ONE model instance (the fold is applied in place once, before b):
- a:  HF eager: the plain model, `model.generate` greedy with its DynamicCache.
- as: (not run by default) the plain model, `hf_cuda.greedy_decode(static_cache=True)`: the eager
      StaticCache loop that ag captures, to tell the graph's gain from the cache's.
- ag: (a') the plain model with CUDA graphs: `flashnorm_kernels.hf_cuda.decode_with_graph` (prefill
      eager, the decode step captured once over a StaticCache, one replay per token).
- b:  folded checkpoint, Prop 1 only: `flashnorm_kernels.fold.flashify(model)` (W* = W·g in place,
      norms left with unit gain), `model.generate`. HF's LlamaRMSNorm still multiplies by the
      (now unit) gain, so b does the same work as a: it checks the fold, it is not expected faster.
- c:  b + the dual-stream kernels: `flashnorm_kernels.hf.attach(model, "cuda", plan=SyncPlan.correct(),
      max_tokens=...)` (hf_cuda.CudaNormProjection per group), `model.generate`.
- d:  c with CUDA graphs: `hf_cuda.decode_with_graph` on the attached model.
Measured in the order a, as, ag, b, d, c (d before c: see main); the table lists a, as, ag, b, c, d.

Decode latency per token = the time of one decode step (one new token per sequence; the prefill is
excluded); tokens/s = batch / that time. Two ways of timing it, each used for like-for-like pairs:
- steps (a, b, c): a LogitsProcessor marks every step of `model.generate` (a CUDA event on the
  current stream, perf_counter on the CPU); µs/step = (last mark − first mark) / (N − 1).
- diff (as, ag, d): one opaque call each; µs/step = (T(N) − T(N0)) / (N − N0) with T the
  synchronized wall time of a call and N0 = N // 4: prefill, cache set-up and graph capture, the
  same in both calls, cancel. (The StaticCache is prompt + N long, so the N-token call's steps
  attend over a few more masked positions: negligible next to the weights at these sizes.)
Median of --repeats samples (fewer when --budget-s runs short: the table says how many).

Share of decode time in norm + projection: torch.profiler over --profile-steps decode steps of the
plain model (before the fold), every norm that feeds projections (input_layernorm,
post_attention_layernorm, the final norm) and every projection it feeds (q, k, v, gate, up,
lm_head) wrapped in record_function by forward hooks; s = CUDA kernel time inside those regions /
all CUDA kernel time of the steps (on the CPU: op CPU time / wall time).

Speedup in isolation: bench_norm_proj.bench_shape at this model's norm-fed shapes (q+k+v, gate+up,
lm_head; M = batch), HF eager RMSNorm + Linear against the dual-stream pipeline, both replayed as
CUDA graphs, weighted by how often each shape runs per token. Amdahl: expected whole-model speedup
1 / ((1 − s) + s / S); measured: ag → d (both graphs; a → c, eager, when graphs are unavailable).

Prints a markdown table; writes JSON to $OUT/bench_e2e_decode.json when OUT is set.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time

ORDER = ("a", "as", "ag", "b", "c", "d")
# d before c: both use the attachment, and d (graphs) is the number the Amdahl comparison needs,
# so a slow eager c must not use up the budget first.
RUN_ORDER = ("a", "as", "ag", "b", "d", "c")
DEFAULT_VARIANTS = ("a", "ag", "b", "c", "d")
LABELS = {
    "a": "(a) HF eager",
    "as": "(as) plain, StaticCache loop",
    "ag": "(a') plain + CUDA graph",
    "b": "(b) folded (Prop 1)",
    "c": "(c) folded + dual-stream",
    "d": "(d) (c) + CUDA graph",
}
METHOD = {"a": "steps", "b": "steps", "c": "steps", "as": "diff", "ag": "diff", "d": "diff"}
NORM_LABEL, PROJ_LABEL = "e2e.norm", "e2e.proj"


def _int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need integers >= 1")
    return values


def _variants(text: str) -> list:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in ORDER]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {unknown or text!r}; choose from {','.join(ORDER)}")
    return [v for v in ORDER if v in names]  # a -> b -> c -> d: the fold is applied in place once


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=32, help="32: Llama-2-7B; 8: Llama-3-8B-like GQA")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batches", type=_int_list, default=[1, 16])
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per sequence (random ids)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="samples per (variant, batch); the median is reported")
    p.add_argument("--variants", type=_variants, default=list(DEFAULT_VARIANTS),
                   help=f"comma-separated, of {','.join(ORDER)} (default {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                   help="default: bfloat16 on cuda, float32 on cpu (the fold is exact to rounding in fp32)")
    p.add_argument("--tiny", action="store_true",
                   help="hidden 64, 2 layers, intermediate 128, 4 heads (2 KV), vocab 128")
    p.add_argument("--profile-steps", type=int, default=3, help="decode steps profiled for the share (0: skip)")
    p.add_argument("--no-isolated", action="store_true", help="skip the isolated norm + projection timing")
    p.add_argument("--budget-s", type=float, default=210.0,
                   help="wall-clock budget of the whole run; repeats shrink, then items are skipped, to keep to it")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.hidden, args.layers, args.intermediate, args.heads, args.kv_heads, args.vocab = 64, 2, 128, 4, 2, 128
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.repeats < 1 or args.prompt < 1:
        p.error("--repeats and --prompt must be >= 1")
    if args.new_tokens < 2:
        p.error("--new-tokens must be >= 2 (decode steps are timed between the first and the last)")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    return args


class Clock:
    """CUDA events on the current stream (no host sync until read), or perf_counter on the CPU."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def us_between(self, first, last) -> float:
        if self.cuda:
            last.synchronize()
            return first.elapsed_time(last) * 1000.0
        return (last - first) * 1e6

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def build_model(torch, args, device, dtype):
    """A random-weight LlamaForCausalLM made on `device` (no CPU copy, no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=args.hidden, num_hidden_layers=args.layers, intermediate_size=args.intermediate,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=max(2048, args.prompt + args.new_tokens), rms_norm_eps=1e-5,
        tie_word_embeddings=False,  # Llama-2/3 7-8B have their own lm_head
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # greedy runs exactly N steps, never stops early
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are born in the target dtype, as from_pretrained(dtype=...) does
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    gen = torch.Generator(device=device).manual_seed(args.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:  # RMSNorm gains: around 1 but not 1, so Prop 1 really changes W
                param.normal_(1.0, 0.2, generator=gen)
            elif "embed_tokens" in name:
                param.normal_(0.0, 1.0, generator=gen)
            else:  # std 1/sqrt(fan_in) keeps activations O(1) through the layers
                param.normal_(0.0, param.shape[1] ** -0.5, generator=gen)
    return model


def prompt_ids(torch, args, batch: int, device):
    gen = torch.Generator().manual_seed(args.seed + batch)
    return torch.randint(0, args.vocab, (batch, args.prompt), generator=gen).to(device)


def hf_generate(torch, model, ids, n: int, marks=None):
    from transformers import LogitsProcessorList

    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, use_cache=True,
                              max_new_tokens=n, logits_processor=LogitsProcessorList([marks] if marks else []))


def step_marker(clock):
    from transformers import LogitsProcessor

    class StepMarks(LogitsProcessor):
        """Called once per forward of `generate`, after the logits: one mark per step."""

        def __init__(self):
            self.marks = []

        def __call__(self, input_ids, scores):
            self.marks.append(clock.mark())
            return scores

    return StepMarks()


class BudgetExceeded(Exception):
    """An item left out to stay inside --budget-s."""


class Budget:
    def __init__(self, seconds: float, started: float):
        self.seconds, self.started = seconds, started

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.started)


def measure(torch, variant, fn, ids, args, clock, budget, items_left) -> dict:
    """Median µs per decode step of `fn(ids, n)` (a generate-like call) and the tokens it made."""
    n, prompt = args.new_tokens, ids.shape[1]
    n0 = max(1, n // 4)

    def timed_call(count, marks=None):
        clock.sync()
        t0 = time.perf_counter()
        out = fn(ids, count, marks) if marks is not None else fn(ids, count)
        clock.sync()
        return out, time.perf_counter() - t0

    def one_sample():
        t0 = time.perf_counter()
        if METHOD[variant] == "steps":
            marks = step_marker(clock)
            out, _ = timed_call(n, marks)
            us = clock.us_between(marks.marks[0], marks.marks[-1]) / (len(marks.marks) - 1)
        else:
            out, t_n = timed_call(n)
            _, t_n0 = timed_call(n0)
            us = (t_n - t_n0) * 1e6 / (n - n0)
        return us, out, time.perf_counter() - t0

    # Warm-up: cuBLAS handles, allocator growth, lazy module loads, graph capture paths.
    _, warm_s = timed_call(n0)
    # A sample costs about n (steps) or n + n0 (diff) tokens at the warm-up's rate (an over-estimate:
    # the warm-up also paid the prefill and first calls). One that cannot fit is not started, so the
    # run ends inside its budget and still writes its results.
    estimate = warm_s * (n if METHOD[variant] == "steps" else n + n0) / n0
    if estimate > budget.left():
        raise BudgetExceeded(f"skipped: one sample would take ~{estimate:.0f} s, {max(budget.left(), 0):.0f} s left")
    us, out, cost = one_sample()
    samples = [us]
    # Further samples: as many as fit this item's share of what is left of the budget.
    share = budget.left() / max(items_left, 1)
    more = max(0, min(args.repeats - 1, int(share // max(cost, 1e-9))))
    for _ in range(more):
        us, out, _ = one_sample()
        samples.append(us)
    median = statistics.median(samples)
    batch = ids.shape[0]
    new_ids = out[:, prompt:] if out.shape[1] > n else out  # generate returns prompt + new tokens
    return {"us_per_step": median, "tokens_per_s": batch * 1e6 / median if median > 0 else float("nan"),
            "samples_us": samples, "repeats": len(samples), "method": METHOD[variant],
            "new_ids": new_ids[:, :n].cpu()}


def leading_equal(ref, got) -> list:
    """Per sequence: how many generated tokens match `ref` before the first difference."""
    k = min(ref.shape[1], got.shape[1])
    same = (ref[:, :k] == got[:, :k]).int()
    return same.cumprod(dim=1).sum(dim=1).tolist()


def norm_proj_share(torch, model, ids, steps: int, clock) -> dict:
    """Share of `steps` decode steps spent in the norms that feed projections and in those projections."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from flashnorm_kernels.fold import norm_groups

    handles = []

    def wrap(path, label):
        module = model.get_submodule(path)
        open_ranges = []

        def pre(mod, inputs):
            rng = record_function(label)
            rng.__enter__()
            open_ranges.append(rng)

        def post(mod, inputs, output):
            open_ranges.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    for norm_path, proj_paths in norm_groups(model):
        wrap(norm_path, NORM_LABEL)
        for path in proj_paths:
            wrap(path, PROJ_LABEL)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if clock.cuda else [])
    # transformers 5.2x renamed `past_key_values` to `cache` (argument and output field).
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def step(token_ids, cache=None):
        out = model(token_ids, use_cache=True, **({cache_kw: cache} if cache is not None else {}))
        return out.logits[:, -1:].argmax(-1), out[cache_kw]

    try:
        with torch.no_grad():
            nxt, cache = step(ids)  # prefill
            nxt, cache = step(nxt, cache)  # one unprofiled decode step: warm
            clock.sync()
            with profile(activities=activities) as prof:
                t0 = time.perf_counter()
                for _ in range(steps):
                    nxt, cache = step(nxt, cache)
                clock.sync()
                wall_us = (time.perf_counter() - t0) * 1e6
    finally:
        for handle in handles:
            handle.remove()
    return share_from_events(torch, prof.events(), clock.cuda, wall_us)


def share_from_events(torch, events, cuda: bool, wall_us: float) -> dict:
    from torch.autograd import DeviceType

    labels = (NORM_LABEL, PROJ_LABEL)
    ours = [e for e in events if e.name in labels and e.device_type == DeviceType.CPU]
    if cuda:
        # Kernels are linked to the op that launched them; our ranges' user-annotation spans on the
        # GPU carry the ranges' names and are not kernels.
        def kernel_us(event):
            return (sum(k.duration for k in event.kernels if k.name not in labels)
                    + sum(kernel_us(child) for child in event.cpu_children))

        part = {label: sum(kernel_us(e) for e in ours if e.name == label) for label in labels}
        total = sum(e.time_range.elapsed_us() for e in events
                    if e.device_type == DeviceType.CUDA and not e.is_user_annotation and e.name not in labels)
        method = "torch.profiler, CUDA kernel time in norm/projection ranges / all CUDA kernel time"
        if total > 0 and not (part[NORM_LABEL] and part[PROJ_LABEL]):
            # A share of 0 would make Amdahl expect nothing; say the profile did not link kernels instead.
            raise RuntimeError(f"profiler linked no kernels to the {NORM_LABEL}/{PROJ_LABEL} ranges "
                               f"({len(ours)} ranges, {total:.0f} µs of kernels in all)")
    else:
        part = {label: sum(e.cpu_time_total for e in ours if e.name == label) for label in labels}
        total = wall_us
        method = "torch.profiler, CPU op time in norm/projection ranges / wall time"
    share = (part[NORM_LABEL] + part[PROJ_LABEL]) / total if total > 0 else float("nan")
    return {"share": share, "norm_share": part[NORM_LABEL] / total if total > 0 else float("nan"),
            "proj_share": part[PROJ_LABEL] / total if total > 0 else float("nan"),
            "normproj_us": part[NORM_LABEL] + part[PROJ_LABEL], "total_us": total, "method": method}


def isolated_speedup(torch, args, batch: int) -> dict:
    """HF eager RMSNorm + Linear / dual-stream pipeline at this model's norm-fed shapes (graph replay)."""
    import cupy

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_norm_proj import bench_shape

    head_dim = args.hidden // args.heads
    shapes = [("q+k+v", (args.heads + 2 * args.kv_heads) * head_dim, args.layers),
              ("gate+up", 2 * args.intermediate, args.layers),
              ("lm_head", args.vocab, 1)]
    per_shape, hf_total, dual_total = [], 0.0, 0.0
    options = argparse.Namespace(repeats=7, no_eager=True)
    for name, n, count in shapes:
        us = bench_shape(torch, cupy, batch, args.hidden, n, options)["us"]
        per_shape.append({"what": name, "M": batch, "d": args.hidden, "n": n, "per_token": count,
                          "hf_eager_us": us["hf_eager"], "rms_norm_us": us["rms_norm"], "dual_us": us["dual_graph"]})
        hf_total += count * us["hf_eager"]
        dual_total += count * us["dual_graph"]
    return {"speedup": hf_total / dual_total, "shapes": per_shape,
            "note": "q/k/v and gate/up as one fused projection each (the model runs them as separate Linears)"}


def amdahl(share: float, speedup: float, t_before: float, t_after: float) -> dict:
    expected = 1.0 / ((1.0 - share) + share / speedup)
    measured = t_before / t_after
    expected_saved = 1.0 - 1.0 / expected
    measured_saved = 1.0 - t_after / t_before
    return {"expected_speedup": expected, "measured_speedup": measured,
            "expected_time_saved": expected_saved, "measured_time_saved": measured_saved,
            "fraction_reaching_model": measured_saved / expected_saved if expected_saved else float("nan")}


def format_table(rows, batches, variants) -> str:
    lines = ["| variant | batch | µs / decode step | tokens/s | vs (a) | leading tokens = (a), worst sequence | "
             "method | repeats |", "|---|---|---|---|---|---|---|---|"]
    for v in variants:
        for b in batches:
            r = rows[v][b]
            if "error" in r:
                lines.append(f"| {LABELS[v]} | {b} | {r['error']} | - | - | - | - | - |")
                continue
            base = rows.get("a", {}).get(b, {})
            vs = f"{base['us_per_step'] / r['us_per_step']:.2f}x" if "us_per_step" in base else "-"
            agree = f"{r['agree_min']}/{r['agree_of']}" if "agree_min" in r else "-"
            lines.append(f"| {LABELS[v]} | {b} | {r['us_per_step']:.1f} | {r['tokens_per_s']:.1f} | {vs} | {agree} | "
                         f"{r['method']} | {r['repeats']} |")
    return "\n".join(lines)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def main(argv=None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_e2e_decode: no CUDA device (use --device cpu for variants a, b)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    clock = Clock(torch, device)
    budget = Budget(args.budget_s, started)
    batches, variants = args.batches, args.variants
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731 - progress on stderr, results on stdout

    isolated = {}
    for b in batches:
        if args.no_isolated:
            isolated[b] = {"error": "not measured: --no-isolated"}
        elif not clock.cuda:
            isolated[b] = {"error": "not measured: needs CUDA (graph replay, CuPy kernels)"}
        else:
            try:
                isolated[b] = isolated_speedup(torch, args, b)
                log(f"  isolated norm + projection, M={b}: {isolated[b]['speedup']:.3f}x")
            except Exception as exc:  # noqa: BLE001 - reported in the output instead of ending the run
                isolated[b] = {"error": f"not measured: {_reason(exc)}"}
                log(f"  isolated norm + projection, M={b}: {isolated[b]['error']}")

    t0 = time.perf_counter()
    model = build_model(torch, args, device, dtype)
    clock.sync()
    init_s = time.perf_counter() - t0
    log(f"  model built in {init_s:.1f} s ({sum(p.numel() for p in model.parameters()) / 1e6:,.1f} M parameters)")
    inputs = {b: prompt_ids(torch, args, b, device) for b in batches}

    shares = {}
    for b in batches:
        if args.profile_steps > 0:
            try:
                shares[b] = norm_proj_share(torch, model, inputs[b], args.profile_steps, clock)
                log(f"  norm + projection share, batch {b}: {shares[b]['share']:.3f}")
            except Exception as exc:  # noqa: BLE001 - the timings still run
                shares[b] = {"error": f"not measured: {_reason(exc)}"}
                log(f"  norm + projection share, batch {b}: {shares[b]['error']}")

    try:
        from flashnorm_kernels import hf_cuda
    except Exception as exc:  # noqa: BLE001 - the other variants still run
        hf_cuda, hf_cuda_error = None, f"not available: flashnorm_kernels.hf_cuda: {_reason(exc)}"
    else:
        hf_cuda_error = None

    def graph_fn(ids, n):
        return hf_cuda.decode_with_graph(model, ids, n)

    def static_fn(ids, n):
        return hf_cuda.greedy_decode(model, ids, n, static_cache=True)

    def generate_fn(ids, n, marks=None):
        return hf_generate(torch, model, ids, n, marks)

    rows = {v: {} for v in variants}
    setup = {"init_s": init_s}
    folded, attachment, attach_error = False, None, None
    items_left = len(variants) * len(batches)
    for v in sorted(variants, key=RUN_ORDER.index):
        if v in ("b", "c", "d") and not folded:
            from flashnorm_kernels.fold import flashify

            t0 = time.perf_counter()
            flashify(model)  # in place: q/k/v, gate/up, lm_head get W·g; every norm's gain becomes 1
            clock.sync()
            setup["fold_s"] = time.perf_counter() - t0
            folded = True
        if v in ("c", "d") and attachment is None and attach_error is None:
            if not clock.cuda:
                attach_error = "not available: needs CUDA"
            else:
                try:
                    from flashnorm_kernels import hf
                    from flashnorm_kernels.plan import SyncPlan

                    t0 = time.perf_counter()
                    attachment = hf.attach(model, "cuda", plan=SyncPlan.correct(),
                                           max_tokens=max(batches) * args.prompt)
                    setup["attach_s"] = time.perf_counter() - t0
                except Exception as exc:  # noqa: BLE001 - reported as the row's value
                    attach_error = f"not available: attach: {_reason(exc)}"
        for b in batches:
            error = None
            if v in ("ag", "d") and not clock.cuda:
                error = "not available: needs CUDA"
            elif v in ("as", "ag", "d") and hf_cuda is None:
                error = hf_cuda_error
            elif v in ("c", "d") and attach_error:
                error = attach_error
            elif budget.left() <= 0:
                error = f"skipped: over --budget-s {args.budget_s:g}"
            if error is None:
                try:
                    fn = graph_fn if v in ("ag", "d") else static_fn if v == "as" else generate_fn
                    rows[v][b] = measure(torch, v, fn, inputs[b], args, clock, budget, items_left)
                    log(f"  {v} batch {b}: {rows[v][b]['us_per_step']:.1f} µs/step ({rows[v][b]['repeats']} repeats)")
                except BudgetExceeded as exc:
                    error = str(exc)
                except Exception as exc:  # noqa: BLE001 - e.g. decode_with_graph refusing a plain model
                    error = f"not available: {_reason(exc)}"
                    try:
                        clock.sync()
                    except Exception:  # noqa: BLE001 - a sticky CUDA error: later rows will say so
                        pass
            if error is not None:
                rows[v][b] = {"error": error}
                log(f"  {v} batch {b}: {error}")
            items_left -= 1
    if attachment is not None:
        attachment.detach()

    # Token agreement against (a), or against the first variant that ran (the table says which).
    references = {}
    for b in batches:
        ref_variant = next((v for v in variants if "new_ids" in rows[v][b]), None)
        if ref_variant is None:
            continue
        references[b] = ref_variant
        for v in variants:
            r = rows[v][b]
            if "new_ids" in r:
                r["agree"] = leading_equal(rows[ref_variant][b]["new_ids"], r["new_ids"])
                r["agree_min"], r["agree_of"], r["agree_with"] = min(r["agree"]), args.new_tokens, ref_variant

    gpu = torch.cuda.get_device_name() if clock.cuda else "cpu"
    import transformers

    table = format_table(rows, batches, variants)
    print(f"greedy decode, {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, "
          f"{args.heads} heads ({args.kv_heads} KV), vocab {args.vocab}, {args.dtype}, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens ({gpu}, torch {torch.__version__}, transformers {transformers.__version__})")
    print("µs / decode step: one new token per sequence, prefill excluded; tokens/s = batch / step time; "
          "method steps = marks between generate's steps, diff = (T(N) - T(N/4)) / (3N/4)\n")
    print(table)
    for b, ref_variant in references.items():
        if ref_variant != "a":
            print(f"batch {b}: tokens compared with {LABELS[ref_variant]}, not (a), which did not run")
    print()

    summary = {}
    for b in batches:
        s, iso = shares.get(b, {"error": "not measured: --profile-steps 0"}), isolated[b]
        if "share" not in s:
            print(f"batch {b}: share of decode in norm + projection: {s['error']}")
            s = None
        else:
            print(f"batch {b}: share of decode in norm + norm-fed projections (q,k,v,gate,up,lm_head), plain model: "
                  f"s = {100 * s['share']:.1f} % (norms {100 * s['norm_share']:.1f} %, projections "
                  f"{100 * s['proj_share']:.1f} %); {s['method']}, {args.profile_steps} steps")
        if "speedup" in iso:
            print(f"batch {b}: norm + projection in isolation, HF eager / dual-stream (graph replay, this model's "
                  f"shapes, q/k/v and gate/up each one fused matmul): S = {iso['speedup']:.2f}x "
                  f"({100 * (1 - 1 / iso['speedup']):.0f} % less time; the issue cites 33-35 % at M=1)")
        else:
            print(f"batch {b}: norm + projection in isolation: {iso['error']}")
        pair = None
        if "us_per_step" in rows.get("ag", {}).get(b, {}) and "us_per_step" in rows.get("d", {}).get(b, {}):
            pair = ("ag", "d", "graphs, a' -> d")
        elif "us_per_step" in rows.get("a", {}).get(b, {}) and "us_per_step" in rows.get("c", {}).get(b, {}):
            pair = ("a", "c", "eager, a -> c: launch-bound, not what the isolated figure measures")
        if s and "speedup" in iso and pair:
            a = amdahl(s["share"], iso["speedup"], rows[pair[0]][b]["us_per_step"], rows[pair[1]][b]["us_per_step"])
            a["pair"] = pair[2]
            summary[b] = a
            print(f"batch {b}: Amdahl 1/((1-s)+s/S) expects {a['expected_speedup']:.3f}x for the whole model "
                  f"({100 * a['expected_time_saved']:.1f} % less time); measured ({pair[2]}) "
                  f"{a['measured_speedup']:.3f}x ({100 * a['measured_time_saved']:.1f} % less time): "
                  f"{100 * a['fraction_reaching_model']:.0f} % of the expected gain reaches the whole model")
        else:
            needed = (("share", s), ("isolated speedup", "speedup" in iso), ("a'/d or a/c times", pair))
            missing = [what for what, ok in needed if not ok]
            print(f"batch {b}: Amdahl comparison not made: missing {', '.join(missing)}")

    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "bench_e2e_decode.json")
        for v in variants:
            for b in batches:
                rows[v][b].pop("new_ids", None)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
                       "args": {k: val for k, val in vars(args).items()}, "setup_s": setup,
                       "seconds": round(time.perf_counter() - started, 1),
                       "rows": {v: {str(b): r for b, r in rows[v].items()} for v in variants},
                       "share": {str(b): s for b, s in shares.items()},
                       "isolated": {str(b): i for b, i in isolated.items()},
                       "amdahl": {str(b): a for b, a in summary.items()}, "table": table}, f, indent=2)
        print(f"\nwrote {path}")
    log(f"  total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
