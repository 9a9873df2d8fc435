"""`streamcheck fuzz`: hunt for races in the FlashNorm pipeline's sync plans, locally.

    streamcheck fuzz [--budget 60s] [--backend auto|sim|cupy] [--profile fuzz]
                     [--plans all|safe|unsafe] [--steps 3] [--seed N]
    streamcheck fuzz --replay 'missing=join_mm,post=caller,...'

Hypothesis draws examples: a sync plan x a shape x a schedule (policy, seed,
parameters). Each runs the decode loop (`run_program`) for a few steps and is a
finding when the happens-before checker reports a race, or when an output differs
from the same loop run sequentially. The oracle (oracle.py) says which plans are
unsafe; the table flags any disagreement with it.

Findings are EXPECTED with the default `--plans all`: most plans leave an edge out
on purpose, and the fuzzer's job is to show that each such plan is caught (exit
status 1). `--plans safe` draws only plans the oracle calls safe: there, any finding
is a bug in the pipeline, the backend or the checker. Exit status: 0 nothing found,
1 findings, 2 bad options.
"""
from __future__ import annotations

import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

import numpy as np

EPS = 1e-5
MODULE = "fn"  # the pipeline module's name: its buffers are fn.Y, fn.r, fn.out0, fn.W


# --- one example ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """Everything that determines one run: replaying the same Example gives the same bytes."""

    plan: object  # SyncPlan
    shape: object  # strategies.Shape
    choice: object  # strategies.ScheduleChoice
    steps: int = 3
    data_seed: int = 0

    def token(self) -> str:
        """A one-word description that `--replay` parses back."""
        from flashnorm_kernels.plan import EDGES

        missing = "+".join(e for e in EDGES if e not in self.plan.edges) or "none"
        p, s, c = self.plan, self.shape, self.choice
        return (f"missing={missing},post={p.post_stream},side={p.side_kind},caller={p.caller_kind},"
                f"M={s.tokens},d={s.hidden},n={s.out},dtype={s.dtype},policy={c.policy},seed={c.seed},"
                f"delay_steps={c.delay_steps},pct_depth={c.pct_depth},delay_us={c.delay_us},"
                f"steps={self.steps},data={self.data_seed}")

    @classmethod
    def parse(cls, token: str) -> "Example":
        from flashnorm_kernels.plan import EDGES, SyncPlan

        from ..strategies import ScheduleChoice, Shape

        fields = dict(part.partition("=")[::2] for part in token.split(",") if part)
        need = {"missing", "post", "side", "caller", "M", "d", "n", "dtype", "policy", "seed"}
        if need - set(fields):
            raise ValueError(f"replay token lacks {', '.join(sorted(need - set(fields)))}; paste the whole "
                             "token printed in the summary table")
        try:
            missing = set() if fields["missing"] == "none" else set(fields["missing"].split("+"))
            plan = SyncPlan(frozenset(EDGES) - missing, fields["post"], fields["side"], fields["caller"])
            if missing - set(EDGES):
                raise ValueError(f"unknown edges {sorted(missing - set(EDGES))}")
            shape = Shape(int(fields["M"]), int(fields["d"]), int(fields["n"]), fields["dtype"])
            choice = ScheduleChoice(fields["policy"], int(fields["seed"]), int(fields.get("delay_steps", 8)),
                                    int(fields.get("pct_depth", 2)), int(fields.get("delay_us", 200)))
            return cls(plan, shape, choice, int(fields.get("steps", 3)), int(fields.get("data", 0)))
        except ValueError as exc:
            raise ValueError(f"bad replay token {token!r}: {exc}") from None


def _data(shape, steps: int, data_seed: int):
    """Weights and per-step inputs. Rows get different scales so a stale 1/RMS shows."""
    rng = np.random.default_rng([data_seed, shape.hidden, shape.out, shape.tokens, steps])
    w = (rng.standard_normal((shape.out, shape.hidden)) / np.sqrt(shape.hidden)).astype(np.float32)
    scale = rng.uniform(0.5, 4.0, size=(steps, shape.tokens, 1))
    xs = (rng.standard_normal((steps, shape.tokens, shape.hidden)) * scale).astype(np.float32)
    return w, xs


