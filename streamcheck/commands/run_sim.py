"""`streamcheck run --backend sim`: the script's CUDA emulated on the CPU (streamcheck/emulation),
as the recording stage of run.py's pipeline, and the stages only the sim has: schedules that
rerun the script and compare its output, and the sim's halves of --confirm and --prove.

The recording stage runs the script once sequentially (the reference: every operation executes
when issued) with the happens-before checker on. Then `--schedules N` reruns, each on a fresh
sim device under one of `--policy` (delay, random, pct; seeds `--seed`, `--seed`+1, ...), compare
the script's standard output with the reference's and print, for each that differs, the line
that replays it. Before them, a second sequential run checks that the script is deterministic:
if its output differs, no schedule is compared (a difference would mean nothing).

One limit, `--timeout`, bounds all of these runs together (and --confirm's and --prove's reruns):
a run still going when it is up is interrupted, the command says which run it was, what had
finished and where the script was, and exits TIMED_OUT.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from ..core import schedule

# The schedules' policies: the core's that explore (sequential is the reference, eager an idle GPU).
POLICIES = tuple(name for name in schedule.POLICIES if name not in ("sequential", "eager", "replay"))


class Progress:
    """The runs of one `streamcheck run --backend sim` under its one limit (a timeout.Deadline):
    which finished, for the line that says so when the limit is up."""

    def __init__(self, deadline, schedules: int):
        self.deadline = deadline
        self.schedules = schedules
        self.finished: list = []  # "the reference", "the determinism rerun"
        self.schedules_done = 0
        self.timed_out = False
        self.unmatched: list = []  # --delay-stream / --delay-kernel names that held nothing (typos)

    def finished_text(self) -> str:
        done = list(self.finished)
        if self.schedules_done or "the determinism rerun" in done:
            done.append(f"{self.schedules_done} of {self.schedules} schedule{'s' if self.schedules != 1 else ''}")
        return ", ".join(done) or "nothing"

    def report_timeout(self, what: str, run=None) -> None:
        """The lines of a run interrupted by the limit: which, what had finished, where the script was."""
        self.timed_out = True
        print(f"streamcheck run: timed out: {what} did not finish within the run's limit of "
              f"{self.deadline.seconds:g} s (--timeout, for all runs together); finished: {self.finished_text()}",
              file=sys.stderr)
        if run is not None and run.hung_at:
            print("streamcheck run: where the script was (innermost last):", file=sys.stderr)
            for line in run.hung_at:
                print(f"  {line}", file=sys.stderr)


def record_on_sim(args, progress: Progress) -> tuple:
    """The recording stage on the sim: the script once, sequentially, checked. Returns (its exit
    status, its recording or None, the ScriptRun); a surface the sim does not model ends the run
    with its one line (exit 2, no recording)."""
    from ..core.trace import set_site_settings, site_settings
    from ..emulation.recording import EmulatedRecording
    from ..emulation.script import run_script

    sites_before = set_site_settings(replace(site_settings(), libraries=tuple(args.library)))
    try:
        run = run_script(args.script, args.args, policy="sequential", devices=args.devices, echo=True,
                         timeout=progress.deadline.remaining(), strict_free=args.strict_free)
    finally:
        set_site_settings(sites_before)
    sys.stdout.flush()
    if run.error:
        print(run.error, end="", file=sys.stderr)
    if run.refused:
        print(f"streamcheck run: {run.refused}", file=sys.stderr)
        return 2, None, run
    if run.timed_out:
        progress.report_timeout("the reference run", run)
    else:
        progress.finished.append("the reference")
    return run.status, EmulatedRecording(run.device, run.emulation, f"ran {args.script}"), run


@dataclass(frozen=True)
class ScheduleOutcome:
    label: str  # "random seed 3"
    replay: str  # the command line that reruns exactly this schedule
    difference: str  # "" when the output matched the reference


def _schedule_params(policy: str, args) -> dict:
    if policy != "delay":
        return {}
    params = {"steps": args.delay_steps}
    if args.delay_stream:
        params["streams"] = list(args.delay_stream)
    if args.delay_kernel:
        params["kernels"] = list(args.delay_kernel)
    return params


def _replay(args, policy: str, seed: int) -> str:
    import shlex

    parts = ["streamcheck", "run", "--backend", "sim", "--schedules", "1", "--policy", policy, "--seed", str(seed)]
    if policy == "delay":
        parts += ["--delay-steps", str(args.delay_steps)]
        parts += [x for name in args.delay_stream for x in ("--delay-stream", name)]
        parts += [x for name in args.delay_kernel for x in ("--delay-kernel", name)]
    if args.devices != 1:
        parts += ["--devices", str(args.devices)]
    if args.memory_capacity is not None:
        parts += ["--memory-capacity", str(args.memory_capacity)]
    return " ".join(shlex.quote(p) for p in parts + [args.script, *args.args])


def _first_difference(want: str, got: str) -> str:
    """Where two outputs part, as a user reads it: the first differing line of each."""
    a, b = want.splitlines(), got.splitlines()
    for number, (x, y) in enumerate(zip(a, b), start=1):
        if x != y:
            return f"line {number}: {_short(y)!r} (the reference printed {_short(x)!r})"
    if len(a) != len(b):
        return f"{len(b)} lines (the reference printed {len(a)})"
    return ""


def _short(line: str, limit: int = 160) -> str:
    return line if len(line) <= limit else line[:limit] + " ..."


def compare_schedules(args, reference, progress: Progress) -> list:
    """--schedules N: reruns under the chosen policies, each output compared with the reference's;
    they stop where the run's limit is up."""
    from ..emulation.script import run_script

    if args.schedules == 0:
        return []
    policies = args.policy
    again = run_script(args.script, args.args, policy="sequential", check=False, devices=args.devices,
                       timeout=progress.deadline.remaining())
    if again.timed_out:
        progress.report_timeout("the determinism rerun (a second sequential run)", again)
        return []
    progress.finished.append("the determinism rerun")
    if again.stdout != reference.stdout or again.status != reference.status:
        print(f"streamcheck: the script is not deterministic: a second sequential run printed other output "
              f"({_first_difference(reference.stdout, again.stdout)}); its {args.schedules} schedule(s) are not "
              "compared (a difference would not be the schedule's)", file=sys.stderr)
        return []
    outcomes = []
    named, matched, streams = set(args.delay_stream or ()) | set(args.delay_kernel or ()), set(), set()
    for i in range(args.schedules):
        policy, seed = policies[i % len(policies)], args.seed + i
        run = run_script(args.script, args.args, policy=policy, seed=seed, check=False, devices=args.devices,
                         timeout=progress.deadline.remaining(), **_schedule_params(policy, args))
        if run.timed_out:
            progress.report_timeout(f"schedule {policy} seed {seed}", run)
            print(f"  replay: {_replay(args, policy, seed)}", file=sys.stderr)
            break
        progress.schedules_done += 1
        if policy == "delay" and named and run.device is not None:
            matched |= run.device.backend.policy.matched
            streams |= {op.name for op in run.device.trace if type(op).__name__ == "StreamCreate" and op.name}
        if run.refused or run.error:
            # The reference's own exception, raised again at the same place, is no schedule's difference.
            same = bool(reference.refused or reference.error) and _raised(run) == _raised(reference) and \
                run.stdout == reference.stdout
            difference = "" if same else f"raised: {_raised(run)}"
        elif run.status != reference.status:
            difference = f"exited {run.status} (the reference exited {reference.status})"
        else:
            difference = _first_difference(reference.stdout, run.stdout)
        outcomes.append(ScheduleOutcome(f"{policy} seed {seed}", _replay(args, policy, seed), difference))
    wrong = [o for o in outcomes if o.difference]
    print(f"streamcheck: {len(outcomes)} {'of ' + str(args.schedules) + ' ' if progress.timed_out else ''}"
          f"schedule(s) on the sim ({', '.join(policies)}): "
          f"{len(wrong)} printed other output than the sequential reference", file=sys.stderr)
    for o in wrong:
        print(f"streamcheck: schedule {o.label}: {o.difference}\n  replay: {o.replay}", file=sys.stderr)
    if named and "delay" in policies[:progress.schedules_done]:
        progress.unmatched = sorted(named - matched)
        for name in progress.unmatched:
            option = "--delay-stream" if name in (args.delay_stream or ()) else "--delay-kernel"
            known = ", ".join(sorted(streams)) if option == "--delay-stream" else ""
            print(f"streamcheck run: error: {option} {name}: nothing of that name ran in the delay schedules, so "
                  f"nothing was held (streams are named in creation order: s1, s2, ...; `legacy` is the default "
                  f"stream{'; this run made ' + known if known else ''})", file=sys.stderr)
    return outcomes


