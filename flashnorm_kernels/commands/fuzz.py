"""`streamcheck fuzz`: hunt for races in the FlashNorm pipeline's sync plans, locally.

    streamcheck fuzz [--budget 60s | --examples N] [--backend auto|sim|cupy] [--profile fuzz]
                     [--plans all|safe|unsafe] [--steps 3] [--seed N] [--json FILE]
    streamcheck fuzz --replay 'missing=join_mm,post=caller,...' [--json FILE]
    streamcheck fuzz --workers N [--example-db DIR] ...   (pytest -n N over test_fuzz_worker)

Hypothesis draws examples: a sync plan x a shape x a schedule (policy, seed,
parameters). Each runs the decode loop (`run_program`) for a few steps and is a
finding when the happens-before checker reports a race, or when an output differs
from the same loop run sequentially. The oracle (testing/oracle.py) says which plans are
unsafe; the table flags any disagreement with it.

Findings are EXPECTED with the default `--plans all`: most plans leave an edge out
on purpose, and the fuzzer's job is to show that each such plan is caught (exit
status 1). `--plans safe` draws only plans the oracle calls safe: there, any finding
is a bug in the pipeline, the backend or the checker. Exit status: 0 nothing found,
1 findings, 2 bad options, 130 interrupted (the table of what was found is printed).

Repeating a run: hypothesis draws the same sequence for the same --seed, so the same
seed and --examples N give the same table (on the sim; times aside). A --budget cuts
that sequence wherever the machine's speed puts it, so the summary ends with the
--examples line that repeats what this run did.

Several GPUs: `--workers N` runs `pytest -n N --dist each` over this module's test_fuzz_worker,
so streamcheck's pytest plugin pins worker gwK to one GPU (CUDA_VISIBLE_DEVICES; fewer GPUs than
workers are shared round-robin) and puts the shared example database (--streamcheck-example-db)
on the profile. Worker K draws from seed + K and runs its share of --examples (or the whole
--budget, in parallel); the command merges the workers' tallies into one table. A --budget is the
command's wall time, starting the workers included (several seconds: pytest, xdist, the imports);
on a terminal one bar counts all workers' examples, and a run whose workers took longer to start
and stop than to run says so (one process is faster there). A crash one worker hits is saved in
the database and replayed first by every run over it. With --backend sim the workers are CPU
processes.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np

from streamcheck.atomic_files import owned_temporary_directory, write_text
from streamcheck.commands import STDOUT

from ..plan import EDGES, SyncPlan

EPS = 1e-5
DEFAULT_TIMEOUT = 60.0  # seconds per example: far above an honest one (a few ms on the sim)
MODULE = "fn"  # the pipeline module's name: its buffers are fn.Y, fn.r, fn.out0, fn.W


# --- one example ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """Everything that determines one run: replaying the same Example gives the same bytes."""

    plan: SyncPlan
    shape: object  # testing.strategies.Shape
    choice: object  # streamcheck.strategies.ScheduleChoice
    steps: int = 3
    data_seed: int = 0

    def token(self) -> str:
        """A one-word description that `--replay` parses back."""
        missing = "+".join(e for e in EDGES if e not in self.plan.edges) or "none"
        p, s, c = self.plan, self.shape, self.choice
        return (f"missing={missing},post={p.post_stream},side={p.side_kind},caller={p.caller_kind},"
                f"M={s.tokens},d={s.hidden},n={s.out},dtype={s.dtype},policy={c.policy},seed={c.seed},"
                f"delay_steps={c.delay_steps},pct_depth={c.pct_depth},delay_us={c.delay_us},"
                f"steps={self.steps},data={self.data_seed}")

    @classmethod
    def parse(cls, token: str) -> "Example":
        """The Example a token describes. Whitespace around fields is ignored, so a token
        printed over several lines (inside one pair of quotes) pastes back as it is.
        Every field is checked here, so a bad one is refused before anything runs."""
        from streamcheck.core.schedule import make_policy
        from streamcheck.strategies import ScheduleChoice

        from ..testing.strategies import DTYPES, Shape

        fields = {}
        for part in (part.strip() for part in token.split(",")):
            if not part:
                continue
            key, equals, value = (piece.strip() for piece in part.partition("="))
            if not equals or key not in TOKEN_FIELDS:
                raise ValueError(f"--replay: {part!r} is not a field of a replay token ({', '.join(TOKEN_FIELDS)}); "
                                 "paste the whole token printed in the summary table")
            if not value:
                raise ValueError(f"--replay: {key}= has no value; paste the token exactly as printed")
            if key in fields:
                raise ValueError(f"--replay: {key}= appears twice; paste the token exactly as printed")
            fields[key] = value
        lacking = [key for key in REQUIRED_FIELDS if key not in fields]
        if lacking:
            raise ValueError(f"--replay: the replay token lacks {', '.join(lacking)}; paste the whole "
                             "token printed in the summary table")
        numbers = {}
        for key, (minimum, meaning) in INTEGER_FIELDS.items():
            text = fields.get(key)
            if text is None:
                continue
            if not re.fullmatch(r"[0-9]+", text) or int(text) < minimum:
                raise ValueError(f"--replay: {key}={text}: {meaning} must be an integer >= {minimum}"
                                 + (" (two show every hazard)" if key == "steps" else ""))
            numbers[key] = int(text)
        if fields["dtype"] not in DTYPES:
            raise ValueError(f"--replay: dtype={fields['dtype']}: not a pipeline dtype; use one of {', '.join(DTYPES)}")
        missing = set() if fields["missing"] == "none" else set(fields["missing"].split("+"))
        if missing - set(EDGES):
            raise ValueError(f"--replay: missing={fields['missing']}: unknown edges "
                             f"{', '.join(sorted(missing - set(EDGES)))}; edges are {', '.join(EDGES)} (or none)")
        try:
            plan = SyncPlan(frozenset(EDGES) - missing, fields["post"], fields["side"], fields["caller"])
        except ValueError as exc:
            raise ValueError(f"--replay: {exc}") from None
        shape = Shape(numbers["M"], numbers["d"], numbers["n"], fields["dtype"])
        choice = ScheduleChoice(fields["policy"], numbers["seed"], numbers.get("delay_steps", 8),
                                numbers.get("pct_depth", 2), numbers.get("delay_us", 200))
        try:
            make_policy(choice.policy, choice.seed, **choice.params("sim"))
        except ValueError as exc:  # ScheduleError: unknown policy or a bad replay string
            raise ValueError(f"--replay: policy={choice.policy}: {exc}") from None
        return cls(plan, shape, choice, numbers.get("steps", 3), numbers.get("data", 0))


# The fields of a replay token, in the order token() prints them; the first ten are required.
TOKEN_FIELDS = ("missing", "post", "side", "caller", "M", "d", "n", "dtype", "policy", "seed",
                "delay_steps", "pct_depth", "delay_us", "steps", "data")
REQUIRED_FIELDS = TOKEN_FIELDS[:10]
INTEGER_FIELDS = {  # field: (least value, what it is)
    "M": (1, "tokens per step"), "d": (1, "the hidden size"), "n": (1, "the output features"),
    "seed": (0, "the schedule seed"), "delay_steps": (0, "the delay in host calls"),
    "pct_depth": (1, "the pct depth"), "delay_us": (0, "the delay in microseconds"),
    "steps": (2, "the decode steps"), "data": (0, "the data seed"),
}


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
    from ..pipeline import DeferredNormProjection

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
    policy: str = ""  # the schedule without its decisions: policy and seed
    hung: str = ""  # the example did not finish within the timeout: that, and its last device call

    @property
    def found(self) -> bool:
        return bool(self.races) or self.wrong or bool(self.hung)


@lru_cache(maxsize=256)
def _reference(shape, steps: int, data_seed: int, backend: str) -> tuple:
    # Run sequentially every plan computes the same values: the reference needs no plan.
    from streamcheck.device import Device

    device = Device(backend, check=False, policy="sequential")
    return tuple(run_program(SyncPlan.correct(), shape, device, steps, data_seed))


def run_example(example: Example, backend: str = "sim", timeout: Optional[float] = DEFAULT_TIMEOUT) -> Outcome:
    """One example, under `timeout` seconds (None or 0: no limit, in this thread): an example that
    runs longer is an Outcome whose `hung` says so, with the last device call it made. (The same
    limit gives the same call stacks in race reports: a replay's match the fuzz run's.)"""
    from streamcheck.timeout import RunTimedOut, last_operation, run_with_timeout

    made: dict = {}

    def program() -> tuple:
        device = made["device"] = example.choice.device(backend)
        made["first"] = len(device.trace)  # the device's own set-up is not the program's
        outputs = run_program(example.plan, example.shape, device, example.steps, example.data_seed)
        return device, outputs, _reference(example.shape, example.steps, example.data_seed, backend)

    try:
        device, outputs, want = run_with_timeout(program, timeout, "streamcheck fuzz example")
    except RunTimedOut as exc:
        last = last_operation(made["device"], made["first"]) if "first" in made else "none (no device yet)"
        hung = f"{exc}; last recorded operation: {last}"
        return Outcome(example, (), False, "", "", f"the example {hung}", policy=example.choice.describe(backend),
                       hung=hung)
    wrong = any(not np.array_equal(g, w, equal_nan=True) for g, w in zip(outputs, want))
    schedule = device.schedule
    if schedule is None:
        return Outcome(example, tuple(device.races), wrong, "", "", device.report(), tuple(outputs),
                       example.choice.describe(backend))
    return Outcome(example, tuple(device.races), wrong, str(schedule), schedule.compact(), device.report(),
                   tuple(outputs), f"{schedule.policy} seed={schedule.seed}")


# --- the fuzz loop ------------------------------------------------------------------------


@dataclass
class PlanStats:
    plan: object
    unsafe: bool  # the oracle's verdict
    runs: int = 0
    raced: int = 0
    wrong: int = 0
    hung: int = 0  # runs that did not finish within the timeout
    first: Optional[Outcome] = None  # the first finding, for its replay token and decisions
    first_wrong: Optional[Outcome] = None  # the first run with wrong values: its own replay (`first` may race only)

    @property
    def replay(self) -> str:
        return self.first.example.token() if self.first is not None else ""

    @property
    def disagrees(self) -> bool:
        # The checker's verdict does not depend on the schedule: every run of an unsafe
        # plan must report a race, and no run of a safe plan may.
        # A run that hung is counted apart: it never got to the end of the program.
        return (self.raced != self.runs - self.hung) if self.unsafe else (self.raced > 0 or self.wrong > 0)


@dataclass
class Tally:
    plans: dict = field(default_factory=dict)  # SyncPlan -> PlanStats
    examples: int = 0
    found: int = 0
    interrupted: bool = False  # Ctrl-C ended the run: the tally holds the examples run before it
    counts: list = field(default_factory=list)  # examples per worker, in worker order (--workers)

    def add(self, outcome: Outcome, unsafe: bool) -> None:
        plan = outcome.example.plan
        stats = self.plans.get(plan)
        if stats is None:
            stats = self.plans[plan] = PlanStats(plan, unsafe)
        stats.runs += 1
        stats.raced += bool(outcome.races)
        stats.wrong += outcome.wrong
        stats.hung += bool(outcome.hung)
        self.examples += 1
        if outcome.found:
            self.found += 1
            if stats.first is None:
                stats.first = outcome
            if outcome.wrong and stats.first_wrong is None:
                stats.first_wrong = outcome


class _Enough(Exception):
    """Raised inside the hypothesis test to end the run: the budget is spent or the count reached."""


def _SavesUntilTheEnd(database, ending: list):
    """`database` (hypothesis's ExampleDatabase), deaf to saves once `ending` holds something:
    hypothesis saves the example that raised _Enough as a failure, and every later run over the
    database (another worker's, the next one) would replay it first. Real failures (a crash in
    the pipeline, the backend or the checker) come before the end and are saved."""
    from hypothesis.database import ExampleDatabase

    class SavesUntilTheEnd(ExampleDatabase):
        def __init__(self):
            super().__init__()
            self.database = database

        def __repr__(self) -> str:
            return f"SavesUntilTheEnd({self.database!r})"

        def fetch(self, key):
            return self.database.fetch(key)

        def save(self, key, value) -> None:
            if not ending:
                self.database.save(key, value)

        def delete(self, key, value) -> None:
            self.database.delete(key, value)

        def move(self, src, dest, value) -> None:
            if not ending:
                self.database.move(src, dest, value)

    return SavesUntilTheEnd()


class Progress:
    """A one-line progress bar on stderr, redrawn with `\r` at most 10 times a second: only
    on a terminal (never frames in a log file), unless `enabled` says otherwise."""

    def __init__(self, budget: Optional[float] = None, examples: Optional[int] = None, stream=None,
                 enabled: Optional[bool] = None):
        self.budget, self.examples = budget, examples
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
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
        if self.examples:
            done, clock = tally.examples / self.examples, f"{tally.examples}/{self.examples} examples"
        else:
            done = min(now / self.budget, 1.0) if self.budget else 1.0
            clock = f"{now:5.1f}/{self.budget:g}s  {tally.examples} examples"
        line = f"fuzz [{'#' * int(done * 30):<30}] {clock}  {len(tally.plans)} plans  {tally.found} findings "
        # A frame wider than the terminal wraps, and `\r` then redraws only its last row.
        self.stream.write("\r" + line[:shutil.get_terminal_size().columns - 1])
        self.stream.flush()

    def close(self, tally: Tally) -> None:
        if self.enabled:
            self.update(tally, force=True)
            self.stream.write("\n")
            self.stream.flush()


class WorkerProgress(Progress):
    """A worker's progress under --workers: its counts in `path` (gwK.progress), rewritten at most
    10 times a second, for the command to draw one bar over all workers; `started` (epoch seconds)
    is when its examples began, after pytest, xdist and the imports."""

    def __init__(self, path: Path, budget: Optional[float] = None, examples: Optional[int] = None):
        super().__init__(budget, examples, enabled=False)
        self.path = path
        self.started = time.time()
        self._written = -1.0

    def restart(self) -> None:
        super().restart()
        self.started = time.time()
        self.update(Tally(), force=True)

    def update(self, tally: Tally, force: bool = False) -> None:
        now = self.elapsed()
        if not force and now - self._written < 0.1:
            return
        self._written = now
        counts = {"examples": tally.examples, "found": tally.found, "started": self.started,
                  "updated": time.time(), "plans": [_plan_text(plan) for plan in tally.plans]}
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(counts))
        os.replace(temporary, self.path)  # the command never reads half a file

    def close(self, tally: Tally) -> None:
        self.update(tally, force=True)


def worker_counts(out: Path) -> tuple:
    """(the workers' progress so far as one tally, how long they have run examples: from the first
    one's start to the last one's latest count, or None before any started), from their
    gwK.progress files in `out`."""
    tally, started, updated = Tally(), [], []
    for path in out.glob("gw*.progress"):
        try:
            counts = json.loads(path.read_text())
        except (OSError, ValueError):  # not written yet
            continue
        tally.examples += counts["examples"]
        tally.found += counts["found"]
        tally.plans.update(dict.fromkeys(counts["plans"]))  # the bar counts distinct plans
        started.append(counts["started"])
        updated.append(counts["updated"])
    return tally, (max(updated) - min(started) if started else None)


def workers_cost_note(workers: int, overhead: float, running: float) -> Optional[str]:
    """A note when the workers spent longer starting and stopping (`overhead`) than running their
    examples: a run that short is faster in one process."""
    if overhead <= running:
        return None
    if running == 0:
        return (f"streamcheck fuzz: note: the budget ran out while the {workers} workers were starting (pytest, "
                f"xdist, the imports: {overhead:.1f} s here); give a longer budget, or leave out --workers")
    return (f"streamcheck fuzz: note: the {workers} workers took {overhead:.1f} s to start and stop (pytest, xdist, "
            f"the imports) and {running:.1f} s to run their examples; a run this short is faster without --workers")


def fuzz(budget: Optional[float] = None, backend: str = "sim", profile: str = "streamcheck-fuzz",
         plans: str = "all", steps: int = 3, seed: int = 0, progress: Optional[Progress] = None,
         examples: Optional[int] = None, database=None, timeout: Optional[float] = DEFAULT_TIMEOUT,
         stop_at: Optional[float] = None) -> Tally:
    """Run `examples` examples, or examples until `budget` seconds are spent (or the clock reads
    `stop_at`, epoch seconds: a --workers budget's end) or the profile's max_examples is reached. Ctrl-C ends the run early: the tally says `interrupted`. An example
    that runs longer than `timeout` seconds is a finding (`hung`), and the run goes on.

    The same seed and profile draw the same sequence of examples, and both a count and a
    budget cut that one sequence (hypothesis plans its sequence by max_examples, so a count
    must not change max_examples): the first N examples of a budget run are those of
    `examples=N`, which is how the summary's repeat line repeats it. With a hypothesis example
    `database`, examples saved there (a crash found earlier, by this or another worker) run first."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from streamcheck import strategies as sst

    from ..testing import strategies as fst
    from ..testing.oracle import is_safe

    plan_strategy = {"all": fst.sync_plans(), "safe": fst.safe_plans(), "unsafe": fst.unsafe_plans()}[plans]
    tally = Tally()
    ending = []  # set once _Enough is raised: from then on nothing is saved (see _SavesUntilTheEnd)
    if database is not None:
        database = _SavesUntilTheEnd(database, ending)
    progress = progress or Progress(budget, examples, enabled=False)
    max_dim = 64 if backend == "cupy" else 16
    base = settings.get_profile(profile)
    # derandomize=False: the seed, not the test's source, chooses the sequence.
    run_settings = settings(
        base, max_examples=max(base.max_examples, examples or 0), derandomize=False, database=database,
        deadline=None, phases=(Phase.generate,) if database is None else (Phase.reuse, Phase.generate),
        verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck), report_multiple_bugs=False)

    @given(plan=plan_strategy,
           shape=fst.shapes(max_tokens=4, max_hidden=max_dim, max_out=max_dim),
           choice=sst.schedule_choices(policies=("delay", "random", "pct")),
           data_seed=st.integers(0, 2**16))
    def one(plan, shape, choice, data_seed):
        if (tally.examples == examples or (budget is not None and progress.elapsed() >= budget)
                or (stop_at is not None and time.time() >= stop_at)):
            ending.append(True)
            raise _Enough
        example = Example(plan, shape, choice, steps, data_seed)
        tally.add(run_example(example, backend, timeout), unsafe=not is_safe(plan))
        progress.update(tally)

    if database is None:
        one = hypothesis_seed(seed)(run_settings(one))
    else:
        # @seed turns the database off (a seeded run reproduces, it does not replay); settings
        # applied after it put the shared one back, and the seed still picks the sequence.
        one = run_settings(hypothesis_seed(seed)(one))
    from .. import pipeline  # noqa: F401  (imported here, not on the budget's clock)

    progress.restart()
    try:
        one()
    except _Enough:
        pass
    except KeyboardInterrupt:
        tally.interrupted = True
    progress.close(tally)
    return tally


# --- several workers (--workers N: pytest -n N over test_fuzz_worker) ------------------------

JOB_ENV = "STREAMCHECK_FUZZ_JOB"  # the job file a worker reads: what to run, where to write its tally


def worker_share(examples: int, workers: int, k: int) -> int:
    """Worker k's part of a count: equal shares, the first ones one more when it does not divide."""
    return examples // workers + (k < examples % workers)


def _race_from_dict(d: dict):
    from streamcheck.core.hb import Race

    return Race.from_dict(d)


def _outcome_to_json(o: Optional[Outcome]) -> Optional[dict]:
    """A finding as a worker hands it over: its token and what the table and --json show of it."""
    if o is None:
        return None
    return {"token": o.example.token(), "races": [r.to_dict() for r in o.races], "wrong": o.wrong,
            "schedule": o.schedule, "decisions": o.decisions, "report": o.report, "policy": o.policy, "hung": o.hung}


def _outcome_from_json(d: Optional[dict]) -> Optional[Outcome]:
    if d is None:
        return None
    return Outcome(Example.parse(d["token"]), tuple(map(_race_from_dict, d["races"])), d["wrong"], d["schedule"],
                   d["decisions"], d["report"], policy=d["policy"], hung=d["hung"])


def tally_to_json(tally: Tally) -> dict:
    """A worker's tally for the command that merges them (first findings with their reports)."""
    plans = []
    for s in tally.plans.values():
        plans.append({"plan": _plan_json(s.plan), "unsafe": s.unsafe, "runs": s.runs, "raced": s.raced,
                      "wrong": s.wrong, "hung": s.hung, "first": _outcome_to_json(s.first),
                      "first_wrong": _outcome_to_json(s.first_wrong)})
    return {"examples": tally.examples, "found": tally.found, "interrupted": tally.interrupted, "plans": plans}


def merge_tallies(parts: list) -> Tally:
    """One tally from the workers' (tally_to_json), in worker order: a plan's first finding is the
    first worker's that had one."""
    tally = Tally()
    for part in parts:
        tally.examples += part["examples"]
        tally.found += part["found"]
        tally.interrupted |= part["interrupted"]
        tally.counts.append(part["examples"])
        for record in part["plans"]:
            p = record["plan"]
            plan = SyncPlan(frozenset(EDGES) - set(p["missing"]), p["post_stream"], p["side_kind"], p["caller_kind"])
            stats = tally.plans.get(plan)
            if stats is None:
                stats = tally.plans[plan] = PlanStats(plan, record["unsafe"])
            stats.runs += record["runs"]
            stats.raced += record["raced"]
            stats.wrong += record["wrong"]
            stats.hung += record["hung"]
            if stats.first is None:
                stats.first = _outcome_from_json(record["first"])
            if stats.first_wrong is None:
                stats.first_wrong = _outcome_from_json(record["first_wrong"])
    return tally


def test_fuzz_worker():
    """One xdist worker's part of `streamcheck fuzz --workers N` (which runs pytest over this
    function); it reads its job from the file $STREAMCHECK_FUZZ_JOB names. Not part of a test suite."""
    import pytest
    from hypothesis import settings

    path = os.environ.get(JOB_ENV)
    if not path:
        pytest.skip(f"run by `streamcheck fuzz --workers N`, which sets {JOB_ENV}")
    job = json.loads(Path(path).read_text())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker[2:])
    examples = job["examples"]
    share = None if examples is None else worker_share(examples, job["workers"], k)
    budget = job["budget"]
    tally = Tally()
    if share != 0:
        # The plugin put the shared example database on the profile pytest loaded (--hypothesis-profile).
        tally = fuzz(budget, job["backend"], job["profile"], job["plans"], job["steps"],
                     (job["seed"] + k) % 2**32, WorkerProgress(Path(job["out"], f"{worker}.progress"), budget, share),
                     examples=share, database=settings.default.database, timeout=job["timeout"],
                     stop_at=job["deadline"])  # the budget is the command's wall time, starting up included
    Path(job["out"], f"{worker}.json").write_text(json.dumps(tally_to_json(tally)))