def run_program(plan, shape, device, steps: int = 3, data_seed: int = 0) -> list:
    """The decode loop the oracle models: per step, upload x_t on the caller's stream,
    issue the pipeline step, synchronize the caller's stream and read the output.
    Returns the outputs, one float32 array per step."""
    from flashnorm_kernels.pipeline import DeferredNormProjection

    w, xs = _data(shape, steps, data_seed)
    module = DeferredNormProjection(device, [w], eps=EPS, plan=plan, dtype=shape.dtype,
                                    max_tokens=shape.tokens, name=MODULE)
    caller = device.legacy if plan.caller_kind == "legacy" else device.stream("caller", kind=plan.caller_kind)
    x = module.alloc_input(steps * shape.tokens, name="x")  # each step's input in its own rows
    outputs = []
    for t in range(steps):
        rows = x[t * shape.tokens:(t + 1) * shape.tokens]
        device.upload(rows, module.encode(xs[t]), stream=caller)
        outs = module(rows, caller)
        outputs.append(module.read(outs, caller)[0])
    return outputs


@dataclass(frozen=True)
class Outcome:
    example: Example
    races: tuple  # hb.Race reports
    wrong: bool  # some output differs from the sequential run
    schedule: str  # the schedule taken (policy, seed, decisions)
    decisions: str  # the decisions alone: policy `replay:<decisions>` repeats the interleaving
    report: str
    outputs: tuple = field(repr=False, compare=False, default=())

    @property
    def found(self) -> bool:
        return bool(self.races) or self.wrong


@lru_cache(maxsize=256)
def _reference(shape, steps: int, data_seed: int, backend: str) -> tuple:
    # Run sequentially every plan computes the same values: the reference needs no plan.
    from flashnorm_kernels.plan import SyncPlan

    from ..device import Device

    device = Device(backend, check=False, policy="sequential")
    return tuple(run_program(SyncPlan.correct(), shape, device, steps, data_seed))


def run_example(example: Example, backend: str = "sim") -> Outcome:
    device = example.choice.device(backend)
    outputs = run_program(example.plan, example.shape, device, example.steps, example.data_seed)
    want = _reference(example.shape, example.steps, example.data_seed, backend)
    wrong = any(not np.array_equal(g, w, equal_nan=True) for g, w in zip(outputs, want))
    schedule = device.schedule
    return Outcome(example, tuple(device.races), wrong, str(schedule) if schedule is not None else "",
                   schedule.compact() if schedule is not None else "", device.report(), tuple(outputs))


# --- the fuzz loop ------------------------------------------------------------------------


@dataclass
class PlanStats:
    plan: object
    unsafe: bool  # the oracle's verdict
    runs: int = 0
    raced: int = 0
    wrong: int = 0
    replay: str = ""  # token of the first finding

    @property
    def disagrees(self) -> bool:
        # The checker's verdict does not depend on the schedule: every run of an unsafe
        # plan must report a race, and no run of a safe plan may.
        return (self.raced != self.runs) if self.unsafe else (self.raced > 0 or self.wrong > 0)


@dataclass
class Tally:
    plans: dict = field(default_factory=dict)  # SyncPlan -> PlanStats
    examples: int = 0
    found: int = 0

    def add(self, outcome: Outcome, unsafe: bool) -> None:
        plan = outcome.example.plan
        stats = self.plans.get(plan)
        if stats is None:
            stats = self.plans[plan] = PlanStats(plan, unsafe)
        stats.runs += 1
        stats.raced += bool(outcome.races)
        stats.wrong += outcome.wrong
        self.examples += 1
        if outcome.found:
            self.found += 1
            if not stats.replay:
                stats.replay = outcome.example.token()


class _BudgetSpent(Exception):
    """Raised inside the hypothesis test to end the run when the time budget is spent."""