def _raised(run) -> str:
    """A failed run in one line: the refusal, or the last line of the script's traceback."""
    return run.refused or run.error.strip().splitlines()[-1]


def script_program(args):
    """The script as a device-API program (a callable taking a sim Device and returning its
    output), for the sim's confirmation and proof reruns."""
    from ..emulation.script import run_script

    def program(device):
        run = run_script(args.script, args.args, device=device)
        if run.refused or run.error:
            raise RuntimeError(_raised(run))
        return run.stdout

    return program


def confirm_races_on_sim(args, recording) -> list:
    """--confirm on the sim: each race's first access held until its second ran (docs/confirm.md)."""
    from ..proofs.confirm import MAX_RACES, confirm_races

    races = recording.races
    limit = MAX_RACES if args.confirm_max is None else args.confirm_max
    print(f"streamcheck: confirming {min(len(races), limit)} of {len(races)} race(s) on the sim: the script rerun "
          "with each race's first access held until its second ran", file=sys.stderr)
    return list(confirm_races(script_program(args), races, max_races=limit,  # run.py prints the verdicts
                              strict_free=args.strict_free))


def prove_on_sim(args):
    """--prove on the sim: the audit's minimal set, rerun with the removable syncs skipped."""
    from ..proofs.sync_proof import prove

    print("streamcheck: proving the audit's minimal set on the sim: the script rerun with the removable "
          "synchronizations skipped, under delays and random schedules", file=sys.stderr)
    proof = prove(script_program(args), seed=args.seed)
    print(proof.format(), file=sys.stderr)
    return proof