# The pytest controller: leader of a process group of its own, which its xdist workers join.
# A thread started before pytest is imported watches the `streamcheck fuzz` process (argv[1]):
# once it is gone, however it died (SIGKILL too), the whole group is killed at once, workers
# still starting up included; nobody would read their tallies, and they would keep a GPU busy
# past the --budget.
_CONTROLLER = """\
import os, signal, sys, threading, time
parent = int(sys.argv.pop(1))
def watch():
    while os.getppid() == parent:
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=watch, daemon=True).start()
if os.getppid() == parent:
    import pytest
    sys.exit(pytest.console_main())
"""


def fuzz_workers(workers: int, budget: Optional[float], backend: str, profile: str, plans: str, steps: int,
                 seed: int, examples: Optional[int], example_db: Optional[str], err=None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT, progress: Optional[Progress] = None) -> tuple:
    """Run the fuzz over `workers` pytest-xdist workers (one GPU each where there are GPUs);
    return (merged tally, seconds, pytest's exit status, pytest's output). A `budget` is the
    command's wall time, starting the workers included; `progress` draws their counts as one bar.

    The controller and its workers end with this process, even when it is SIGKILLed; their
    scratch directory (streamcheck-fuzz-PID-*) is removed at the end, or by the next run."""
    err = err if err is not None else sys.stderr
    progress = progress or Progress(budget, examples, enabled=False)
    launched = time.time()
    deadline = launched + budget if budget is not None else None
    with owned_temporary_directory("streamcheck-fuzz") as folder:
        out = Path(folder, "tallies")
        out.mkdir()
        job = Path(folder, "job.json")
        job.write_text(json.dumps({"workers": workers, "budget": budget, "backend": backend, "profile": profile,
                                   "plans": plans, "steps": steps, "seed": seed, "examples": examples,
                                   "timeout": timeout, "deadline": deadline,
                                   "out": str(out)}))
        # Not the caller's project settings; the plugin pins workers to GPUs only when asked.
        Path(folder, "pytest.ini").write_text("[pytest]\nstreamcheck_gpus = auto\n")
        database = os.path.abspath(example_db) if example_db else str(Path(folder, "examples"))
        command = [sys.executable, "-c", _CONTROLLER, str(os.getpid()),
                   f"{os.path.abspath(__file__)}::test_fuzz_worker", "-p", "xdist",
                   "-n", str(workers), "--dist", "each", "-c", str(Path(folder, "pytest.ini")), "--rootdir", folder,
                   "-p", "no:cacheprovider", "-q", "--color=no", f"--hypothesis-profile={profile}",
                   f"--streamcheck-example-db={database}", f"--streamcheck-backend={backend}"]
        env = dict(os.environ, **{JOB_ENV: str(job)})
        env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)  # the run needs xdist, hypothesis's and our plugin
        start = time.perf_counter()
        interrupted = stopped = False
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
        try:
            output, stopped = wait_for_workers(child, out, progress, workers, deadline)
        except KeyboardInterrupt:  # passed on to the controller's group: the workers write what they found and stop
            interrupted = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGINT)
            output, _ = child.communicate()
        seconds = time.perf_counter() - start
        counted, running = worker_counts(out)
        progress.close(counted)
        note = workers_cost_note(workers, time.time() - launched - (running or 0.0), running or 0.0)
        if note:
            print(note, file=err)
        from streamcheck.plugin.profiles import UNREADABLE_ENTRY

        unreadable = {}  # the plugin's warnings about example database entries, once each (every worker warns)
        for line in output.splitlines():  # the plugin's word on the GPUs (fewer than workers, ...)
            if line.startswith("streamcheck: ") and "xdist workers" in line:
                print(line, file=err)
            elif UNREADABLE_ENTRY in line:
                unreadable.setdefault(line[line.index(UNREADABLE_ENTRY):])
        for line in unreadable:
            print(line, file=err)
        parts = [json.loads(p.read_text()) for p in sorted(out.glob("gw*.json"), key=lambda p: int(p.stem[2:]))]
    tally = merge_tallies(parts)
    tally.interrupted |= interrupted
    if stopped:  # by the budget, not a failure: a worker that never began ran 0 examples
        tally.counts += [0] * (workers - len(tally.counts))
        return tally, seconds, 0, output
    return tally, seconds, child.returncode, output