class Progress:
    """A one-line progress bar on stderr (redrawn at most 10 times a second)."""

    def __init__(self, budget: float, stream=None, enabled: bool = True):
        self.budget, self.enabled = budget, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self._drawn = 0.0

    def restart(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def update(self, tally: Tally, force: bool = False) -> None:
        now = self.elapsed()
        if not self.enabled or (not force and now - self._drawn < 0.1):
            return
        self._drawn = now
        done = min(now / self.budget, 1.0) if self.budget > 0 else 1.0
        bar = "#" * int(done * 30)
        self.stream.write(f"\rfuzz [{bar:<30}] {now:5.1f}/{self.budget:g}s  {tally.examples} examples  "
                          f"{len(tally.plans)} plans  {tally.found} findings ")
        self.stream.flush()

    def close(self, tally: Tally) -> None:
        if self.enabled:
            self.update(tally, force=True)
            self.stream.write("\n")
            self.stream.flush()


def fuzz(budget: float, backend: str = "sim", profile: str = "fuzz", plans: str = "all", steps: int = 3,
         seed: Optional[int] = None, progress: Optional[Progress] = None) -> Tally:
    """Run examples until `budget` seconds are spent or the profile's max_examples is reached."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from .. import strategies as sst
    from ..oracle import is_safe

    plan_strategy = {"all": sst.sync_plans(), "safe": sst.safe_plans(), "unsafe": sst.unsafe_plans()}[plans]
    tally = Tally()
    progress = progress or Progress(budget, enabled=False)
    max_dim = 64 if backend == "cupy" else 16
    run_settings = settings(
        settings.get_profile(profile), database=None, deadline=None, phases=(Phase.generate,),
        verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck), report_multiple_bugs=False)

    @run_settings
    @given(plan=plan_strategy,
           shape=sst.shapes(max_tokens=4, max_hidden=max_dim, max_out=max_dim),
           choice=sst.schedule_choices(policies=("delay", "random", "pct")),
           data_seed=st.integers(0, 2**16))
    def one(plan, shape, choice, data_seed):
        if progress.elapsed() >= budget:
            raise _BudgetSpent
        example = Example(plan, shape, choice, steps, data_seed)
        tally.add(run_example(example, backend), unsafe=not is_safe(plan))
        progress.update(tally)

    if seed is not None:
        one = hypothesis_seed(seed)(one)
    import flashnorm_kernels.pipeline  # noqa: F401  (imported here, not on the budget's clock)

    progress.restart()
    try:
        one()
    except _BudgetSpent:
        pass
    progress.close(tally)
    return tally


# --- output ---------------------------------------------------------------------------------


def _plan_text(plan) -> str:
    from flashnorm_kernels.plan import EDGES

    missing = [e for e in EDGES if e not in plan.edges]
    return (f"-{'-'.join(missing) if missing else '(none)'} post={plan.post_stream} "
            f"side={plan.side_kind} caller={plan.caller_kind}")


def summary(tally: Tally, seconds: float, backend: str, profile: str, plans: str, max_rows: int = 20) -> str:
    rate = tally.examples / seconds if seconds > 0 else 0.0
    stats = list(tally.plans.values())
    found = [s for s in stats if s.raced or s.wrong]
    disagree = [s for s in stats if s.disagrees]
    lines = [
        f"streamcheck fuzz: {tally.examples} examples in {seconds:.1f} s ({rate:.1f} examples/s); "
        f"backend {backend}, profile {profile}, plans {plans}",
        f"plans tried: {len(stats)} ({sum(s.unsafe for s in stats)} unsafe by the oracle); "
        f"races found in {sum(1 for s in stats if s.raced)} plans, wrong values in "
        f"{sum(1 for s in stats if s.wrong)}; oracle disagreements: {len(disagree)}",
    ]
    if found or disagree:
        # Disagreements first (they are bugs), then the plans whose races struck most.
        rows = sorted(disagree, key=lambda s: -s.runs) + sorted((s for s in found if not s.disagrees), key=lambda s: (-s.wrong, -s.raced))
        lines.append(f"{'verdict':<9} {'runs':>5} {'races':>5} {'wrong':>5}  plan (-missing edges)")
        for s in rows[:max_rows]:
            verdict = ("DISAGREE" if s.disagrees else "unsafe" if s.unsafe else "safe")
            lines.append(f"{verdict:<9} {s.runs:>5} {s.raced:>5} {s.wrong:>5}  {_plan_text(s.plan)}")
            if s.replay:
                lines.append(f"          replay: streamcheck fuzz --backend {backend} --replay {shlex.quote(s.replay)}")
        if len(rows) > max_rows:
            lines.append(f"... and {len(rows) - max_rows} more plans with findings (--max-rows to see them)")
    if found and plans != "safe":
        lines.append("findings are expected for plans the oracle calls unsafe: each is an edge left out on purpose")
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """'60s', '2m', '500ms', '90' (seconds) -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"--budget {text!r}: expected a duration like 60s, 2m, 500ms or 90 (seconds)")
    value = float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    if value <= 0:
        raise ValueError(f"--budget {text!r}: the budget must be positive")
    return value


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fuzz", help="fuzz the pipeline's sync plans x shapes x schedules",
        description="Draw sync plans x shapes x schedules, run the FlashNorm decode loop on each, and report "
                    "races and wrong values. With --plans all (the default) findings are expected: most plans leave "
                    "an edge out on purpose.", epilog="Exit status: 0 nothing found, 1 findings, 2 bad options.")
    parser.add_argument("--budget", default="60s", help="time to spend, e.g. 60s, 2m, 500ms (default 60s)")
    parser.add_argument("--backend", default="sim", choices=("auto", "sim", "cupy"), help="device backend (sim)")
    parser.add_argument("--profile", default="fuzz", help="hypothesis profile: dev, ci or fuzz (default fuzz); "
                        "its max_examples caps the run")
    parser.add_argument("--plans", default="all", choices=("all", "safe", "unsafe"),
                        help="which plans to draw (default all: findings expected)")
    parser.add_argument("--steps", type=int, default=3, help="decode steps per example (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed, to repeat a run")
    parser.add_argument("--max-rows", type=int, default=20, help="plans listed in the table (default 20)")
    parser.add_argument("--replay", metavar="TOKEN", help="run one example from the table and print its report")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=main)


