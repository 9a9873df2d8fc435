"""Cost of checking a torch program: the dual-stream FlashNorm decode loop in torch, plain, under
streamcheck (torch adapter), and under PyTorch's CUDA sanitizer (TORCH_CUDA_SANITIZER=1), each in
its own process, side by side in one run.

    python benchmarks/bench_torch_overhead.py [--steps 200] [--repeats 7] [--dim 4096]

Per decode step (1×dim @ dim×dim fp32): the caller writes x; stream A: y = F.linear(x, W) (as
torch.mm(x, W.t(), out=y));
stream B: r = rsqrt(mean(x²) + eps); the caller waits for both, out = y * r. Correctly
synchronized (no race). Reports the median µs/step over the repeats and the ratio to the plain
loop. Needs a GPU with a CUDA build of torch.

streamcheck runs three ways: as `streamcheck run` records (call sites with a stack of up to 8
frames); `streamcheck-syncs`, the checker fed at host synchronizations (Recorder.defer_checks);
`streamcheck-depth1`, call sites without the user's callers (SiteSettings(depth=1)): what the
stack costs. Each records torch's operators through the native observer (record/native: C++
callbacks) where it builds; the `-python` modes force the Python path, the dispatch mode
(STREAMCHECK_NATIVE_RECORD=0), side by side. `compiled` and `compiled-streamcheck`: the same loop
with each stream's work a torch.compile'd function (Inductor's Triton kernels and its extern mm),
plain and under streamcheck; their ratio is to `compiled`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("plain", "streamcheck", "streamcheck-python", "streamcheck-syncs", "streamcheck-python-syncs",
         "streamcheck-depth1", "sanitizer", "compiled", "compiled-streamcheck", "compiled-streamcheck-python")
ROOT = os.path.dirname(HERE)


def decode_loop(dim: int, steps: int, warmup: int, repeats: int, compiled: bool = False) -> list:
    import torch

    def mm_into(x, w, y):
        torch.mm(x, w.t(), out=y)

    def rms_into(x, r):
        torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6, out=r)

    def scale_into(y, r, out):
        torch.mul(y, r, out=out)

    if compiled:
        mm_into, rms_into, scale_into = (torch.compile(f, fullgraph=True) for f in (mm_into, rms_into, scale_into))

    device = "cuda"
    gen = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(dim, dim, generator=gen) / dim ** 0.5).to(device)
    x = torch.zeros(1, dim, device=device)
    y = torch.empty(1, dim, device=device)
    r = torch.empty(1, 1, device=device)
    out = torch.empty(1, dim, device=device)
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    caller = torch.cuda.current_stream()

    def step(t: int) -> None:
        x.fill_(0.001 * (t % 97))
        a.wait_stream(caller)
        b.wait_stream(caller)
        with torch.cuda.stream(a):
            mm_into(x, w, y)  # F.linear(x, w) into the persistent y (a fresh y per step
            # would be freed on the host while the caller may still read it: the allocator bug)
        with torch.cuda.stream(b):
            rms_into(x, r)
        caller.wait_stream(a)
        caller.wait_stream(b)
        scale_into(y, r, out)

    for t in range(warmup):
        step(t)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in range(steps):
            step(t)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return times


def child(mode: str, args) -> None:
    import torch  # noqa: F401 (first: the sanitizer and streamcheck's torch adapter need it loaded)

    compiled = mode.startswith("compiled")
    if "streamcheck" in mode:
        import streamcheck.record.instrument as instrument
        from streamcheck.core.fast import handover_notice, unavailable
        from streamcheck.core.trace import SiteSettings, set_site_settings

        if mode == "streamcheck-depth1":
            set_site_settings(SiteSettings(depth=1))
        session = instrument.start()
        if mode.endswith("-syncs"):
            session.defer_checks()
        try:
            times = decode_loop(args.dim, args.steps, args.warmup, args.repeats, compiled)
            path = "native" if "torch_native" in session.state else "python"  # which path recorded it
        finally:
            instrument.stop()
        extra = {"races": len(session.races), "ops": len(session.trace), "errors": session.errors[:3],
                 "notices": session.notices, "path": path,
                 # which checker checked: the Python one from the start, or from a hand-over midway
                 "checker": "python" if unavailable() else (handover_notice(session.checker) or "native")}
    else:
        times = decode_loop(args.dim, args.steps, args.warmup, args.repeats, compiled)
        extra = {}
    print("RESULT " + json.dumps({"mode": mode, "times": times, **extra}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--child", choices=MODES)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: {', '.join(unknown) or '(none)'}: choose from {', '.join(MODES)}")
    rows = []
    for mode in modes:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if mode == "sanitizer":
            env["TORCH_CUDA_SANITIZER"] = "1"
        if "streamcheck" in mode:  # the native observer, or the dispatch mode for the -python modes
            env["STREAMCHECK_NATIVE_RECORD"] = "0" if "-python" in mode else "1"
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "sanitizer" if mode == "sanitizer" else mode,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--repeats", str(args.repeats),
               "--dim", str(args.dim)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{mode}: failed (exit {proc.returncode})\n{proc.stderr[-2000:]}")
            return 1
        rows.append(json.loads(line[len("RESULT "):]))
    import torch

    bases = {("compiled" if row["mode"].startswith("compiled") else "eager"): statistics.median(row["times"])
             for row in reversed(rows) if row["mode"] in ("plain", "compiled")}
    print(f"torch decode-loop overhead: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"1x{args.dim} @ {args.dim}x{args.dim} fp32, {args.steps} steps after {args.warmup} warm-up, "
          f"median of {args.repeats} repeats")
    print(f"{'mode':<20}{'median µs/step':>16}{'min':>10}{'max':>10}{'ratio':>8}  notes")
    for row in rows:
        times = row["times"]
        median = statistics.median(times)
        notes = ""
        base = bases.get("compiled" if row["mode"].startswith("compiled") else "eager", float("nan"))
        if "streamcheck" in row["mode"]:
            notes = (f"{row['path']} path, checker {row['checker']}, {row['ops']} ops recorded, {row['races']} races, "
                     f"errors {row['errors']}, notices {row['notices']}")
        print(f"{row['mode']:<20}{median:>16.1f}{min(times):>10.1f}{max(times):>10.1f}{median / base:>7.2f}x  {notes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
