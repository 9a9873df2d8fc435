"""`streamcheck run [options] script.py [args...]`: check an unmodified CuPy, torch or Triton program.

The command runs the script in this process, as `python script.py args...` would
(as module `__main__`, with sys.argv and sys.path[0] set alike), after
streamcheck.instrument has wrapped the entry points of CuPy, torch and Triton; every
stream operation is recorded and fed to the happens-before checker. At the end each
race is printed to stderr.

Outputs, named as in `repro` and `fuzz`: --json FILE (the race reports; `-`: stdout),
--trace FILE (Perfetto) and --timeline FILE (PNG) of the racing pairs and the operations
around them (timeline_model.around_races), --ops-json FILE (every recorded operation).
The old spellings --report-json and --trace-json still work, with a note.

Exit status: --error-exitcode when a race or a refused capture was found (if given), else the script's
own status (0, its sys.exit code, or 1 for an uncaught exception, whose traceback
is printed as Python would). 2: bad usage, a script that cannot be opened, or no
GPU (no CUDA device, or neither CuPy nor a CUDA build of torch); with --skip-without-gpu,
no GPU is one line and 0. 3 (INTERNAL_ERROR), whatever the script's status: the recorder
hit an internal error (a record the checker refused, a call it could not record), so the
check is incomplete: a race may hide behind it; each error and refused record is printed.
124 (TIMED_OUT, sim): --timeout, one limit for all the sim's runs together, ran out (run_sim.py).

With --confirm, each distinct race (up to --confirm-max) is then confirmed by rerunning the
script in a fresh process with a bounded delay exactly before the race's first access and CUDA
timing events around both accesses (streamcheck/proofs/confirm_gpu.py, docs/confirm.md); a rerun is
`streamcheck run --confirm-probe JSON script.py`, the replay line each verdict prints. The exit
status stays the first run's.

With --audit-syncs, the run's synchronizations are audited after the report
(streamcheck/analyses/sync_audit.py, docs/sync-audit.md): each one's verdict and a minimal
sufficient set; with --json the JSON becomes {"races": [...], "sync_audit": {...}}.

The environment variable STREAMCHECK_RUN=1 is set while the script runs, so a
program (or its test) can tell it is being checked. It does not instrument
anything by itself: there is no sitecustomize hook, and child processes the
script starts are not checked (run them under `streamcheck run` too).
"""
from __future__ import annotations

import argparse
import builtins
import contextlib
import os
import sys
import threading
import traceback
import types
from dataclasses import dataclass, replace
from typing import Optional

from ..atomic_files import write_text
from ..interrupts import INTERRUPTED, exit_status as exit_status_of
from ..record.gpu import MAX_DELAY_US
from . import STDOUT, output_problem, report_width, timeline_file, timeline_problem

INTERNAL_ERROR = 3  # the recording is incomplete: a refused record can hide a race
TIMED_OUT = 124  # sim: --timeout ran out before every run finished (GNU timeout's status)
DEFAULT_TIMEOUT = 120.0  # sim: seconds for all the runs together (reference, rerun, schedules, confirm, prove)
BACKENDS = ("auto", "gpu", "sim")
DEFAULT_SCHEDULES = 4  # sim: reruns after the reference (each a fresh run of the script)


def _delay_us(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds, got {text!r}") from None
    if not 0 <= value <= MAX_DELAY_US:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_DELAY_US}] microseconds (the spin kernel's cap, "
                                         f"so nothing can hang), got {text}")
    return value


def _exit_code(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 255], got {text!r}") from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 255], got {text}")
    return value


def _policies(text: str) -> tuple:
    from .run_sim import POLICIES

    names = tuple(name.strip() for name in text.split(","))
    bad = [name for name in names if name not in POLICIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"policies are {', '.join(POLICIES)} (comma-separated), got {text!r}")
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0 (0: no limit), got {text!r}")
    return value