def wait_for_workers(child, out: Path, progress: Progress, workers: int, deadline: Optional[float] = None) -> tuple:
    """(pytest's output once it exits, whether the budget stopped it); meanwhile the workers'
    counts drawn (at most 10 times a second). Once a budget's `deadline` has passed, the workers
    are stopped as soon as every tally is written (pytest's teardown would only add to the wall
    time), or at once if none had begun its examples (they would start and run for nothing)."""
    stopped = False
    while True:
        try:
            return child.communicate(timeout=0.1)[0], stopped
        except subprocess.TimeoutExpired:  # retrying loses no output (Popen.communicate's word)
            counted, running = worker_counts(out)
            progress.update(counted)
            over = deadline is not None and time.time() > deadline
            if over and not stopped and (running is None or len(list(out.glob("gw*.json"))) == workers):
                stopped = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)  # the controller leads the workers' group


# --- output ---------------------------------------------------------------------------------


def terminal_width() -> int:
    """The width to wrap at: the terminal's (COLUMNS when set, 80 when not a terminal)."""
    return max(shutil.get_terminal_size().columns, 40)


def quoted_token_lines(prefix: str, token: str, width: int, indent: str) -> list:
    """`prefix` then the token, as lines of at most `width` where the token allows: unquoted on
    one line when it fits, else in single quotes broken after commas. Pasted into a shell the
    quoted lines are one argument, and Example.parse ignores the line breaks in it."""
    if len(prefix) + len(token) <= width:
        return [prefix + shlex.quote(token)]
    parts = token.split(",")
    pieces = [part + "," for part in parts[:-1]] + [parts[-1] + "'"]
    lines, line, empty = [], prefix + "'", False  # a first field too long for this line starts the next
    for piece in pieces:
        if not empty and len(line) + len(piece) > width:
            lines.append(line)
            line, empty = indent, True
        line, empty = line + piece, False
    return lines + [line]


