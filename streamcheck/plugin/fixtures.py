"""The fixtures (streamcheck_seed, streamcheck_device, run_schedules, streamcheck_gpu) and the
@pytest.mark.streamcheck marker that overrides the options for one test.

The device API is imported inside the fixtures, so a plain `pytest` run pays nothing for it.
"""
from __future__ import annotations

import inspect
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pytest

from .options import (CHECK_MODES, POLICIES, SETTINGS_KEY, Settings, backend_name, bad_value, parse_policies,
                      parse_timeout)
from .reporting import (EXCEPTION_MARGIN, EXCEPTION_NAME, ScheduleFailure, confirmation_text, describe_schedule,
                        failure_text, findings, format_races, strike_hint, terminal_width, trace_note, write_trace)
from .results import compare
from .seeds import ScheduleSpec, base_seed, per_test_seed, replay_command, schedule_specs


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line(
        "markers",
        "streamcheck(schedules=N, policies='delay,random', check='on', timeout=SECONDS): override the "
        "streamcheck options for this test")


@dataclass(frozen=True)
class _TestConfig:
    """Settings for one test: the options overridden by its marker."""

    schedules: int
    policies: tuple
    check: str
    timeout: float


def _test_config(item, settings: Settings) -> _TestConfig:
    """The test's settings; a bad marker fails the test in one line, as a bad option stops the run."""
    __tracebackhide__ = True
    try:
        return _marker_config(item, settings)
    except pytest.UsageError as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)  # outside the except: no "during handling" chain


def _marker_config(item, settings: Settings) -> _TestConfig:
    schedules, policies, check, timeout = settings.schedules, settings.policies, settings.check, settings.timeout
    marker = item.get_closest_marker("streamcheck")
    if marker is not None:
        if marker.args:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.streamcheck takes keywords only "
                                    "(schedules=, policies=, check=, timeout=)")
        unknown = set(marker.kwargs) - {"schedules", "policies", "check", "timeout"}
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.streamcheck got unknown keywords "
                                    f"{sorted(unknown)}; accepted: schedules, policies, check, timeout")
        source = f"@pytest.mark.streamcheck on {item.nodeid}:"
        if "schedules" in marker.kwargs:
            schedules = marker.kwargs["schedules"]
            if isinstance(schedules, bool) or not isinstance(schedules, int) or schedules < 1:
                raise bad_value(f"{source} schedules", str(schedules), "an integer >= 1")
        if "policies" in marker.kwargs:
            value = marker.kwargs["policies"]
            names = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
            accepted = f"a comma-separated string or a list of {', '.join(POLICIES)}"
            if names is None or not all(isinstance(name, str) for name in names):
                raise bad_value(f"{source} policies", str(value), accepted)
            policies = parse_policies(",".join(names), f"{source} policies")
        if "check" in marker.kwargs:
            value = marker.kwargs["check"]
            check = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
            if not isinstance(check, str) or check not in CHECK_MODES:
                raise bad_value(f"{source} check", str(value), ", ".join(CHECK_MODES))
        if "timeout" in marker.kwargs:
            value = marker.kwargs["timeout"]
            timeout = parse_timeout("" if isinstance(value, bool) else str(value), f"{source} timeout")
    return _TestConfig(schedules, policies, check, timeout)


def _policy_params(policy: str, backend: str, settings: Settings) -> dict:
    if backend == "cupy":
        return {"delay_us": settings.delay_us} if policy in ("delay", "pct") else {}
    return {"steps": settings.delay_steps} if policy == "delay" else {}


def _make_device(config, spec: ScheduleSpec, check: str, sim: bool = False):
    """The device of one run; `sim`: always the sim (a torch program runs with CUDA emulated there)."""
    from ..device import Device

    backend = "sim" if sim else backend_name(config)
    settings = config.stash[SETTINGS_KEY]
    return Device(backend, check=check != "off", policy=spec.policy, seed=spec.seed, strict_free=settings.strict_free,
                  **_policy_params(spec.policy, backend, settings))


@pytest.fixture
def streamcheck_seed(request) -> int:
    """This test's seed: base seed + crc32(node id)."""
    return per_test_seed(base_seed(request.config), request.node.nodeid)


