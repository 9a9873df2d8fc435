"""`streamcheck repro implicit-join`: the FlashNorm talk's bug, on purpose.

Generates text from the tiny fixture model three times with its norm → projection
groups on the dual-stream pipeline (on the sim, through the device API; with
--backend cupy, the model on the GPU attached with hf.attach(model, "cuda"), checked by
streamcheck.instrument): the sequential reference; the talk's plan
(post-scale never waits for the matmul) with the matmul stream held back at a few
decode steps, so the post-scale reads the previous step's projection; and the
fixed plan under the same delay. Prints both texts side by side, the diagnosis,
the race report naming the missing wait, and whether the fix matches.
Exit status: 0 reproduced and fixed, 1 not reproduced, 2 bad usage / environment.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext, redirect_stdout
from typing import Optional

from streamcheck.atomic_files import write_text
from streamcheck.commands import STDOUT, output_problem, report_width, timeline_file, timeline_problem

FIXTURE = "tiny_llama_zen"
# The stale read is injected into layer 0's q/k/v projection: its matmul stream is held
# back at a few decode steps; elsewhere the schedule is eager (the bug hides there).
TARGET_GROUP = "layers.0.input_layernorm"
TARGET_STREAM = f"{TARGET_GROUP}.A"
STRIKE_EVERY = 97  # decode steps between injected delays
FIRST_STRIKE, STRIKE_SPREAD = 4, 24  # the first delayed decode step: 4 + seed % 24
STRIKE_RULE = f"{FIRST_STRIKE} + seed % {STRIKE_SPREAD}"


def first_strike_step(seed: int) -> int:
    """The first decode step whose matmul is held back, chosen by the seed. Step k is the k-th
    forward pass (0: the prompt's) and yields token k, so a run needs at least this step plus
    one tokens for the stale read to strike."""
    return FIRST_STRIKE + seed % STRIKE_SPREAD


def strike_policy(backend: str, seed: int) -> dict:
    """The delay that makes the implicit join strike: which launches, when, how long."""
    params = dict(streams=[TARGET_STREAM], kernels=["matmul"], after=first_strike_step(seed), every=STRIKE_EVERY)
    if backend == "cupy":
        # The post-scale is issued some 100 µs after the held matmul; 20 ms leaves room for a host
        # descheduled for milliseconds (a loaded machine: 14 test workers on one GPU let a 2 ms hold
        # pass unnoticed) and costs 20 ms per strike, a few strikes per run.
        params["delay_us"] = 20_000.0
    else:
        params["steps"] = 8  # host calls: the post-scale is issued within fewer
    return params


def strike_hold(strike: dict) -> dict:
    """strike_policy("cupy", seed) as the CUDA path's hold on the target group's matmul stream
    (hf_cuda.CudaNormProjection.hold_matmul): the same steps, the same spin."""
    return {"group": TARGET_GROUP, "us": strike["delay_us"], "after": strike["after"], "every": strike["every"]}


def side_by_side_text(left: str, right: str, titles=("reference", "candidate"), width: int = 44) -> str:
    """Two texts in columns, line by line; `≠` marks lines that differ, `…` ends a line cut to the column."""
    a, b = left.split("\n"), right.split("\n")
    rows = [f"  {titles[0]:<{width}} | {titles[1]}", "  " + "-" * width + "-+-" + "-" * width]
    for i in range(max(len(a), len(b))):
        la = a[i] if i < len(a) else ""
        lb = b[i] if i < len(b) else ""
        mark = " " if la == lb else "≠"
        rows.append(f"{mark} {_cut(la, width):<{width}} | {_cut(lb, width)}")
    return "\n".join(rows)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


def _same_file_problem(args) -> Optional[str]:
    """Two outputs named the same file: the second write would replace the first."""
    named = [(option, os.path.abspath(path)) for option, path in
             (("--json", args.json if args.json != STDOUT else None), ("--trace", args.trace),
              ("--timeline", timeline_file(args.timeline) if args.timeline else None)) if path]
    for i, (option, path) in enumerate(named):
        for other, other_path in named[i + 1:]:
            if path == other_path:
                return (f"{option} and {other} both name {path}; one would overwrite the other: give each its own "
                        "file")
    return None


def _transformers_problem() -> Optional[str]:
    """The runs load a transformers Llama: without it, one line saying what to install."""
    from .. import transformers_missing

    missing = transformers_missing()
    return f"the fixture model is a transformers Llama, and {missing}" if missing else None


def _usage_problem(args) -> Optional[str]:
    if args.tokens < 1:
        return "--tokens must be at least 1"
    # Checked before minutes of runs, not after them.
    return (timeline_problem(args.timeline) or output_problem("--trace", args.trace, "race.json")
            or output_problem("--json", args.json, "repro.json") or _same_file_problem(args)
            or _transformers_problem())


@contextmanager
def _quiet_transformers():
    """transformers' progress bars ("Loading weights") and notices (the max-length reminder) are
    not about the user's bug and put `\\r` frames into logs; silenced, then restored for the caller."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@contextmanager
def _token_progress(model, total: int, first_run: str):
    """A progress bar on stderr, one tick per forward pass (one token), drawn from the start (as
    fuzz's) and only on a terminal; cleared when done."""
    from tqdm import tqdm  # installed with transformers, which the runs need anyway

    # The size as fuzz's bar reads it: a terminal that reports 0 x 0 (some IDE consoles, `script`)
    # gets shutil's fallback, where tqdm's own query draws nothing at all.
    columns, lines = shutil.get_terminal_size()
    bar = tqdm(total=total, desc=first_run, unit="token", file=sys.stderr, disable=not sys.stderr.isatty(),
               leave=False, ncols=columns - 1, nrows=lines)

    def one_token(module, inputs, output) -> None:  # None: a hook's return value would replace the output
        bar.update(1)

    hook = model.register_forward_hook(one_token)
    try:
        yield bar
    finally:
        hook.remove()
        bar.close()


def run(args) -> int:
    from streamcheck.device.backends import BackendUnavailable, gpu_available, resolve

    problem = _usage_problem(args)
    if problem is None:
        try:
            backend = resolve(args.backend)
        except ValueError as exc:
            problem = str(exc)
        else:
            if backend == "cupy" and not gpu_available():
                problem = ("--backend cupy needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]'); none found "
                           "here. Use --backend sim to run on the CPU.")
            elif backend == "cupy":
                import torch

                if not torch.cuda.is_available():
                    problem = ("--backend cupy runs the model on the GPU through torch, which sees no CUDA device here "
                               "(a CPU build of torch?). Install a CUDA build of torch, or use --backend sim.")
    if problem:
        print(f"streamcheck repro: {problem}", file=sys.stderr)
        return 2
    from ..testing.fixtures import FixtureCorruptError

    json_out = sys.stdout if args.json == STDOUT else None  # `--json -`: stdout holds the JSON alone
    try:
        with _quiet_transformers(), redirect_stdout(sys.stderr) if json_out else nullcontext():
            return _repro(backend, args, json_out)
    except (BackendUnavailable, FixtureCorruptError, FileNotFoundError) as exc:
        # A missing or damaged fixture, a GPU that went away: say so, exit 2.
        print(f"streamcheck repro: {exc}", file=sys.stderr)
        return 2


def _run_record(check, races_json: str) -> dict:
    """One checked run as --json gives it: the comparison with the reference and its race reports."""
    comparison = check.comparison
    return {"tokens_match": comparison.matches, "diagnosis": comparison.summary(),
            "first_divergence": comparison.first_divergence, "divergent": comparison.divergent,
            "lag1": comparison.lag1, "races": json.loads(races_json)}


def _repro(backend: str, args, json_out=None) -> int:
    from streamcheck.core.hb import reports_to_json

    from ..generation import check_generation, check_generation_cuda, run_generation, run_generation_cuda
    from ..plan import SyncPlan
    from ..testing.fixtures import PROMPT, decode, encode, load_fixture_model

    model = load_fixture_model(FIXTURE, root=args.fixtures)  # clear errors (exit 2) if missing or corrupt
    prompt = encode(PROMPT)
    strike = strike_policy(backend, args.seed)
    first = strike["after"]
    strikes = args.tokens > first
    replay = f"streamcheck repro implicit-join --backend {backend} --tokens {args.tokens} --seed {args.seed}"
    print(f"streamcheck repro implicit-join: backend={backend} tokens={args.tokens} seed={args.seed}")
    print(f"model: {FIXTURE} (byte-level Llama reciting the Zen of Python); prompt {PROMPT!r}")
    print(f"delay: matmul on {TARGET_STREAM} held back at decode step {first} and every "
          f"{STRIKE_EVERY} after; everything else eager")
    if not strikes:
        print(f"note: the first delay strikes at decode step {first} ({STRIKE_RULE}; step 0 is the prompt's forward\n"
              f"      pass, step k yields token k), so --tokens {args.tokens} ends before it: the race is still reported\n"
              f"      from the trace, but the text cannot change. Use --tokens {first + 1} or more.")
    print()

    t0 = time.perf_counter()
    with _token_progress(model, 3 * args.tokens, "sequential reference") as progress:
        if backend == "cupy":  # the real path: the model on the GPU, its torch and CuPy work instrumented
            model = model.to("cuda")
            hold = strike_hold(strike)
            reference = run_generation_cuda(model, prompt, args.tokens, SyncPlan.correct(), check=False)
            progress.set_description_str("implicit join under delay", refresh=False)
            buggy = check_generation_cuda(model, prompt, args.tokens, SyncPlan.implicit_join(), reference=reference,
                                          hold=hold)
            progress.set_description_str("SyncPlan.correct() under delay", refresh=False)
            fixed = check_generation_cuda(model, prompt, args.tokens, SyncPlan.correct(), reference=reference,
                                          hold=hold)
        else:
            reference = run_generation(model, prompt, args.tokens, SyncPlan.correct(), backend=backend,
                                       policy="sequential")
            progress.set_description_str("implicit join under delay", refresh=False)
            buggy = check_generation(model, prompt, args.tokens, SyncPlan.implicit_join(), backend=backend,
                                     policy="delay", seed=args.seed, reference=reference, **strike)
            progress.set_description_str("SyncPlan.correct() under delay", refresh=False)
            fixed = check_generation(model, prompt, args.tokens, SyncPlan.correct(), backend=backend,
                                     policy="delay", seed=args.seed, reference=reference, **strike)
    seconds = time.perf_counter() - t0

    ref_text, bug_text = decode(reference.tokens), decode(buggy.candidate.tokens)
    print("1. SyncPlan.implicit_join(): the post-scale waits for the RMS stream only\n")
    print(side_by_side_text(ref_text, bug_text, ("sequential reference", "implicit join under delay")))
    print(f"\ndiagnosis: {buggy.comparison.summary()}\n")
    races = buggy.candidate.races
    # The post-scale reading Y: named `<group>.Y` on the device API, a torch tensor under instrument.
    key = [r for r in races if r.kind == "RAW" and (r.buffer.endswith(".Y") or r.second.name.startswith("postscale"))]
    key = key or races
    if key:
        print("race report (the missing wait):\n" + key[0].format(report_width(sys.stdout)))
        if len(races) > 1:
            print(f"  (+{len(races) - 1} more race{'s' if len(races) > 2 else ''}: the same missing wait seen from "
                  "other buffers and groups)")
    else:
        print("race report: none (unexpected: the implicit join should always be flagged)")
    print(f"\n2. SyncPlan.correct() under the same delay: {fixed.comparison.summary()}; "
          f"{len(fixed.candidate.races)} races")

    reproduced = not buggy.comparison.matches and bool(races)
    fixed_ok = fixed.comparison.matches and not fixed.candidate.races
    if reproduced and fixed_ok:
        result = "reproduced (stale reads, race reported) and fixed (every edge: tokens match, no race)"
    else:
        why = "" if reproduced or strikes else f" (--tokens {args.tokens} ends before the first delay, at step {first})"
        result = f"{'reproduced' if reproduced else 'NOT reproduced'}{why}; fix {'ok' if fixed_ok else 'FAILED'}"

    try:
        if args.timeline:
            from streamcheck.pictures.timeline import render_timeline

            path = timeline_file(args.timeline)
            render_timeline(buggy.candidate.device, path)  # each output whole or absent (atomic_files)
            print(f"timeline of the implicit-join run: {path}")
        if args.trace:
            from streamcheck.pictures.export import write_chrome_trace

            write_chrome_trace(buggy.candidate.device, args.trace)
            print(f"Perfetto trace of the implicit-join run: {args.trace} (open in https://ui.perfetto.dev)")
        if args.json:
            report = {"bug": "implicit-join", "backend": backend, "tokens": args.tokens, "seed": args.seed,
                      "replay": replay, "delay": strike, "reproduced": reproduced, "fixed": fixed_ok,
                      "result": result, "reference_text": ref_text, "implicit_join_text": bug_text,
                      "implicit_join": _run_record(buggy, reports_to_json(races)),
                      "correct": _run_record(fixed, reports_to_json(fixed.candidate.races))}
            if json_out is not None:
                json_out.write(json.dumps(report, indent=2) + "\n")
            else:
                write_text(args.json, json.dumps(report, indent=2) + "\n")
                print(f"JSON report: {args.json}")
        if (args.timeline or args.trace) and buggy.comparison.matches:
            # Still the run named above, not the fixed one: its race is marked even though it did not strike.
            print("  (the delay did not change the implicit-join run's text; its race is marked all the same)")
    except OSError as exc:
        print(f"streamcheck repro: could not write {exc.filename or 'an output file'}: {exc.strerror or exc}; "
              "check the path and free space", file=sys.stderr)
        return 2
    print(f"\n{3 * args.tokens} tokens generated in {seconds:.1f} s. Replay: {replay}")
    print(f"result: {result}")
    return 0 if reproduced and fixed_ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser("repro", help="reproduce a stream bug on purpose (implicit-join: the FlashNorm talk's)",
                              description=__doc__.split("\n\n")[0],
                              epilog="Exit status: 0 reproduced and fixed, 1 not reproduced, 2 bad usage or "
                                     "environment.")
    p.add_argument("bug", choices=["implicit-join"], metavar="BUG",
                   help="which bug to reproduce: implicit-join (the FlashNorm talk's)")
    p.add_argument("--backend", default="auto", help="auto (cupy with a GPU, else sim), sim or cupy")
    p.add_argument("--tokens", type=int, default=300,
                   help=f"tokens to generate per run (default 300); the first delay strikes at decode step "
                        f"{STRIKE_RULE.replace('%', '%%')} (step k yields token k), so more tokens than that are needed")
    p.add_argument("--seed", type=int, default=0,
                   help=f"picks the first decode step that is delayed: {STRIKE_RULE.replace('%', '%%')}")
    p.add_argument("--fixtures", metavar="DIR",
                   help="where the fixture models live (default: the ones installed with flashnorm_kernels)")
    p.add_argument("--timeline", metavar="PNG",
                   help="also draw the implicit-join run's timeline to PNG (.png is added to a name without one; "
                        "needs matplotlib)")
    p.add_argument("--trace", metavar="FILE",
                   help="also write a Perfetto (Chrome trace) JSON of the implicit-join run to FILE")
    p.add_argument("--json", metavar="FILE",
                   help="also write the outcome as JSON to FILE (- for stdout, the text then on stderr): "
                        "reproduced/fixed, the diagnosis, the race reports")
    p.set_defaults(func=run)