def command_lines(prefix: str, words: list, width: int, indent: str) -> list:
    """A shell command over lines of at most `width`, broken between words with ` \\`."""
    lines, line = [], prefix + words[0]
    for word in words[1:]:
        if len(line) + 1 + len(word) + 2 > width:  # 2: room for the ` \` that ends the line
            lines.append(line + " \\")
            line = indent + word
        else:
            line += " " + word
    return lines + [line]


def elide(text: str, room: int, whole_in: str = "--json FILE") -> str:
    """`text` if it fits in `room` columns, else its start, how long it is and where it is whole."""
    if len(text) <= room:
        return text
    note = f"... ({len(text):,} in all: see {whole_in})"
    return text[:max(room - len(note), 10)] + note


def _wrap(text: str, width: int, indent: str = "  ") -> list:
    # Not at hyphens: `-fork_a-join_mm` is one list of missing edges.
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def _plan_text(plan) -> str:
    missing = [e for e in EDGES if e not in plan.edges]
    return (f"-{'-'.join(missing) if missing else '(none)'} post={plan.post_stream} "
            f"side={plan.side_kind} caller={plan.caller_kind}")


def _rows(tally: Tally) -> list:
    """The plans the table lists: disagreements first (they are bugs), then the plans whose
    races struck most."""
    stats = list(tally.plans.values())
    disagree = [s for s in stats if s.disagrees]
    found = [s for s in stats if (s.raced or s.wrong or s.hung) and not s.disagrees]
    return sorted(disagree, key=lambda s: -s.runs) + sorted(found, key=lambda s: (-s.wrong, -s.raced))