@pytest.fixture
def streamcheck_device(request, streamcheck_seed):
    """A Device on the chosen backend, running the first policy's first schedule of this test.
    With check on, a race the checker finds fails the test even if every value was right; a
    device thread (Device.thread) that raised fails it at teardown."""
    from ..device import DeviceThread

    config = request.config
    settings = config.stash[SETTINGS_KEY]
    tconf = _test_config(request.node, settings)
    spec = schedule_specs(streamcheck_seed, tconf.policies, 1, settings.replay)[0]
    device = _make_device(config, spec, tconf.check)
    found = findings(request.node)
    found.device, found.spec, found.check = device, spec, tconf.check
    found.schedules += 1
    found.replay = replay_command(config, request.node.nodeid, spec)
    yield device
    found.add_races(device.races)
    raised = DeviceThread.raised(device)
    if raised:
        pytest.fail(f"streamcheck: {_threads_raised(raised)}\n  replay: {found.replay}", pytrace=False)


@pytest.fixture
def streamcheck_gpu(request, streamcheck_seed):
    """Record and check the test's own GPU work — CuPy, torch, Triton, unmodified — with
    streamcheck.instrument(), and fail the test on a race or a capture CUDA refuses, with the
    report and the replay line. When the test's policies include `delay`, seed-chosen streams
    get a bounded spin of --streamcheck-delay-us before each launch, so races strike.
    Yields the recording (streamcheck.instrument.Session).
    Without a GPU (or with --streamcheck-backend=sim) the test's torch code runs with CUDA
    emulated on the sim instead (docs/emulation.md), under its first schedule; it yields that
    recording (emulation.recording.EmulatedRecording), and a race fails the test the same way.
    --streamcheck-backend=cupy requires the GPU."""
    from ..record import gpu

    config = request.config
    settings = config.stash[SETTINGS_KEY]
    if settings.backend == "sim" or settings.emulate_cuda or (settings.backend == "auto" and
                                                              not gpu.cuda_device_present()):
        yield start_emulation(request.node)  # left after the test's teardown (plugin/emulation.py)
        return
    if not gpu.cuda_device_present():
        pytest.skip("streamcheck_gpu with --streamcheck-backend=cupy needs an NVIDIA GPU with CuPy or a CUDA build "
                    "of torch (none found here); --streamcheck-backend=sim (or auto) runs its torch code on the "
                    "CPU with CUDA emulated")
    from ..record import instrument

    tconf = _test_config(request.node, settings)
    delay_us = float(settings.delay_us) if "delay" in tconf.policies else 0.0
    found = findings(request.node)
    found.schedules += 1
    found.check = tconf.check
    found.replay = replay_command(config, request.node.nodeid, None)
    session = found.recording = instrument.start(delay_us=delay_us, seed=streamcheck_seed,
                                                 strict_free=settings.strict_free)
    try:
        yield session
    finally:
        instrument.stop()
    problems = []
    if session.capture_errors:
        from ..record.recorder import format_capture_errors

        problems.append(format_capture_errors(session.capture_errors))
    if session.errors:  # a record the checker refused is a hole in the trace, where a race can hide
        problems.append(f"streamcheck: {len(session.errors)} internal error{'s' if len(session.errors) != 1 else ''} "
                        "of the recorder: the trace is incomplete, so the check is too")
        problems.extend(f"  {error}" for error in session.errors)
        problems.extend(f"  refused record #{index}: {op!r}" for index, op, _ in session.refused)
    if problems:
        pytest.fail("\n".join(problems) + f"\nreplay: {found.replay}", pytrace=False)


# --- tests' torch code with CUDA emulated on the sim (plugin/emulation.py's hooks, streamcheck_gpu) ---

RAISED_KEY = pytest.StashKey[BaseException]()  # what an emulated test raised in its call (plugin/emulation.py)
EMULATION_KEY = pytest.StashKey[object]()  # the test's (Emulation, EmulatedRecording, fallback, session's?) while it runs
SESSION_EMULATION_KEY = pytest.StashKey[object]()  # --streamcheck-emulate-cuda: the Emulation of the whole run


