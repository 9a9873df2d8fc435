"""`streamcheck repro implicit-join`: the FlashNorm talk's bug, on purpose.

Generates text from the tiny fixture model three times with its norm → projection
groups on the dual-stream pipeline: the sequential reference; the talk's plan
(post-scale never waits for the matmul) with the matmul stream held back at a few
decode steps, so the post-scale reads the previous step's projection; and the
fixed plan under the same delay. Prints both texts side by side, the diagnosis,
the race report naming the missing wait, and whether the fix matches.
Exit status: 0 reproduced and fixed, 1 not reproduced, 2 bad usage / environment.
"""
from __future__ import annotations

import sys
import time

FIXTURE = "tiny_llama_zen"
# The stale read is injected into layer 0's q/k/v projection: its matmul stream is held
# back at a few decode steps; elsewhere the schedule is eager (the bug hides there).
TARGET_STREAM = "layers.0.input_layernorm.A"
STRIKE_EVERY = 97  # decode steps between injected delays


def strike_policy(backend: str, seed: int) -> dict:
    """The delay that makes the implicit join strike: which launches, when, how long."""
    first = 4 + seed % 24  # within the first 32 tokens, chosen by the seed
    params = dict(streams=[TARGET_STREAM], kernels=["matmul"], after=first, every=STRIKE_EVERY)
    if backend == "cupy":
        params["delay_us"] = 2000.0  # long enough for the post-scale to overtake the matmul
    else:
        params["steps"] = 8  # host calls: the post-scale is issued within fewer
    return params


def side_by_side_text(left: str, right: str, titles=("reference", "candidate"), width: int = 44) -> str:
    """Two texts in columns, line by line; `≠` marks lines that differ."""
    a, b = left.split("\n"), right.split("\n")
    rows = [f"  {titles[0]:<{width}} | {titles[1]}", "  " + "-" * width + "-+-" + "-" * width]
    for i in range(max(len(a), len(b))):
        la = a[i] if i < len(a) else ""
        lb = b[i] if i < len(b) else ""
        mark = " " if la == lb else "≠"
        rows.append(f"{mark} {la[:width]:<{width}} | {lb[:width]}")
    return "\n".join(rows)


def run(args) -> int:
    from ..backends import BackendUnavailable, resolve

    if args.tokens < 1:
        print("streamcheck repro: --tokens must be at least 1", file=sys.stderr)
        return 2
    try:
        backend = resolve(args.backend)
    except ValueError as exc:
        print(f"streamcheck repro: {exc}", file=sys.stderr)
        return 2
    from ..fixtures import FixtureCorruptError

    try:
        return _repro(backend, args)
    except (BackendUnavailable, FixtureCorruptError, FileNotFoundError) as exc:
        # No GPU for --backend cupy, a missing or damaged fixture: say so, exit 2.
        print(f"streamcheck repro: {exc}", file=sys.stderr)
        return 2


def _repro(backend: str, args) -> int:
    from flashnorm_kernels.generation import check_generation, run_generation
    from flashnorm_kernels.plan import SyncPlan

    from ..fixtures import PROMPT, decode, encode, load_fixture_model

    model = load_fixture_model(FIXTURE, root=args.fixtures)  # clear errors (exit 2) if missing or corrupt
    prompt = encode(PROMPT)
    strike = strike_policy(backend, args.seed)
    print(f"streamcheck repro implicit-join: backend={backend} tokens={args.tokens} seed={args.seed}")
    print(f"model: fixtures/{FIXTURE} (byte-level Llama reciting the Zen of Python); prompt {PROMPT!r}")
    print(f"delay: matmul on {TARGET_STREAM} held back at decode step {strike['after']} and every "
          f"{STRIKE_EVERY} after; everything else eager\n")

    t0 = time.perf_counter()
    reference = run_generation(model, prompt, args.tokens, SyncPlan.correct(), backend=backend, policy="sequential")
    buggy = check_generation(model, prompt, args.tokens, SyncPlan.implicit_join(), backend=backend, policy="delay",
                             seed=args.seed, reference=reference, **strike)
    fixed = check_generation(model, prompt, args.tokens, SyncPlan.correct(), backend=backend, policy="delay",
                             seed=args.seed, reference=reference, **strike)
    seconds = time.perf_counter() - t0

    ref_text, bug_text = decode(reference.tokens), decode(buggy.candidate.tokens)
    print("1. SyncPlan.implicit_join(): the post-scale waits for the RMS stream only\n")
    print(side_by_side_text(ref_text, bug_text, ("sequential reference", "implicit join under delay")))
    print(f"\ndiagnosis: {buggy.comparison.summary()}\n")
    races = buggy.candidate.races
    key = [r for r in races if r.kind == "RAW" and r.buffer.endswith(".Y")] or races
    if key:
        print("race report (the missing wait):\n" + key[0].format())
        if len(races) > 1:
            print(f"  (+{len(races) - 1} more race{'s' if len(races) > 2 else ''}: the same missing wait seen from "
                  "other buffers and groups)")
    else:
        print("race report: none (unexpected: the implicit join should always be flagged)")
    print(f"\n2. SyncPlan.correct() under the same delay: {fixed.comparison.summary()}; "
          f"{len(fixed.candidate.races)} races")
    if args.timeline:
        from ..timeline import render_timeline
        render_timeline(buggy.candidate.device, args.timeline)
        print(f"timeline: {args.timeline}")
    if args.trace:
        from ..export import write_chrome_trace
        write_chrome_trace(buggy.candidate.device, args.trace)
        print(f"Perfetto trace: {args.trace} (open in https://ui.perfetto.dev)")
    print(f"\n{3 * args.tokens} tokens generated in {seconds:.1f} s. Replay: streamcheck repro implicit-join "
          f"--backend {backend} --tokens {args.tokens} --seed {args.seed}")
    reproduced = not buggy.comparison.matches and bool(races)
    fixed_ok = fixed.comparison.matches and not fixed.candidate.races
    if reproduced and fixed_ok:
        print("result: reproduced (stale reads, race reported) and fixed (every edge: tokens match, no race)")
        return 0
    print(f"result: {'reproduced' if reproduced else 'NOT reproduced'}; fix {'ok' if fixed_ok else 'FAILED'}")
    return 1


def register(subparsers) -> None:
    p = subparsers.add_parser("repro", help="reproduce a stream bug on purpose (implicit-join: the FlashNorm talk's)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("bug", choices=["implicit-join"], help="which bug to reproduce")
    p.add_argument("--backend", default="auto", help="auto (cupy with a GPU, else sim), sim or cupy")
    p.add_argument("--tokens", type=int, default=300, help="tokens to generate per run (default 300)")
    p.add_argument("--seed", type=int, default=0, help="picks the first decode step that is delayed")
    p.add_argument("--fixtures", metavar="DIR", help="where the fixture models live (default: the repository's)")
    p.add_argument("--timeline", metavar="PNG", help="also draw the racing operations' timeline")
    p.add_argument("--trace", metavar="JSON", help="also write a Perfetto (Chrome trace) JSON of the buggy run")
    p.set_defaults(func=run)