def _verdict(s: PlanStats) -> str:
    return "DISAGREE" if s.disagrees else "unsafe" if s.unsafe else "safe"


def replay_command(backend: str, token: str) -> str:
    return f"streamcheck fuzz --backend {backend} --replay {shlex.quote(token)}"


def repeat_words(tally: Tally, backend: str, profile: str, plans: str, steps: int, seed: int,
                 workers: int = 1) -> list:
    """The command that runs exactly the examples this run ran (the same seed and count), as
    words that stay on one line (an option with its value). Over workers it is exact when each
    worker ran its share of the count (worker_share); a budget run says when they did not."""
    words = ["streamcheck fuzz", f"--backend {backend}", f"--plans {plans}", f"--steps {steps}"]
    if profile != "streamcheck-fuzz":
        words.append(f"--profile {shlex.quote(profile)}")
    if workers > 1:
        words.append(f"--workers {workers}")
    return words + [f"--seed {seed}", f"--examples {tally.examples}"]


TABLE_INDENT = 29  # where the plan column starts


def summary(tally: Tally, seconds: float, backend: str, profile: str, plans: str, max_rows: int = 20,
            steps: int = 3, seed: int = 0, width: Optional[int] = None, workers: int = 1) -> str:
    """The table, wrapped at `width` (default: the terminal's). Times appear on the first
    line only: the rest is the same for the same seed and count."""
    width = width or terminal_width()
    rate = tally.examples / seconds if seconds > 0 else 0.0
    stats = list(tally.plans.values())
    rows = _rows(tally)
    first = f"streamcheck fuzz: {tally.examples} examples in {seconds:.1f} s ({rate:.1f} examples/s)"
    lines = [first + ("; interrupted (Ctrl-C)" if tally.interrupted else "")]
    for text in (f"backend {backend}, profile {profile}, plans {plans}, steps {steps}, seed {seed}"
                 + (f", {workers} workers (seeds {seed}..{seed + workers - 1})" if workers > 1 else ""),
                 f"plans tried: {len(stats)} ({sum(s.unsafe for s in stats)} unsafe by the oracle)",
                 f"races found in {sum(1 for s in stats if s.raced)} plans, wrong values in "
                 f"{sum(1 for s in stats if s.wrong)}; oracle disagreements: "
                 f"{sum(1 for s in stats if s.disagrees)}"
                 + (f"; examples that did not finish: {sum(s.hung for s in stats)}" if any(s.hung for s in stats)
                    else "")):
        lines += _wrap(text, width)
    if rows:
        lines.append(f"{'verdict':<9} {'runs':>5} {'races':>5} {'wrong':>5}  plan (-missing edges)")
        for s in rows[:max_rows]:
            head = f"{_verdict(s):<9} {s.runs:>5} {s.raced:>5} {s.wrong:>5}  "
            plan = _wrap(_plan_text(s.plan), max(width - TABLE_INDENT, 20), "")
            lines.append(head + plan[0])
            lines += [" " * TABLE_INDENT + more for more in plan[1:]]
            if s.replay:
                lines += quoted_token_lines(f"          replay: streamcheck fuzz --backend {backend} --replay ",
                                            s.replay, width, " " * 12)
            if s.first_wrong is not None and s.first_wrong is not s.first:  # the first finding raced only
                lines += quoted_token_lines(f"          replay (wrong values): streamcheck fuzz --backend {backend} "
                                            "--replay ", s.first_wrong.example.token(), width, " " * 12)
            if s.first is not None and s.first.hung:
                lines += _wrap(f"          hung: {s.first.hung}", width, " " * 12)
        if len(rows) > max_rows:
            lines += _wrap(f"... and {len(rows) - max_rows} more plans with findings (--max-rows, or --json FILE)",
                           width)
    if tally.found and plans != "safe":
        lines += _wrap("findings are expected for plans the oracle calls unsafe: each is an edge left out on purpose",
                       width)
    if tally.examples:
        lines += command_lines("repeat: ", repeat_words(tally, backend, profile, plans, steps, seed, workers), width,
                               "        ")
        if workers > 1 and tally.counts != [worker_share(tally.examples, workers, k) for k in range(workers)]:
            lines += _wrap(f"(only approximately: the workers ran {', '.join(map(str, tally.counts))} examples, and "
                           f"--examples {tally.examples} gives each its equal share)", width)
    return "\n".join(lines)