def start_session_emulation(config) -> None:
    """The emulation for the whole run, from pytest_configure on: collection (module-level code,
    skipif conditions) runs on an emulated device too, sequentially and unchecked; each test then
    gets a fresh device (start_emulation)."""
    from ..device import Device
    from ..emulation.torch_cuda import Emulation

    settings = config.stash[SETTINGS_KEY]
    emulation = Emulation(Device("sim", check=False, policy="sequential"), memory_capacity=settings.memory_capacity)
    emulation.__enter__()
    config.stash[SESSION_EMULATION_KEY] = emulation
    config.add_cleanup(lambda: emulation.__exit__(None, None, None))


def start_emulation(item):
    """Start the test's emulated run (once): the session's emulation reset to a fresh device, or a
    new emulation entered for the test. Returns its EmulatedRecording."""
    running = item.stash.get(EMULATION_KEY, None)
    if running is not None:
        return running[1]
    from ..emulation.recording import EmulatedRecording
    from ..emulation.torch_cuda import Emulation

    config = item.config
    settings = config.stash[SETTINGS_KEY]
    tconf = _test_config(item, settings)
    seed = per_test_seed(base_seed(config), item.nodeid)
    spec = schedule_specs(seed, tconf.policies, 1, settings.replay)[0]
    device = _make_device(config, spec, tconf.check, sim=True)
    session = config.stash.get(SESSION_EMULATION_KEY, None)
    if session is not None:
        emulation = session
        emulation.reset(device)
    else:
        emulation = Emulation(device, memory_capacity=settings.memory_capacity)
        emulation.__enter__()
    recording = EmulatedRecording(device, emulation, "the test's torch code")
    fallback = _test_site(item)
    if fallback is not None:
        fallback.__enter__()
    item.stash[EMULATION_KEY] = (emulation, recording, fallback, session is not None)
    found = findings(item)
    found.recording, found.spec, found.check = recording, spec, tconf.check
    found.schedules += 1
    found.replay = replay_command(config, item.nodeid, spec)
    return recording


def stop_emulation(item, finish: bool = True) -> None:
    """End the test's emulated run, if it started one; a capture CUDA refused fails the test. The
    session's emulation stays, its device's pending work done (`finish`: not after a timeout, whose
    interrupt may have left the device half-way) so the tensors that outlive the test hold their values."""
    running = item.stash.get(EMULATION_KEY, None)
    if running is None:
        return
    del item.stash[EMULATION_KEY]
    emulation, recording, fallback, session = running
    try:
        if not session:
            emulation.__exit__(None, None, None)
        elif finish:
            emulation.finish()
    finally:
        if fallback is not None:
            fallback.__exit__(None, None, None)
    if emulation.threads.refusals:  # refused in a host thread of the test: one line, as in the test's own
        pytest.fail(f"{emulation.threads.refusals[0]}\nreplay: {findings(item).replay}", pytrace=False)
    # A capture error the test's call raised (the program got torch's exception and did not catch it)
    # failed the test already: counted once, not again as a teardown error.
    raised = getattr(item.stash.get(RAISED_KEY, None), "capture_error", None)
    errors = [error for error in recording.capture_errors if raised is None or str(error) != str(raised)]
    if errors:
        from ..record.recorder import format_capture_errors

        pytest.fail(f"{format_capture_errors(errors)}\nreplay: {findings(item).replay}", pytrace=False)


def _test_site(item):
    """What a call with no test frame on its stack is attributed to: the test function (its
    tensors freed as it returns, under pytest's frames)."""
    from ..core.trace import CallSite
    from ..device.objects import caller_site

    code = getattr(getattr(item, "function", None), "__code__", None)
    if code is None:
        return None
    return caller_site.fallback(CallSite(code.co_filename, code.co_firstlineno, code.co_name))


@dataclass(frozen=True)
class ScheduleResult:
    spec: ScheduleSpec
    schedule: str  # the policy with its parameters and the decisions taken ("" where not recorded)
    matches: bool


@dataclass(frozen=True)
class ScheduleRun:
    """What run_schedules saw: the sequential reference, one entry per schedule, the races."""

    reference: Any
    results: tuple
    races: tuple

    @property
    def wrong(self) -> tuple:
        return tuple(r for r in self.results if not r.matches)