def _size(text: str) -> int:
    from ..emulation.memory_stats import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at_least(minimum: int):
    """An argparse type: an integer >= minimum, else a usage error naming the bound."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text}")
        return value
    return parse


_count, _positive = _at_least(0), _at_least(1)


class _Renamed(argparse.Action):
    """An option's old spelling (--report-json, --trace-json): it still works, and says its new name."""

    def __call__(self, parser, namespace, values, option_string=None):
        new = "--" + self.dest.replace("_", "-")
        print(f"streamcheck run: note: {option_string} is now {new}; the old spelling still works", file=sys.stderr)
        setattr(namespace, self.dest, values)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="run an unmodified CuPy, torch or Triton script and report its stream races",
        usage="%(prog)s [options] script.py [args ...]",
        description="Run a CuPy, torch or Triton script with every stream operation recorded and checked for races "
                    "(happens-before analysis; optionally with injected delays so that races strike).",
        epilog="Streams are named in creation order: s1, s2, ...; the legacy default stream is 'legacy', "
               "per-thread default streams 'ptds<thread>'. STREAMCHECK_RUN=1 is set while the script runs. "
               "See docs/instrument.md for what can and cannot be seen. Exit status: the script's own, or "
               "--error-exitcode's when something was found; 2 bad usage or no GPU (0 with --skip-without-gpu); "
               f"3 an internal error of the recorder (the check is incomplete); {TIMED_OUT} (sim) --timeout ran out.")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="gpu: record the script on an NVIDIA GPU; sim: run it on the CPU with CUDA emulated "
                        "(torch programs, unmodified; docs/emulation.md); auto (default): the GPU where there is "
                        "one, else the sim, saying so")
    p.add_argument("--schedules", type=_count, default=None, metavar="N",
                   help=f"sim: after the sequential reference, rerun the script under N schedules (default "
                        f"{DEFAULT_SCHEDULES}) and compare its output with the reference's")
    p.add_argument("--policy", type=_policies, default=None, metavar="P[,P...]",
                   help="sim: the schedules' policies, in turn: delay, random, pct (default all three)")
    p.add_argument("--delay-steps", type=_positive, default=8, metavar="N",
                   help="sim: how many host calls a delayed operation is held (default 8)")
    p.add_argument("--devices", type=_positive, default=1, metavar="N",
                   help="sim: how many CUDA devices to emulate (cuda:0 .. cuda:N-1; default 1)")
    p.add_argument("--memory-capacity", type=_size, default=None, metavar="SIZE",
                   help="sim: memory of each emulated device (e.g. 16GiB; default 8GiB, or "
                        "STREAMCHECK_MEMORY_CAPACITY's); more than it raises torch's OutOfMemoryError")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help=f"sim: seconds all the runs together may take (the reference, the determinism rerun, the "
                        f"schedules, --confirm's and --prove's reruns; default {DEFAULT_TIMEOUT:g}, 0: no limit); a run "
                        f"still going then is interrupted, where it was is printed, and the exit status is {TIMED_OUT}")
    p.add_argument("--delay-us", type=_delay_us, default=0.0, metavar="N",
                   help=f"spin N microseconds (<= {MAX_DELAY_US}) on targeted streams before each launch or copy")
    p.add_argument("--delay-stream", action="append", default=[], metavar="NAME",
                   help="stream to delay (repeatable): s1, s2, ... in creation order, legacy, ptds<thread>, or "
                        "all; none given: the seed picks")
    p.add_argument("--delay-kernel", action="append", default=[], metavar="NAME",
                   help="delay only before launches of this kernel (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed for choosing delayed streams (default 0)")
    p.add_argument("--error-exitcode", type=_exit_code, default=None, metavar="CODE",
                   help="exit with CODE when any race or refused stream capture was found "
                        "(default: the script's own status)")
    p.add_argument("--strict-free", action="store_true",
                   help="report a free while another stream may still use the memory as a FREE race even when no "
                        "allocation gets its bytes in this run (default: such a free is a hazard line, and the race "
                        "is an allocation that gets the bytes before that use is ordered before it)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="skip the warm-up (first cuBLAS call, pool growth) before the script")
    p.add_argument("--confirm", action="store_true",
                   help="after the run, confirm each distinct race: rerun the script once per race with a bounded "
                        "delay exactly before its first access and CUDA events around both accesses, and say whether "
                        "the second started before the first finished")
    p.add_argument("--confirm-max", type=_count, default=None, metavar="N",
                   help="confirm at most N races (default 8); the rest are listed as not attempted")
    p.add_argument("--audit-syncs", action="store_true",
                   help="after the run, audit its synchronizations: which are needed (and the race each prevents), "
                        "which are redundant, which host syncs could be device-side waits, and a minimal sufficient "
                        "set (docs/sync-audit.md)")
    p.add_argument("--prove", action="store_true",
                   help="with --audit-syncs: rerun the script with the removable synchronizations skipped (and host "
                        "synchronizes replaced by their device-side waits) under delays, compare its output, and time "
                        "it with and without them (docs/sync-audit.md)")
    p.add_argument("--skip-syncs", metavar="JSON", help=argparse.SUPPRESS)  # one rerun of --prove
    p.add_argument("--time-script", action="store_true", help=argparse.SUPPRESS)  # a timed rerun of --prove
    p.add_argument("--confirm-probe", metavar="JSON", help=argparse.SUPPRESS)  # one rerun of --confirm (its replay)
    p.add_argument("--library", action="append", default=[], metavar="PATH",
                   help="your own wrappers (a directory or file; repeatable): reports skip their frames, as torch's, "
                        "to name your call as the site, with the wrapper's line as the innermost frame")
    p.add_argument("--skip-without-gpu", action="store_true",
                   help="without a GPU (no CUDA device, or neither CuPy nor a CUDA build of torch), print one line "
                        "saying so and exit 0 instead of 2: one CI job for runners with and without GPUs")
    p.add_argument("--json", metavar="FILE",
                   help="also write the race reports as JSON to FILE (- for stdout, after the script's own output)")
    p.add_argument("--trace", metavar="FILE",
                   help="also write a Perfetto (Chrome trace) JSON of the racing pairs and the operations around them "
                        "to FILE (open in https://ui.perfetto.dev)")
    p.add_argument("--timeline", metavar="PNG",
                   help="also draw the racing pairs and the operations around them to PNG (.png is added to a name "
                        "without one; needs matplotlib)")
    p.add_argument("--ops-json", metavar="FILE", help="also write every recorded operation as JSON to FILE")
    p.add_argument("--report-json", dest="json", action=_Renamed, metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("--trace-json", dest="ops_json", action=_Renamed, metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("script", metavar="script.py", help="the Python script to run")
    script_args = p.add_argument("args", nargs=argparse.REMAINDER,
                                 help="arguments for the script (optional): everything after it, options included")
    script_args.required = False  # argparse marks every REMAINDER positional required; a script may take none
    p.set_defaults(func=run)


def _print_script_traceback(exc: BaseException, script: str) -> None:
    """Print the traceback as `python script.py` would: from the script's first frame on."""
    tb = exc.__traceback__
    target = os.path.abspath(script)
    first = tb
    while first is not None and os.path.abspath(first.tb_frame.f_code.co_filename) != target:
        first = first.tb_next
    traceback.print_exception(type(exc), exc, first or tb)


class _ScriptSpan:
    """The script's span on the GPU (--time-script): from the recording's start (the script's
    import of CuPy or torch, warm-up done) to its end; CUDA events on the legacy stream through
    the driver (no adapter records them), the device synchronized at both ends."""

    def __init__(self):
        from ..proofs.sync_proof_gpu import SPAN_PREFIX  # what --prove reads back

        self.prefix = SPAN_PREFIX
        self.started = False

    def begin(self) -> None:
        from ..record.adapters.cuda_device import CudaDriver

        self.driver = CudaDriver()
        self.driver.synchronize()
        self.start = self.driver.event_create()
        self.driver.event_record(self.start, 0)
        self.started = True

    def stop(self) -> float:
        self.driver.synchronize()
        end = self.driver.event_create()
        self.driver.event_record(end, 0)
        return self.driver.elapsed_us(self.start, end)


def strike_hints(races, seed: int, script: str, script_args) -> list:
    """"to make them strike" lines: per distinct first access on a stream, the race-directed delay
    (its stream and kernel), which makes the second access run first; the seed's delays where no
    first access can be delayed (the host's own)."""
    from ..core.schedule import directed_delay

    tail = " ".join([script, *script_args])
    lines, seen = [], set()
    for race in races:
        target = directed_delay(race)
        if target is None or target in seen:
            continue
        seen.add(target)
        stream, kernel = target
        flags = f"--delay-stream {stream}" + (f" --delay-kernel {kernel}" if kernel else "")
        lines.append(f"streamcheck: to make them strike, rerun with delays: streamcheck run --delay-us 200 {flags} "
                     f"{tail}  (delays {race.first.describe()}, so that `{race.second.name}` "
                     f"({race.second.site}) runs first)")
    if not lines:
        lines.append(f"streamcheck: to make them strike, rerun with delays: streamcheck run --delay-us 200 "
                     f"--seed {seed} {tail}".rstrip())
    return lines


class _Refused(Exception):
    """A usage problem found before the script runs: one line, exit status 2."""


def run(args) -> int:
    """The pipeline: read the script, refuse bad usage, record the script (on the GPU, or on the
    sim with CUDA emulated), report, compare schedules (sim), confirm, audit, prove, write the
    outputs."""
    try:
        source = _read_script(args.script)
        backend, why = _choose_backend(args)
        probe, edits = _check_usage(args, backend)
        if backend == "gpu":
            _require_gpu(args)
    except _Refused as exc:
        print(f"streamcheck run: {exc}", file=sys.stderr)
        return 2
    if backend == "sim" and getattr(args, "owns_process", False):
        _with_native_guard()
    if why:
        print(why, file=sys.stderr)
    if backend is None:  # no GPU and --skip-without-gpu
        return 0
    if backend == "sim":
        return _run_on_sim(args)
    recorded = record_on_gpu(args, source, probe=probe, edits=edits)
    sys.stdout.flush()
    session = recorded.session
    if session is None:
        if recorded.status == INTERRUPTED:  # Ctrl-C before the program's import of CuPy or torch ended
            print("streamcheck: interrupted (Ctrl-C) before the program imported CuPy or torch; nothing was "
                  "recorded, nothing written", file=sys.stderr)
        else:
            print("streamcheck: the program imported neither CuPy nor torch; nothing was recorded", file=sys.stderr)
        return recorded.status
    print_report(args, session, probe)
    verdicts = confirm_races(args, session)
    sync_audit = audit_syncs(args, session) if probe is None else None
    proof = prove_audit(args, sync_audit, session.races)
    write_outputs(args, session, verdicts, sync_audit, proof, edits)
    return exit_status(args, session, recorded.status)


def _with_native_guard() -> None:
    """The sim's autograd needs the native CUDA guard loaded before torch: this process re-execs
    itself with it preloaded (built once, cached), unless it has it. Where it cannot be had, the
    run goes on, and a backward() is refused in one line that says why."""
    from ..emulation import native

    native.reexec_with_library(native.python_argv())


def _run_on_sim(args) -> int:
    """The same pipeline with the sim's stages: the sequential reference, then its schedules; one
    limit (--timeout) for all their runs."""
    from . import run_sim

    with _memory_capacity(args.memory_capacity):
        return _sim_pipeline(args, run_sim)


@contextlib.contextmanager
def _memory_capacity(capacity):
    """--memory-capacity for every run of the script (the reference, its schedules, the reruns): each
    emulation reads it from STREAMCHECK_MEMORY_CAPACITY; the previous value comes back after."""
    from ..emulation.memory_stats import CAPACITY_ENV

    previous = os.environ.get(CAPACITY_ENV)
    if capacity is not None:
        os.environ[CAPACITY_ENV] = str(capacity)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(CAPACITY_ENV, None)
        else:
            os.environ[CAPACITY_ENV] = previous


def _sim_pipeline(args, run_sim) -> int:
    """One limit (--timeout) for all the runs. Past it, what was recorded is still reported and written."""
    from ..timeout import Deadline, RunTimedOut, TimeLimit

    progress = run_sim.Progress(Deadline(args.timeout), args.schedules)
    status, session, reference = run_sim.record_on_sim(args, progress)
    if session is None:  # a surface the sim does not model: said in one line
        return status
    print_report(args, session, None, sim=True)
    outcomes = [] if progress.timed_out else run_sim.compare_schedules(args, reference, progress)
    verdicts, proof = [], None
    if not progress.timed_out:
        stage = "the --confirm reruns"
        try:
            with TimeLimit(progress.deadline.remaining()):
                verdicts = run_sim.confirm_races_on_sim(args, session) if args.confirm and session.races else []
                print_verdicts(verdicts)
                if args.prove:
                    progress.finished.append("the --confirm reruns")
                    stage = "the --prove reruns"
                    proof = run_sim.prove_on_sim(args)
        except RunTimedOut:
            progress.report_timeout(stage)
    sync_audit = audit_syncs(args, session)
    write_outputs(args, session, verdicts, sync_audit, proof, None)
    status = exit_status(args, session, status)
    if progress.timed_out:
        return TIMED_OUT
    if progress.unmatched:  # a misspelt --delay-stream / --delay-kernel: a usage error, said above
        return 2
    if any(o.difference for o in outcomes) and args.error_exitcode is not None:
        return args.error_exitcode
    return status


# Before the run: every usage problem is found before the script starts.

def _read_script(script: str) -> bytes:
    if os.path.isdir(script):
        raise _Refused(f"{script} is a directory, not a Python script; give the script's path, e.g. "
                       f"streamcheck run {os.path.join(script, 'main.py')}")
    try:
        with open(script, "rb") as f:
            return f.read()
    except OSError as exc:
        # What `python script.py` says and returns for a file it cannot open.
        raise _Refused(f"can't open file {os.path.abspath(script)!r}: [Errno {exc.errno}] {exc.strerror}") from None


def _choose_backend(args) -> tuple:
    """("gpu" or "sim", the line that says why, printed once usage is checked). auto: the GPU
    where there is one, else the sim; None when there is no GPU and --skip-without-gpu asks to
    skip. Raises _Refused for --backend gpu without a GPU."""
    if args.backend == "sim":
        return "sim", ""
    if args.confirm_probe is not None or args.skip_syncs is not None or args.time_script:
        return "gpu", ""  # a rerun of a GPU run's --confirm or --prove
    if _gpu_here():
        return "gpu", ""
    if args.skip_without_gpu:
        return None, (f"streamcheck run: skipped {args.script}: no GPU here (no CUDA device, or neither CuPy nor a "
                      "CUDA build of torch installed); --skip-without-gpu exits 0")
    if args.backend == "gpu":
        return "gpu", ""  # refused once usage is checked (_require_gpu)
    return "sim", ("streamcheck run: no GPU here: running on the sim (CUDA emulated on the CPU); --backend gpu "
                   "requires a GPU")


def _gpu_here() -> bool:
    from ..record.gpu import cuda_device_present, gpu_library_installed

    return cuda_device_present() and gpu_library_installed()


def _require_gpu(args) -> None:
    if not _gpu_here():
        raise _Refused("--backend gpu needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]') or a CUDA build "
                       "of torch; none found here (no CUDA device, or neither library installed). --backend sim runs "
                       "torch programs on the CPU with CUDA emulated." +
                       (" --confirm reruns the script on the GPU, so it needs one too." if args.confirm else ""))


_GPU_ONLY = (("delay_us", "--delay-us", "delays on the sim are host steps: --delay-steps N"),
             ("confirm_probe", "--confirm-probe", ""), ("skip_syncs", "--skip-syncs", ""),
             ("time_script", "--time-script", ""), ("no_warm_up", "--no-warm-up", "the sim needs no warm-up"))
_RERUNS = ("reruns the script under sim schedules; add --backend sim (on a GPU, make races strike with "
           "--delay-stream / --delay-us)")
_SIM_ONLY = (("schedules", "--schedules", _RERUNS), ("policy", "--policy", _RERUNS),
             ("timeout", "--timeout", "bounds the sim's runs; on a GPU the script runs as `python script.py` would, "
                                      "without a limit (add --backend sim, or bound the job itself)"))


def _check_backend_options(args, backend: str) -> None:
    if backend == "sim":
        for attr, option, instead in _GPU_ONLY:
            if getattr(args, attr):
                raise _Refused(f"{option} is for the GPU backend, not the sim" + (f"; {instead}" if instead else ""))
        if args.schedules is None:
            args.schedules = DEFAULT_SCHEDULES
        if args.policy is None:
            from .run_sim import POLICIES

            args.policy = POLICIES
        if args.timeout is None:
            args.timeout = DEFAULT_TIMEOUT
        if "all" in args.delay_stream:
            raise _Refused("--delay-stream all is the GPU's; the sim's delay holds the streams named (s1, s2, ..., "
                           "legacy) or, with none named, the ones the seed picks")
        return
    for attr, option, why in _SIM_ONLY:
        if getattr(args, attr) is not None:
            raise _Refused(f"{option} {why}")
    if args.devices != 1:
        raise _Refused("--devices sets how many devices the sim emulates; on a GPU the script sees the machine's")
    if args.memory_capacity is not None:
        raise _Refused("--memory-capacity sets the memory of the sim's emulated devices; on a GPU the script has the "
                       "device's")


def _check_usage(args, backend: Optional[str]):
    """(probe, edits): the rerun modes' inputs, each None outside its mode; raises _Refused."""
    if backend is not None:
        _check_backend_options(args, backend)
    if args.confirm_max is not None and not args.confirm:
        raise _Refused("--confirm-max limits --confirm; add --confirm (or drop --confirm-max)")
    missing = [path for path in args.library if not os.path.exists(path)]
    if missing:
        raise _Refused(f"--library {missing[0]}: no such file or directory; give your wrappers' directory or file")
    probe = _confirmation_rerun(args)
    if args.prove and not args.audit_syncs:
        raise _Refused("--prove proves the sync audit's minimal set; add --audit-syncs")
    edits = _proof_rerun(args)
    problem = (timeline_problem(args.timeline) or output_problem("--trace", args.trace, "race.json")
               or output_problem("--json", args.json, "races.json") or output_problem("--ops-json", args.ops_json,
                                                                                        "ops.json"))
    if problem:
        raise _Refused(problem)
    return probe, edits


# The rerun modes: a run that is one rerun of another's --confirm or --prove.

def _confirmation_rerun(args):
    """--confirm-probe JSON (one rerun of --confirm, its replay line): the Probe this recording runs."""
    if args.confirm_probe is None:
        return None
    from ..proofs import confirm_gpu

    try:
        probe = confirm_gpu.Probe(confirm_gpu.ProbeSpec.from_json(args.confirm_probe))
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if args.delay_us or args.confirm:
        raise _Refused("--confirm-probe is one confirmation rerun: nothing else is delayed in it, and it confirms "
                       "nothing itself; drop --delay-us and --confirm")
    return probe


def _proof_rerun(args):
    """--skip-syncs JSON (one rerun of --prove): the synchronizations this recording skips."""
    if args.skip_syncs is None:
        return None
    from ..analyses.sync_audit import SyncEdits

    try:
        return SyncEdits.from_json(args.skip_syncs)
    except ValueError as exc:
        raise _Refused(str(exc)) from None


def _finish_confirmation_rerun(probe, session) -> None:
    """What the probe saw, written for the run that asked for this rerun, and its one line."""
    from ..proofs import confirm_gpu

    result = probe.result(session.races)
    confirm_gpu.write_result(result)
    print(confirm_gpu.probe_line(result), file=sys.stderr)


# The recording stage: a function that runs the script and returns Recorded.

@dataclass(frozen=True)
class Recorded:
    """What a recording stage returns: the script's own exit status, and its recording (None when
    the script imported no library that records). The recording answers what the later stages
    ask: races, trace, checker, findings, errors, refused, unpatched, libraries, summary(), report()."""

    status: int
    session: Optional[object]


def record_on_gpu(args, source: bytes, probe=None, edits=None) -> Recorded:
    """The script on the GPU, recorded by instrument() from its import of CuPy or torch on (CuPy
    reads its environment then), with the delays asked for and a rerun mode's probe or edits."""
    from ..core.trace import set_site_settings, site_settings
    from ..record import instrument

    sites_before = set_site_settings(replace(site_settings(), libraries=tuple(args.library)))
    span = _ScriptSpan() if args.time_script else None
    hook = instrument.StartAtImport(delay_us=args.delay_us, delay_streams=args.delay_stream,
                                    delay_kernels=args.delay_kernel, seed=args.seed, warm_up=not args.no_warm_up,
                                    probe=probe, edits=edits, on_start=span.begin if span else None,
                                    strict_free=args.strict_free)

    def print_span():
        if span is not None and span.started:
            print(f"{span.prefix}{span.stop():.1f} us", file=sys.stderr)

    def stop_recording():
        hook.remove()
        instrument.stop()
        set_site_settings(sites_before)

    status = run_as_main(source, args.script, args.args, stop_recording, after_script=print_span)
    return Recorded(status, hook.session)


def run_as_main(source: bytes, script: str, script_args, stop_recording, after_script=None) -> int:
    """Run the script in this process as `python script.py args...` would (module `__main__`,
    sys.argv and sys.path[0] alike, STREAMCHECK_RUN=1) and return its exit status.
    `stop_recording` runs before the script's globals are released, so their frees are not
    recorded; `after_script` right after its last line, before its threads are joined."""
    before = set(threading.enumerate())
    saved_argv, saved_path0, saved_main = sys.argv, sys.path[0] if sys.path else None, sys.modules.get("__main__")
    os.environ["STREAMCHECK_RUN"] = "1"
    sys.argv = [script] + list(script_args)
    if sys.path:
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    # Our own module object rather than runpy.run_path: the script's globals (and the arrays
    # they hold) must outlive the recording, or tearing them down would record frees that
    # the program never issued.
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=builtins, __cached__=None)
    sys.modules["__main__"] = main
    status = 0
    failure = None  # keeps the failing frames (and their arrays) alive until recording stopped
    try:
        code = compile(source, script, "exec", dont_inherit=True)
        exec(code, main.__dict__)
        if after_script is not None:
            after_script()
        # Like interpreter exit: wait for the script's non-daemon threads before the report.
        for thread in set(threading.enumerate()) - before:
            if not thread.daemon and thread is not threading.current_thread():
                thread.join()
    except SystemExit as exc:
        status = exit_status_of(exc.code)
    except BaseException as exc:  # the script's own error: its traceback and status, plus our report
        _print_script_traceback(exc, script)
        status = INTERRUPTED if isinstance(exc, KeyboardInterrupt) else 1
        failure = exc
    finally:
        stop_recording()
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        os.environ.pop("STREAMCHECK_RUN", None)
    del main, failure  # the script's arrays are freed after recording stopped
    return status


# After the recording: one function per stage.

def print_report(args, session, probe, sim: bool = False) -> None:
    """The recording's summary, what was not intercepted, the race report; then a confirmation
    rerun's verdict, or how to make the races strike."""
    print(session.summary(), file=sys.stderr)
    from ..core.fast import handover_notice, notice
    # One line each, only where the Python checker stands in for the native one: from the start, or midway.
    for line in (notice(), handover_notice(getattr(session, "checker", None))):
        if line:
            print(line, file=sys.stderr)
    for problem in session.unpatched:
        print(f"streamcheck: not intercepted: {problem}", file=sys.stderr)
    print(session.report(width=report_width(sys.stderr)), file=sys.stderr)
    if sim:
        if session.races and not args.confirm:
            print(f"streamcheck: to make them strike, the schedules rerun the script ({args.schedules} now; "
                  "--schedules N); --confirm holds each race's first access until its second ran",
                  file=sys.stderr)
        return
    if probe is not None:
        _finish_confirmation_rerun(probe, session)
    elif session.races and args.delay_us == 0 and not args.confirm:
        for line in strike_hints(session.races, args.seed, args.script, args.args):
            print(line, file=sys.stderr)


def confirm_races(args, session) -> list:
    """--confirm: each distinct race's verdict from reruns of the script (docs/confirm.md)."""
    races = session.races
    if not (args.confirm and races):
        return []
    from ..proofs import confirm_gpu

    limit = confirm_gpu.MAX_RACES if args.confirm_max is None else args.confirm_max
    print(f"streamcheck: confirming {min(len(races), limit)} of {len(races)} race(s): the script rerun with a "
          "delay before each race's first access (again if a rerun says what to change)", file=sys.stderr)
    verdicts = confirm_gpu.confirm_races(session.checker, session.trace, races, args.script, args.args,
                                         seed=args.seed, warm_up=not args.no_warm_up, max_races=limit)
    print_verdicts(verdicts)
    return verdicts


def print_verdicts(verdicts) -> None:
    """One line per confirmed race, on the GPU and on the sim alike."""
    for i, verdict in enumerate(verdicts, 1):
        race = verdict.race
        print(f"streamcheck: race {i} ({race.kind} on `{race.buffer}`, {race.first.site} -> {race.second.site}): "
              f"{verdict.format()}", file=sys.stderr)


def audit_syncs(args, session):
    """--audit-syncs: the sync audit of the recorded trace (docs/sync-audit.md), or None."""
    if not args.audit_syncs:
        return None
    from ..analyses.sync_audit import audit

    result = audit(session.trace)
    print(result.format(width=report_width(sys.stderr)), file=sys.stderr)
    return result


def prove_audit(args, sync_audit, races):
    """--prove: the audit's minimal set proven by reruns of the script without the removable
    synchronizations, or None."""
    if not args.prove or sync_audit is None:
        return None
    from ..proofs import sync_proof_gpu

    print("streamcheck: proving the audit's minimal set: the script rerun with the removable synchronizations "
          "skipped, under delays, then timed", file=sys.stderr)
    proof = sync_proof_gpu.prove(sync_audit, races, args.script, args.args, seed=args.seed)
    print(proof.format(), file=sys.stderr)
    return proof


def write_outputs(args, session, verdicts, sync_audit, proof, edits) -> None:
    """--json, --ops-json, --trace and --timeline."""
    races = session.races
    if args.json:
        _write_json(args.json, races, verdicts, sync_audit, proof, edits, getattr(session, "hazards", []))
    if args.ops_json:
        write_text(args.ops_json, session.trace.to_json())
    if sync_audit is not None and args.trace:
        # The audit is about the whole run: its trace, with the removable synchronizations marked.
        from ..pictures.export import write_chrome_trace
        from ..pictures.timeline_model import build_model

        write_chrome_trace(build_model({"trace": session.trace, "races": races}), args.trace, audit=sync_audit)
        print(f"streamcheck: Perfetto trace of the whole run, removable synchronizations marked: {args.trace} "
              "(open in https://ui.perfetto.dev)", file=sys.stderr)
        if args.timeline:
            draw_races(session, races, None, args.timeline)
    elif args.trace or args.timeline:
        draw_races(session, races, args.trace, args.timeline)


def _write_json(path: str, races, verdicts, sync_audit, proof, edits, hazards=()) -> None:
    import json

    data = [race.to_dict() for race in races]  # core.hb.reports_to_json's entries
    for entry, verdict in zip(data, verdicts):  # each gains what its confirmation found
        entry["confirmation"] = verdict.to_dict()
    if sync_audit is not None or edits is not None or hazards:  # one report: the races, then the rest
        data = {"races": data}
        if hazards:  # frees with a pending use that nothing reused (core.hb.Hazard)
            data["hazards"] = [hazard.to_dict() for hazard in hazards]
        if sync_audit is not None:
            data["sync_audit"] = sync_audit.to_dict()
        if proof is not None:
            data["sync_proof"] = proof.to_dict()
        if edits is not None:  # what this rerun of --prove could skip, and whether it took the same path
            data["skip_syncs"] = {"unskipped": sorted(map(str, edits.unskipped)), "same_path": edits.every_edit_met,
                                  "differences": [[str(key), got, recorded]
                                                  for key, got, recorded in edits.edit_differences()]}
    if path == STDOUT:
        print(json.dumps(data, indent=2))
    else:
        write_text(path, json.dumps(data, indent=2))  # whole or absent, even if killed


def exit_status(args, session, status: int) -> int:
    """INTERNAL_ERROR after the recorder's own errors (each printed), --error-exitcode's when
    something was found, else the script's own."""
    if session.errors:
        for line in internal_error_lines(session):
            print(line, file=sys.stderr)
        return INTERNAL_ERROR
    if session.findings and args.error_exitcode is not None:  # races and refused captures
        return args.error_exitcode
    return status


def draw_races(session, races, trace: str = None, timeline: str = None) -> None:
    """--trace (Perfetto) and --timeline (PNG) of the racing pairs, each with the operations around
    it: a whole program's run is too long to draw, and its pictures are about the missing wait."""
    if not races:
        print("streamcheck: no race, so no --trace or --timeline was written (they draw racing pairs)",
              file=sys.stderr)
        return
    from ..pictures.timeline_model import around_races, build_model

    model = around_races(build_model({"trace": session.trace, "races": races,
                                      "backend": "+".join(sorted(getattr(session, "libraries", ()))) or "gpu"}))
    shown = f"{len(races)} racing pair{'s' if len(races) != 1 else ''} and the operations around them"
    if trace:
        from ..pictures.export import write_chrome_trace

        write_chrome_trace(model, trace)
        print(f"streamcheck: Perfetto trace of {shown}: {trace} (open in https://ui.perfetto.dev)", file=sys.stderr)
    if timeline:
        from ..pictures.timeline import render_timeline

        path = timeline_file(timeline)
        render_timeline(model, path)
        print(f"streamcheck: timeline of {shown}: {path}", file=sys.stderr)


def internal_error_lines(session) -> list:
    """Each internal error of the recording, and each record the checker refused (the recorder
    keeps them, as the plugin's streamcheck_gpu shows them): what to send with a bug report."""
    lines = [f"streamcheck: internal error: {error}" for error in session.errors]
    lines.extend(f"streamcheck: refused record #{index}: {op!r} ({exc})" for index, op, exc in session.refused)
    lines.append(f"streamcheck: the check is incomplete (a refused record can hide a race): exit status "
                 f"{INTERNAL_ERROR}; please report it with the lines above")
    return lines