def _usage(message: str) -> int:
    print(f"streamcheck fuzz: error: {message}", file=sys.stderr)
    return 2


def main(args) -> int:
    from ..backends import BackendUnavailable, gpu_available, resolve

    try:
        budget = parse_duration(args.budget)
    except ValueError as exc:
        return _usage(str(exc))
    if args.steps < 2:
        return _usage(f"--steps {args.steps}: need at least 2 (the write-after-read hazards span two steps)")
    if args.max_rows < 0:
        return _usage(f"--max-rows {args.max_rows}: must be >= 0")
    from .. import strategies

    if args.profile not in strategies.PROFILES:
        try:
            from hypothesis import settings

            settings.get_profile(args.profile)
        except Exception:
            return _usage(f"--profile {args.profile!r} is not a registered hypothesis profile; "
                          f"use one of {', '.join(strategies.PROFILES)}")
    backend = resolve(args.backend)
    if backend == "cupy" and not gpu_available():
        return _usage("--backend cupy needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]'); none found "
                      "here. Use --backend sim.")
    try:
        if args.replay:
            try:
                example = Example.parse(args.replay)
            except ValueError as exc:
                return _usage(str(exc))
            outcome = run_example(example, backend)
            print(f"example: {example.token()}")
            print(f"schedule: {outcome.schedule}")
            print(f"values: {'WRONG (differ from the sequential run)' if outcome.wrong else 'match the sequential run'}")
            print(outcome.report)
            return 1 if outcome.found else 0
        progress = Progress(budget, enabled=not args.quiet)
        tally = fuzz(budget, backend, args.profile, args.plans, args.steps, args.seed, progress)
    except BackendUnavailable as exc:
        return _usage(str(exc))
    print(summary(tally, progress.elapsed(), backend, args.profile, args.plans, args.max_rows))
    return 1 if tally.found else 0