@pytest.fixture
def run_schedules(request, streamcheck_seed):
    """`run_schedules(fn, atol=0, rtol=0)`: run `fn(device) -> result` once on a sequential
    device (the reference), then under each schedule; fail on a differing result or (check
    on) on races, with the race report, the schedule and the command that replays it.
    `fn()` with no argument is a torch program: it runs with CUDA emulated on each run's sim
    device (docs/emulation.md) and returns tensors, compared as the host reads them (`.cpu()`)."""
    config = request.config
    item = request.node

    def run(fn: Callable, *, atol: float = 0.0, rtol: float = 0.0, schedules: Optional[int] = None,
            policies: Optional[Sequence[str]] = None, check: Optional[str] = None) -> ScheduleRun:
        __tracebackhide__ = True  # the failure is the message, not this frame
        from ..device.objects import caller_site
        from ..emulation.recording import takes_no_arguments

        returned_at = caller_site()  # the user's run_schedules(...) line: where the host takes the result
        if takes_no_arguments(fn):  # a torch program: each run under CUDA emulated on the run's sim device
            from ..emulation.recording import torch_program

            fn = torch_program(fn, returned_at)
        settings = config.stash[SETTINGS_KEY]
        tconf = _test_config(item, settings)
        count = schedules if schedules is not None else tconf.schedules
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:  # as the marker refuses it
            raise bad_value("run_schedules(schedules=...)", str(count), "an integer >= 1")
        names = parse_policies(",".join(policies), "run_schedules(policies=...)") if policies else tconf.policies
        check_mode = check if check is not None else tconf.check
        if check_mode not in CHECK_MODES:
            raise bad_value("run_schedules(check=...)", str(check_mode), ", ".join(CHECK_MODES))
        found = findings(item)
        found.check = check_mode

        from ..timeout import Deadline

        width = terminal_width(config) - EXCEPTION_MARGIN
        # One limit for the reference and every schedule together (and the confirmations after them).
        limit = _Limit(Deadline(tconf.timeout), count)
        reference_spec = ScheduleSpec("sequential", 0, streamcheck_seed)
        ref_device, reference = _run_one(fn, reference_spec, check_mode, limit, item, None, width, returned_at)
        if isinstance(reference, Iterator):
            # Its body would run only when compared, after its schedule ended: every schedule "wrong".
            what = "a generator" if inspect.isgenerator(reference) else f"an iterator ({type(reference).__name__})"
            raise TypeError(f"streamcheck: run_schedules: the program returned {what}, which runs only when "
                            "iterated, after its schedule; return a list of it (return list(...))")
        handle = _device_handle(reference)
        if handle:  # each schedule's device has its own buffers: they never compare equal, whatever they hold
            raise TypeError(f"streamcheck: run_schedules: the program returned {handle}, a handle to device memory, "
                            "not its values; return dev.get(buffer) or dev.host_read(buffer) after a synchronize")
        found.add_races(ref_device.races)
        if settings.audit_syncs:
            from ..analyses.sync_audit import audit

            found.sync_audit = audit(ref_device.trace)

        results, first_wrong, first_device = [], None, None
        for spec in schedule_specs(streamcheck_seed, names, count, settings.replay):
            found.schedules += 1  # counted before it runs: a schedule that raises ran too
            device, got = _run_one(fn, spec, check_mode, limit, item, len(results), width, returned_at)
            found.add_races(device.races)
            diff = compare(reference, got, atol=atol, rtol=rtol)
            schedule = describe_schedule(spec, device)
            results.append(ScheduleResult(spec, schedule, diff is None))
            if first_device is None:
                first_device = device
            if diff is not None and first_wrong is None:
                first_wrong = (spec, schedule, diff, device)
        wrong = sum(not r.matches for r in results)
        found.wrong += wrong
        races = tuple(found.races.values())
        outcome = ScheduleRun(reference, tuple(results), races)

        if (first_wrong is not None or (races and check_mode == "on")) and races:
            confirmed = "\n" + _confirmations(config, fn, races, streamcheck_seed, limit.deadline)
        else:
            confirmed = ""
        if first_wrong is not None:
            spec, schedule, diff, device = first_wrong
            found.schedule = schedule
            found.replay = replay_command(config, item.nodeid, spec)
            written = trace_note(write_trace(config, item.nodeid, device))
            raise ScheduleFailure(failure_text(
                f"schedule {spec.label} gave values that differ from the sequential reference "
                f"({wrong} of {len(results)} schedules wrong)",
                spec, describe_schedule(spec, device, elide=True), diff,
                (device.report() + confirmed if check_mode != "off" else "") + written, found.replay, width,
                len(EXCEPTION_NAME)))
        if races and check_mode == "on":
            # The trace files and the schedule line name the same run: the first schedule.
            spec, found.schedule = results[0].spec, results[0].schedule
            found.replay = replay_command(config, item.nodeid, spec)
            written = trace_note(write_trace(config, item.nodeid, first_device))
            matched = "in the 1 schedule" if len(results) == 1 else f"in all {len(results)} schedules"
            raise ScheduleFailure(failure_text(
                f"the happens-before checker found {len(races)} race{'s' if len(races) != 1 else ''}; "
                f"values matched the reference {matched} (the race has not struck yet)",
                spec, describe_schedule(spec, first_device, elide=True), None,
                format_races(races, config=config) + confirmed + written,
                found.replay, width, len(EXCEPTION_NAME)))
        return outcome

    return run