def _plan_json(plan) -> dict:
    return {"missing": [e for e in EDGES if e not in plan.edges], "post_stream": plan.post_stream,
            "side_kind": plan.side_kind, "caller_kind": plan.caller_kind}


def summary_json(tally: Tally, seconds: float, backend: str, profile: str, plans: str, steps: int,
                 seed: int, workers: int = 1) -> dict:
    """What the table says, for every plan tried (not only --max-rows), with each first
    finding's full replay token and decisions."""
    listed = _rows(tally)
    quiet = [s for s in tally.plans.values() if s not in listed]
    records = []
    for s in listed + quiet:
        record = {"verdict": "unsafe" if s.unsafe else "safe", "disagrees": s.disagrees, "runs": s.runs,
                  "races": s.raced, "wrong": s.wrong, "hung": s.hung, "plan": _plan_json(s.plan),
                  "first_finding": None}
        if s.first is not None:
            record["first_finding"] = {"replay": s.replay, "replay_command": replay_command(backend, s.replay),
                                       "schedule": s.first.policy, "decisions": s.first.decisions,
                                       "wrong": s.first.wrong, "races": [r.to_dict() for r in s.first.races],
                                       "hung": s.first.hung}
        if s.first_wrong is not None:  # the first run with wrong values (the first finding may race only)
            token = s.first_wrong.example.token()
            record["first_wrong_values"] = {"replay": token, "replay_command": replay_command(backend, token),
                                            "schedule": s.first_wrong.policy, "decisions": s.first_wrong.decisions}
        records.append(record)
    return {"command": "fuzz", "backend": backend, "profile": profile, "plans": plans, "steps": steps,
            "seed": seed, "examples": tally.examples, "seconds": round(seconds, 3),
            "interrupted": tally.interrupted, "findings": tally.found,
            "repeat": " ".join(repeat_words(tally, backend, profile, plans, steps, seed, workers)),
            "workers": workers, "worker_examples": tally.counts,
            "plans_tried": records}