def _device_handle(value, path: str = "result") -> str:
    """Where a program's result holds a Buffer or Region instead of values, described ("" if nowhere)."""
    from ..device import Buffer, Region

    at = "" if path == "result" else f" at {path}"
    if isinstance(value, Buffer):
        return f"a Buffer (`{value.name}`){at}"
    if isinstance(value, Region):
        return f"a Region (`{value.buffer.name}` rows [{value.start}, {value.stop})){at}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _device_handle(item, f"{path}[{key!r}]")
        if found:
            return found
    return ""


def _on_sim(fn) -> bool:
    """A torch program (emulation.recording.torch_program) runs on the sim whatever the backend."""
    return getattr(fn, "runs_on_sim", False)


def _confirmations(config, fn, races, seed: int, deadline) -> str:
    """The failure's confirmation section (--streamcheck-confirm), or the "to make them strike" hint.
    Its reruns (a sequential one, one per race up to MAX_RACES) get what is left of run_schedules' limit."""
    on_sim = _on_sim(fn) or backend_name(config) == "sim"  # a torch program need not resolve `auto` (cupy)
    if not config.stash[SETTINGS_KEY].confirm:
        return strike_hint(races, confirm_runs=on_sim)
    if not on_sim:
        return ("  confirmation (--streamcheck-confirm): not attempted: it runs on the sim backend "
                "(--streamcheck-backend=sim); confirming on a GPU is not built")
    from ..proofs.confirm import MAX_RACES, confirm_races
    from ..timeout import RunTimedOut, run_with_timeout

    reruns = 1 + min(len(races), MAX_RACES)
    if deadline.expired:
        return f"  confirmation (--streamcheck-confirm): not attempted: run_schedules' limit of {deadline.seconds:g} s ran out"
    try:
        return confirmation_text(run_with_timeout(lambda: confirm_races(fn, races, seed=seed), deadline.remaining(),
                                                  "streamcheck confirmation"))
    except RunTimedOut:
        return (f"  confirmation (--streamcheck-confirm): not finished: its {reruns} reruns went past run_schedules' "
                f"limit of {deadline.seconds:g} s")
    except Exception as exc:  # a program that cannot run again must not hide the failure itself
        return f"  confirmation (--streamcheck-confirm): the rerun raised {type(exc).__name__}: {exc}"


class _Limit:
    """run_schedules' one limit (a timeout.Deadline) and how far its runs got, for the failure that says so."""

    def __init__(self, deadline, schedules: int):
        self.deadline, self.schedules = deadline, schedules

    def finished(self, ran: Optional[int]) -> str:
        """What finished before the run that did not (`ran`: as _run_one's)."""
        if ran is None:
            return "nothing (the sequential reference was running)"
        return f"the sequential reference, {ran} of {self.schedules} schedule{'s' if self.schedules != 1 else ''}"


def _run_one(fn, spec: ScheduleSpec, check: str, limit: _Limit, item, ran: Optional[int], width: int,
             returned_at) -> tuple:
    """(device, fn(device)) on a fresh device for `spec`, in a thread of its own, within what is left
    of `limit`. `ran`: how many schedules ran before this one (None: this is the sequential reference).
    The host then uses the result (at `returned_at`): a download in it read before its stream was
    synchronized is a race (Device.host_uses).
    A run past the limit, or one of whose program threads raised, fails with ScheduleFailure;
    the program's own exception is raised with a note naming the schedule."""
    __tracebackhide__ = True  # the program's frames are what a failure shows
    from ..device import DeviceThread
    from ..timeout import RunTimedOut, last_operation, run_with_timeout

    config = item.config
    what = "the sequential reference run" if ran is None else f"schedule {spec.label}"
    replay = replay_command(config, item.nodeid, None if ran is None else spec)
    made: dict = {}

    def one() -> tuple:
        __tracebackhide__ = True
        device = made["device"] = _make_device(config, spec, check, sim=_on_sim(fn))
        made["first"] = len(device.trace)  # what the device recorded of its own set-up is not the program's
        result = fn(device)
        device.host_uses(result, "the program's result", site=returned_at)  # in the program's host thread
        return device, result

    try:
        device, result = run_with_timeout(one, limit.deadline.remaining(), f"streamcheck {what}")
    except RunTimedOut as exc:
        last = last_operation(made["device"], made["first"]) if "first" in made else "none (no device yet)"
        findings(item).replay = replay
        state = "interrupted" if exc.interrupted else "abandoned: it is blocked in a call Python cannot interrupt"
        raise ScheduleFailure(failure_text(
            f"{what} did not finish within {limit.deadline.seconds:g} s (its thread was {state}); the limit is "
            f"--streamcheck-timeout or the streamcheck marker's timeout=, for the reference and all schedules together",
            spec, "", None, "\n".join([f"  finished: {limit.finished(ran)}", *where_it_was(exc, config),
                                       f"  last recorded operation: {last}"]),
            replay, width, len(EXCEPTION_NAME))) from None
    except Exception as exc:
        if hasattr(exc, "add_note"):  # Python 3.11+; on 3.10 the traceback alone must do
            after = ("before any schedule" if ran is None else
                     f"after {ran} schedule{'s' if ran != 1 else ''} that ran without raising")
            # Both seeds labelled: the schedule's own, and the run's one that the replay passes.
            exc.add_note(f"streamcheck: raised in {what} (schedule seed {spec.seed}, from "
                         f"--streamcheck-seed={base_seed(config)}), {after}; replay: {replay}")
        raise
    raised = DeviceThread.raised(device)
    if raised:
        findings(item).replay = replay
        headline, tracebacks = _threads_raised(raised).split("\n", 1)
        raise ScheduleFailure(failure_text(f"in {what}, {headline}", spec, describe_schedule(spec, device, elide=True),
                                           None, tracebacks, replay, width, len(EXCEPTION_NAME)))
    return device, result


def where_it_was(exc, config) -> list:
    """The lines that say where a run was when its time ran out: the user's frames (not pytest's,
    torch's or ours), innermost last, paths relative to the rootdir."""
    import os

    from ..core.trace import USER
    from ..device.objects import caller_site

    ours = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
    root = str(config.rootpath)

    def relative(path: str) -> str:
        shown = os.path.relpath(path, root)
        return path if shown.startswith(os.pardir) else shown

    frames = exc.where(lambda path: caller_site.kind_of(path) == USER and not os.path.abspath(path).startswith(ours),
                       relative)
    return ["  where it was (innermost last):", *(f"    {line}" for line in frames)] if frames else []


def _threads_raised(raised) -> str:
    """`N of the program's threads raised`, then each thread with its traceback."""
    lines = [f"{len(raised)} of the program's threads raised (Device.thread)"]
    for thread in raised:
        lines += [f"  {thread.describe()} raised:", textwrap.indent(thread.format_exception().rstrip(), "    ")]
    return "\n".join(lines)