def replay_text(outcome: Outcome, width: Optional[int] = None, json_name: Optional[str] = None) -> str:
    """What --replay prints; a decisions string too long for one line is cut (whole in --json)."""
    width = width or terminal_width()
    lines = quoted_token_lines("example: ", outcome.example.token(), width, "  ")
    lines.append(f"schedule: {outcome.policy}")
    if outcome.hung:
        return "\n".join(lines + [f"hung: {outcome.hung}"])
    whole_in = "the --json file" if json_name else "--json FILE"
    lines.append(f"decisions: {elide(outcome.decisions or '-', width - len('decisions: '), whole_in)}")
    lines.append(f"values: {'WRONG (differ from the sequential run)' if outcome.wrong else 'match the sequential run'}")
    lines.append(outcome.report)
    return "\n".join(lines)


def replay_json(outcome: Outcome, backend: str) -> dict:
    token = outcome.example.token()
    return {"command": "fuzz --replay", "backend": backend, "replay": token,
            "replay_command": replay_command(backend, token), "schedule": outcome.policy,
            "decisions": outcome.decisions, "wrong": outcome.wrong, "found": outcome.found,
            "races": [r.to_dict() for r in outcome.races], "report": outcome.report, "hung": outcome.hung}


# --- command line ---------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*$")  # a sign: refused as not positive


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
        "fuzz", help="fuzz FlashNorm's dual-stream pipeline: its sync plans x shapes x schedules",
        description="Fuzz the sync plans of FlashNorm's dual-stream pipeline (the subject streamcheck ships), not your "
                    "own program: to check your program, use `streamcheck run script.py` (its schedules: --schedules "
                    "N --policy delay,random,pct) or, in pytest, the run_schedules fixture with hypothesis "
                    "(docs/plugin.md). "
                    "Draw sync plans x shapes x schedules, run the FlashNorm decode loop on each, and report "
                    "races and wrong values. With --plans all (the default) findings are expected: most plans leave "
                    "an edge out on purpose. Only a count, not a time budget, repeats a run exactly: the same "
                    "--seed and --examples N print the same table (times aside). A --budget stops wherever the "
                    "machine's speed puts it; the summary ends with the --examples line that repeats it.",
        epilog="Exit status: 0 nothing found, 1 findings, 2 bad options, 130 interrupted (Ctrl-C: the table of "
               "what was found so far is still printed).")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--budget", default=None, help="time to spend, e.g. 60s, 2m, 500ms (default 60s); "
                        "does not repeat exactly, even with --seed")
    length.add_argument("--examples", type=int, default=None, metavar="N",
                        help="run exactly N examples instead of a time budget; with --seed, repeats a run exactly")
    parser.add_argument("--backend", default="sim", choices=("auto", "sim", "cupy"), help="device backend (sim)")
    parser.add_argument("--profile", default="fuzz", help="hypothesis profile: dev, ci or fuzz (ours: "
                        "streamcheck-dev, ...) or any registered one (default fuzz); its max_examples caps a "
                        "--budget run")
    parser.add_argument("--plans", default="all", choices=("all", "safe", "unsafe"),
                        help="which plans to draw (default all: findings expected)")
    parser.add_argument("--steps", type=int, default=3, help="decode steps per example (default 3)")
    parser.add_argument("--seed", type=int, default=None,
                        help="hypothesis seed (default: a random one, printed in the summary)")
    parser.add_argument("--max-rows", type=int, default=20, help="plans listed in the table (default 20)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"an example that runs longer is reported as hung, with its last device call and its "
                             f"replay, and the run goes on (default {DEFAULT_TIMEOUT:g}; 0: no limit)")
    parser.add_argument("--replay", metavar="TOKEN", help="run one example from the table and print its report")
    parser.add_argument("--json", metavar="FILE", help="also write the table (every plan tried, each first "
                        "finding's full replay token and decisions) or the replayed example as JSON (- for stdout, "
                        "the table then on stderr)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar (it is drawn only on a terminal)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="spread the run over N pytest-xdist workers, each pinned to one GPU (fewer GPUs are "
                             "shared round-robin; with --backend sim they are CPU processes); worker K draws from "
                             "seed + K and runs its share of --examples, or the whole --budget, which stays the wall "
                             "time: starting the workers (seconds) comes out of it (default 1: here)")
    parser.add_argument("--example-db", metavar="DIR", default=None,
                        help="with --workers: the hypothesis example database the workers share (default: a "
                             "temporary one for the run); a crash one worker hits is replayed first by the others "
                             "and by later runs over DIR")
    parser.set_defaults(func=main)
    parser.error = _explain_dash_values(parser.error)


def _explain_dash_values(error):
    """argparse takes the value of `--budget -5s` for an option and says only "expected one
    argument": say what was meant, and how to pass such a value."""
    def explained(message: str):
        if message.startswith("argument --budget") and "expected one argument" in message:
            message += " (a duration like 60s; a value that starts with '-' is written --budget=-5s)"
        error(message)

    return explained


def _usage(message: str) -> int:
    print(f"streamcheck fuzz: error: {message}", file=sys.stderr)
    return 2


def _json_target_problem(name: str) -> Optional[str]:
    """Why --json FILE cannot be written, checked before the run; None when it can."""
    path = Path(name)
    if path.is_dir():
        return f"--json {name}: is a directory; name a file to write"
    parent = path.parent
    if not parent.is_dir():
        return f"--json {name}: the directory {parent} does not exist; create it or name another file"
    if not os.access(parent, os.W_OK):
        return f"--json {name}: cannot write in {parent}; name a file in a writable directory"
    return None


def _write_json(name: str, data: dict, stdout=None) -> Optional[str]:
    """Write whole or not at all (atomic_files.write_text), or to `stdout` for `--json -`; an
    error message, or None."""
    if name == STDOUT:
        stdout.write(json.dumps(data, indent=2) + "\n")
        return None
    try:
        write_text(name, json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        return f"--json {name}: could not write it ({exc.strerror or exc}); nothing was written"
    return None


def main(args) -> int:
    with _hypothesis_storage_elsewhere():
        if args.json == STDOUT:  # `--json -`: the JSON alone on stdout, the table and the rest on stderr
            json_stdout = sys.stdout
            with contextlib.redirect_stdout(sys.stderr):
                return _main(args, json_stdout)
        return _main(args)


@contextlib.contextmanager
def _hypothesis_storage_elsewhere():
    """hypothesis keeps a cache (and, by default, its example database) in ./.hypothesis: a fuzz run
    leaves nothing in the user's working directory, so it points hypothesis at a temporary directory
    (its workers too, through the environment) unless the user named one
    (HYPOTHESIS_STORAGE_DIRECTORY). The shared database of --workers is --example-db's, elsewhere."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        yield
        return
    import tempfile

    from hypothesis.configuration import set_hypothesis_home_dir

    folder = tempfile.mkdtemp(prefix="streamcheck-fuzz-hypothesis-")
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = folder
    set_hypothesis_home_dir(folder)
    try:
        yield
    finally:
        set_hypothesis_home_dir(None)
        os.environ.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
        shutil.rmtree(folder, ignore_errors=True)


def _main(args, json_stdout=None) -> int:
    from streamcheck.device.backends import BackendUnavailable, gpu_available, resolve

    budget = examples = None
    if args.examples is not None:
        if args.examples < 1:
            return _usage(f"--examples {args.examples}: need an integer >= 1")
        examples = args.examples
    else:
        try:
            budget = parse_duration(args.budget or "60s")
        except ValueError as exc:
            return _usage(str(exc))
    if args.steps < 2:
        return _usage(f"--steps {args.steps}: need at least 2 (the write-after-read hazards span two steps)")
    if args.max_rows < 0:
        return _usage(f"--max-rows {args.max_rows}: must be >= 0")
    if not 0 <= args.timeout < float("inf"):  # NaN too
        return _usage(f"--timeout {args.timeout:g}: need a number of seconds >= 0 (0: no limit)")
    if args.workers < 1:
        return _usage(f"--workers {args.workers}: need an integer >= 1 (the pytest-xdist workers; 1 runs here)")
    if args.replay is not None and not args.replay.strip():  # not a fuzz run of the whole budget
        return _usage("--replay: the token is empty; paste the whole token printed in the summary table")
    if args.workers > 1 and args.replay:
        return _usage("--workers spreads a fuzz run; --replay runs one example here: drop --workers")
    if args.replay and (args.examples is not None or args.budget is not None):
        size = "--examples" if args.examples is not None else "--budget"
        return _usage(f"--replay runs the one example its token describes; {size} sizes a fuzz run: drop {size}")
    if args.example_db and args.workers == 1:
        return _usage("--example-db is the database --workers N shares; give --workers N too")
    if args.workers > 1 and importlib.util.find_spec("xdist") is None:
        return _usage("--workers needs pytest-xdist (pip install pytest-xdist)")
    if args.example_db and Path(args.example_db).is_file():
        return _usage(f"--example-db {args.example_db}: is a file; name a directory (created if missing)")
    problem = _json_target_problem(args.json) if args.json and args.json != STDOUT else None
    if problem:
        return _usage(problem)
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    from streamcheck import strategies

    profile = strategies.profile_name(args.profile)
    try:
        settings.get_profile(profile)
    except InvalidArgument:
        return _usage(f"--profile {args.profile!r} is not a registered hypothesis profile; "
                      f"use one of dev, ci, fuzz ({', '.join(strategies.PROFILES)})")
    example = None
    if args.replay:
        try:
            example = Example.parse(args.replay)
        except ValueError as exc:
            return _usage(str(exc))
    backend = resolve(args.backend)
    if backend == "cupy" and not gpu_available():
        return _usage("--backend cupy needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]'); none found "
                      "here. Use --backend sim.")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**32)
    try:
        if example is not None:
            outcome = run_example(example, backend, args.timeout)
            print(replay_text(outcome, json_name=args.json))
            problem = _write_json(args.json, replay_json(outcome, backend), json_stdout) if args.json else None
            return _usage(problem) if problem else 1 if outcome.found else 0
        if args.workers > 1:
            progress = Progress(budget, examples, enabled=False if args.quiet else None)
            tally, seconds, status, output = fuzz_workers(args.workers, budget, backend, profile, args.plans,
                                                          args.steps, seed, examples, args.example_db,
                                                          timeout=args.timeout, progress=progress)
            # A worker that raised (a crash in the pipeline, the backend or the checker) wrote no tally.
            failed = not tally.interrupted and (status != 0 or len(tally.counts) != args.workers)
            if failed:
                print(output, file=sys.stderr)
                print(f"streamcheck fuzz: error: the pytest run over {args.workers} workers failed (exit status "
                      f"{status}; its output is above); the table below holds the workers that finished",
                      file=sys.stderr)
        else:
            progress = Progress(budget, examples, enabled=False if args.quiet else None)
            tally = fuzz(budget, backend, profile, args.plans, args.steps, seed, progress, examples,
                         timeout=args.timeout)
            seconds, failed = progress.elapsed(), False
    except BackendUnavailable as exc:
        return _usage(str(exc))
    print(summary(tally, seconds, backend, profile, args.plans, args.max_rows, args.steps, seed, workers=args.workers))
    if args.json:
        problem = _write_json(args.json, summary_json(tally, seconds, backend, profile, args.plans, args.steps, seed,
                                                      workers=args.workers), json_stdout)
        if problem:
            return _usage(problem)
    if tally.interrupted:
        return 130
    return 1 if tally.found or failed else 0
