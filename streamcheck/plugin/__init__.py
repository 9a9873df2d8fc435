"""pytest plugin: seeded schedules, injected delays and happens-before checking in tests.

Registered through the pytest11 entry point; `-p no:streamcheck` removes all of it.
Loading it imports neither cupy nor torch (nor the device API): those are imported
inside the fixtures, so a plain `pytest` run pays nothing for them.

Seeds: one base seed per run (random unless given; `last` is the previous run's,
kept in pytest's cache), and per test `base + crc32(node id)`, so a test's seed does
not depend on which other tests were selected (-k) or which xdist worker runs it.
Under xdist the controller draws the base seed and hands it to the workers.
"""
from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import textwrap
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import pytest

POLICIES = ("sequential", "eager", "delay", "random", "pct")
BACKENDS = ("auto", "sim", "cupy")
CHECK_MODES = ("on", "warn", "off")  # on: races fail the test; warn: only reported; off: no checker
SEED_MOD = 2**32
CACHE_KEY = "streamcheck/seed"
WORKER_KEY = "streamcheck_seed"  # in xdist's workerinput
WORKER_WIDTH_KEY = "streamcheck_width"  # the controller's terminal width: workers' reports print there


@dataclass(frozen=True)
class Settings:
    """The run's validated options."""

    seed: int
    schedules: int
    policies: tuple
    backend: str  # as asked: auto, sim or cupy (resolved lazily, see backend_name)
    delay_us: int
    delay_steps: int
    check: str
    trace_dir: Optional[str]  # absolute (see _trace_dir)
    replay: Optional[tuple]  # (policy, index): run only that schedule


@dataclass(frozen=True)
class ScheduleSpec:
    """The index-th schedule of `policy` in a test; its seed derives from the test's seed."""

    policy: str
    index: int
    seed: int

    @property
    def label(self) -> str:
        return f"{self.policy}:{self.index}"


@dataclass
class Findings:
    """What streamcheck saw in one test (kept in item.stash)."""

    races: dict = field(default_factory=dict)  # Race.key -> Race
    schedules: int = 0
    wrong: int = 0
    replay: str = ""
    schedule: str = ""  # the failing schedule with its full decisions (the message may elide them)
    device: Any = None  # the streamcheck_device fixture's device, if used
    spec: Optional[ScheduleSpec] = None  # and the schedule it runs
    check: str = "on"  # the test's check mode (option, or its marker)

    def add_races(self, races) -> None:
        for race in races:
            self.races.setdefault(race.key, race)


SETTINGS_KEY = pytest.StashKey[Settings]()
FINDINGS_KEY = pytest.StashKey[Findings]()
BACKEND_KEY = pytest.StashKey[str]()


# --- options ------------------------------------------------------------------------------

_OPTIONS = (
    # (flag, ini name, metavar, help, ini default)
    ("--streamcheck-seed", "streamcheck_seed", "N|last",
     "base seed (per-test seed = base + crc32(node id)); `last` reuses the previous run's. Default: random.", ""),
    ("--streamcheck-schedules", "streamcheck_schedules", "N", "schedules per test under run_schedules.", "8"),
    ("--streamcheck-policy", "streamcheck_policy", "P[,P...]",
     f"schedule policies, comma-separated, from: {', '.join(POLICIES)}.", "delay,random,pct"),
    ("--streamcheck-backend", "streamcheck_backend", "auto|sim|cupy",
     "device backend; auto: cupy when a GPU is present, else sim.", "auto"),
    ("--streamcheck-delay-us", "streamcheck_delay_us", "US", "cupy backend: spin delay injected by `delay`.", "200"),
    ("--streamcheck-delay-steps", "streamcheck_delay_steps", "N",
     "sim backend: host calls a delayed operation is held back.", "8"),
    ("--streamcheck-check", "streamcheck_check", "on|warn|off",
     "happens-before checking: on (races fail the test), warn (reported only), off.", "on"),
    ("--streamcheck-trace-dir", "streamcheck_trace_dir", "DIR",
     "write the trace (Perfetto JSON, PNG timeline, report) of each failing test here; relative to "
     "the directory pytest was started in (as --junitxml), in an ini file to the rootdir.", ""),
    ("--streamcheck-replay", "streamcheck_replay", "POLICY:INDEX",
     "run only that schedule of each test (as printed by a failure).", ""),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("streamcheck", "streamcheck: CUDA stream race checking")
    for flag, ini, metavar, help, default in _OPTIONS:
        group.addoption(flag, dest=ini, metavar=metavar, default=None, help=help)
        parser.addini(ini, help=f"default for {flag}: {help}", default=default)


def _raw(config, ini: str) -> tuple[str, str]:
    """The option's value and where it came from (for error messages)."""
    flag = "--" + ini.replace("_", "-")
    value = config.getoption(ini)
    if value is not None:
        return str(value).strip(), flag
    return str(config.getini(ini)).strip(), f"ini option {ini}"


def _bad(source: str, value: str, accepted: str) -> pytest.UsageError:
    return pytest.UsageError(f"streamcheck: {source}={value!r} is not valid; accepted values: {accepted}")


def _int(config, ini: str, minimum: int, accepted: str) -> int:
    value, source = _raw(config, ini)
    try:
        number = int(value)
    except ValueError:
        raise _bad(source, value, accepted) from None
    if number < minimum:
        raise _bad(source, value, accepted)
    return number


def _policies(value: str, source: str) -> tuple:
    names = tuple(p.strip() for p in value.split(",") if p.strip())
    if not names or any(p not in POLICIES for p in names):
        raise _bad(source, value, f"a comma-separated list of {', '.join(POLICIES)}")
    return names


def _seed(config) -> int:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_KEY in workerinput:
        return int(workerinput[WORKER_KEY])  # xdist worker: the controller's seed
    value, source = _raw(config, "streamcheck_seed")
    accepted = f"an integer in [0, {SEED_MOD}) or `last`"
    if value == "":
        return random.SystemRandom().randrange(SEED_MOD)
    if value == "last":
        cache = getattr(config, "cache", None)
        last = cache.get(CACHE_KEY, None) if cache is not None else None
        if not isinstance(last, int):
            raise pytest.UsageError(f"streamcheck: {source}=last, but no previous seed is stored in pytest's cache "
                                    "(first run here, cache cleared, or -p no:cacheprovider); "
                                    f"run once without it or pass {accepted}")
        return last
    try:
        seed = int(value)
    except ValueError:
        raise _bad(source, value, accepted) from None
    if not 0 <= seed < SEED_MOD:
        raise _bad(source, value, accepted)
    return seed


def _replay(value: str, source: str) -> Optional[tuple]:
    if value == "":
        return None
    policy, _, index = value.partition(":")
    if policy not in POLICIES or not index.isdigit():
        raise _bad(source, value, f"POLICY:INDEX with POLICY one of {', '.join(POLICIES)} (e.g. delay:3)")
    return policy, int(index)


def _trace_dir(config) -> Optional[str]:
    """Absolute: a relative path on the command line is taken from where pytest was started,
    as --junitxml's is; one from an ini file from the rootdir, as cache_dir's is."""
    value, source = _raw(config, "streamcheck_trace_dir")
    if not value:
        return None
    base = config.invocation_params.dir if source.startswith("--") else config.rootpath
    return os.path.normpath(os.path.join(str(base), os.path.expanduser(value)))


def _read_settings(config) -> Settings:
    backend, source = _raw(config, "streamcheck_backend")
    if backend not in BACKENDS:
        raise _bad(source, backend, ", ".join(BACKENDS))
    check, source = _raw(config, "streamcheck_check")
    if check not in CHECK_MODES:
        raise _bad(source, check, ", ".join(CHECK_MODES))
    policies = _policies(*_raw(config, "streamcheck_policy"))
    return Settings(
        seed=_seed(config),
        schedules=_int(config, "streamcheck_schedules", 1, "an integer >= 1"),
        policies=policies,
        backend=backend,
        delay_us=_int(config, "streamcheck_delay_us", 0, "an integer >= 0 (microseconds)"),
        delay_steps=_int(config, "streamcheck_delay_steps", 0, "an integer >= 0"),
        check=check,
        trace_dir=_trace_dir(config),
        replay=_replay(*_raw(config, "streamcheck_replay")),
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Runs before any pytest_configure (xdist workers call it too): our hypothesis
    # profiles must exist before hypothesis's plugin loads the one named by
    # --hypothesis-profile in its pytest_configure.
    _select_hypothesis_profile(config)


def pytest_configure(config: pytest.Config) -> None:
    # Not tryfirst: the cacheprovider (tryfirst) must have made config.cache for `last`.
    config.addinivalue_line(
        "markers",
        "streamcheck(schedules=N, policies='delay,random', check='on'): override the streamcheck options "
        "for this test")
    settings = _read_settings(config)
    if settings.backend == "cupy":
        from ..backends import gpu_available

        if not gpu_available():
            raise pytest.UsageError("streamcheck: --streamcheck-backend=cupy needs an NVIDIA GPU and CuPy "
                                    "(pip install 'streamcheck[gpu]'); none found. Use sim or auto.")
    config.stash[SETTINGS_KEY] = settings
    config.pluginmanager.register(_Summary(config), "streamcheck-summary")
    cache = getattr(config, "cache", None)
    # --co runs no test: `last` must still name the last run that did.
    if cache is not None and not hasattr(config, "workerinput") and not config.option.collectonly:
        cache.set(CACHE_KEY, settings.seed)  # for --streamcheck-seed=last next time


def _select_hypothesis_profile(config) -> None:
    """Register our profiles if the command line names one, and load the one
    STREAMCHECK_HYPOTHESIS_PROFILE names (the command line wins: hypothesis's plugin loads
    it later). Nothing else: HYPOTHESIS_PROFILE and the loaded profile are the user's."""
    from_cli = config.getoption("hypothesis_profile", None)  # None also when hypothesis's plugin is off
    env = os.environ.get("STREAMCHECK_HYPOTHESIS_PROFILE", "").strip()
    if not from_cli and not env:
        return  # nothing asked for: do not import hypothesis
    from .. import strategies

    if not from_cli:
        try:
            strategies.load_profile()
        except ValueError as exc:
            raise pytest.UsageError(f"streamcheck: {exc}") from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker uses the controller's base seed (and wraps its reports
    at the controller's terminal width, where they are printed)."""
    node.workerinput[WORKER_KEY] = node.config.stash[SETTINGS_KEY].seed
    node.workerinput[WORKER_WIDTH_KEY] = terminal_width(node.config)


def terminal_width(config) -> int:
    """Columns of the terminal the reports are printed on: pytest's TerminalWriter's (it follows
    COLUMNS and the real terminal), the controller's under xdist, else the shell's or 80."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_WIDTH_KEY in workerinput:
        return int(workerinput[WORKER_WIDTH_KEY])
    if config.pluginmanager.has_plugin("terminalreporter"):
        return config.get_terminal_writer().fullwidth
    return shutil.get_terminal_size((80, 24)).columns


def backend_name(config) -> str:
    """The backend tests run on: `auto` resolved (cached)."""
    settings = config.stash[SETTINGS_KEY]
    if settings.backend != "auto":
        return settings.backend
    resolved = config.stash.get(BACKEND_KEY, None)
    if resolved is None:
        from ..backends import resolve  # tries to import cupy: only when `auto` must be resolved

        resolved = config.stash[BACKEND_KEY] = resolve("auto")
    return resolved


def base_seed(config) -> int:
    """This run's base seed (the same on every xdist worker)."""
    return config.stash[SETTINGS_KEY].seed


def pytest_report_header(config) -> str:
    s = config.stash[SETTINGS_KEY]
    replay = f" replay={s.replay[0]}:{s.replay[1]}" if s.replay else ""
    return (f"streamcheck: backend={backend_name(config)} policy={','.join(s.policies)} schedules={s.schedules} "
            f"check={s.check}{replay} --streamcheck-seed={s.seed}")


# --- seeds and schedules ------------------------------------------------------------------


def per_test_seed(base: int, nodeid: str) -> int:
    """Per-test seed: from the name, never from run order."""
    return (base + zlib.crc32(nodeid.encode())) % SEED_MOD


def schedule_seed(test_seed: int, policy: str, index: int) -> int:
    return zlib.crc32(f"{policy}:{index}".encode(), test_seed)


def schedule_specs(test_seed: int, policies: Sequence[str], count: int,
                   replay: Optional[tuple] = None) -> list[ScheduleSpec]:
    """Round-robin over policies; the k-th schedule of a policy always gets the same seed,
    whatever the other policies or the count, so `POLICY:INDEX` names it for good."""
    if replay is not None:
        policy, index = replay
        return [ScheduleSpec(policy, index, schedule_seed(test_seed, policy, index))]
    counters = dict.fromkeys(policies, 0)
    specs = []
    for i in range(count):
        policy = policies[i % len(policies)]
        index = counters[policy]
        counters[policy] += 1
        specs.append(ScheduleSpec(policy, index, schedule_seed(test_seed, policy, index)))
    return specs


@dataclass(frozen=True)
class _TestConfig:
    """Settings for one test: the options overridden by its marker."""

    schedules: int
    policies: tuple
    check: str


def _test_config(item, settings: Settings) -> _TestConfig:
    schedules, policies, check = settings.schedules, settings.policies, settings.check
    marker = item.get_closest_marker("streamcheck")
    if marker is not None:
        if marker.args:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.streamcheck takes keywords only "
                                    "(schedules=, policies=, check=)")
        unknown = set(marker.kwargs) - {"schedules", "policies", "check"}
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.streamcheck got unknown keywords "
                                    f"{sorted(unknown)}; accepted: schedules, policies, check")
        source = f"@pytest.mark.streamcheck on {item.nodeid}:"
        if "schedules" in marker.kwargs:
            schedules = marker.kwargs["schedules"]
            if not isinstance(schedules, int) or schedules < 1:
                raise _bad(f"{source} schedules", str(schedules), "an integer >= 1")
        if "policies" in marker.kwargs:
            value = marker.kwargs["policies"]
            policies = _policies(value if isinstance(value, str) else ",".join(value), f"{source} policies")
        if "check" in marker.kwargs:
            value = marker.kwargs["check"]
            check = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
            if check not in CHECK_MODES:
                raise _bad(f"{source} check", str(value), ", ".join(CHECK_MODES))
    return _TestConfig(schedules, policies, check)


def _policy_params(policy: str, backend: str, settings: Settings) -> dict:
    if backend == "cupy":
        return {"delay_us": settings.delay_us} if policy in ("delay", "pct") else {}
    return {"steps": settings.delay_steps} if policy == "delay" else {}


def _make_device(config, spec: ScheduleSpec, check: str):
    from ..device import Device

    backend = backend_name(config)
    settings = config.stash[SETTINGS_KEY]
    return Device(backend, check=check != "off", policy=spec.policy, seed=spec.seed,
                  **_policy_params(spec.policy, backend, settings))


def _findings(item) -> Findings:
    found = item.stash.get(FINDINGS_KEY, None)
    if found is None:
        found = item.stash[FINDINGS_KEY] = Findings()
    return found


def replay_command(config, nodeid: str, spec: Optional[ScheduleSpec]) -> str:
    """The command that runs `nodeid` again with this run's seed (and only `spec`)."""
    settings = config.stash[SETTINGS_KEY]
    backend = backend_name(config)
    parts = ["pytest", shlex.quote(nodeid), f"--streamcheck-seed={settings.seed}", f"--streamcheck-backend={backend}"]
    if spec is not None:
        parts.append(f"--streamcheck-replay={spec.label}")
        if backend == "cupy" and spec.policy in ("delay", "pct"):
            parts.append(f"--streamcheck-delay-us={settings.delay_us}")
        elif spec.policy == "delay":
            parts.append(f"--streamcheck-delay-steps={settings.delay_steps}")
    if settings.check != "on":
        parts.append(f"--streamcheck-check={settings.check}")
    command = " ".join(parts)
    if config.invocation_params.dir != config.rootpath:
        command = f"cd {shlex.quote(str(config.rootpath))} && {command}"
    return command


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def streamcheck_seed(request) -> int:
    """This test's seed: base seed + crc32(node id)."""
    return per_test_seed(request.config.stash[SETTINGS_KEY].seed, request.node.nodeid)


@pytest.fixture
def streamcheck_device(request, streamcheck_seed):
    """A Device on the chosen backend, running the first policy's first schedule of this test.
    With check on, a race the checker finds fails the test even if every value was right."""
    config = request.config
    settings = config.stash[SETTINGS_KEY]
    tconf = _test_config(request.node, settings)
    spec = schedule_specs(streamcheck_seed, tconf.policies, 1, settings.replay)[0]
    device = _make_device(config, spec, tconf.check)
    found = _findings(request.node)
    found.device, found.spec, found.check = device, spec, tconf.check
    found.schedules += 1
    found.replay = replay_command(config, request.node.nodeid, spec)
    yield device
    found.add_races(device.races)


@dataclass(frozen=True)
class ScheduleResult:
    spec: ScheduleSpec
    schedule: str  # the policy with its parameters and the decisions taken ("" where not recorded)
    matches: bool


def describe_schedule(spec: ScheduleSpec, device, elide: bool = False) -> str:
    """`delay:0 = delay(steps=8) seed 123, decisions 1x2.h.2` (decisions replay with replay:<...>).
    `elide`: shorten a long decisions string, for a failure message (see _elided)."""
    schedule = device.schedule
    if schedule is None:
        return f"{spec.label} = {spec.policy} seed {spec.seed}"
    decisions = schedule.compact() or "-"
    if elide:
        decisions = _elided(decisions)
    return f"{spec.label} = {schedule.policy} seed {schedule.seed}, decisions {decisions}"


# Decisions grow with the program (a 200-step decode takes ~10,000 characters): a failure
# message keeps the head and the tail; report.txt and the junitxml property keep all of it.
DECISIONS_HEAD, DECISIONS_TAIL = 40, 20
DECISIONS_ELIDED_OVER = 100


def _elided(decisions: str) -> str:
    if len(decisions) <= DECISIONS_ELIDED_OVER:
        return decisions
    # `[...]`: decisions are made of digits, `h`, `x` and dots, so a bare `...` would read as part of them.
    return (f"{decisions[:DECISIONS_HEAD]}[...]{decisions[-DECISIONS_TAIL:]} ({len(decisions)} characters; "
            "all of them in report.txt under --streamcheck-trace-dir and in --junitxml)")


@dataclass(frozen=True)
class ScheduleRun:
    """What run_schedules saw: the sequential reference, one entry per schedule, the races."""

    reference: Any
    results: tuple
    races: tuple

    @property
    def wrong(self) -> tuple:
        return tuple(r for r in self.results if not r.matches)


class ScheduleFailure(AssertionError):
    """A schedule produced values the sequential reference did not, or the checker found races."""


# pytest prints each line of an exception's message after `E` and the failing line's indent
# (`E       ` for a line in a test function), and the first after the exception's name too.
EXCEPTION_MARGIN = 8
EXCEPTION_NAME = f"{ScheduleFailure.__module__}.{ScheduleFailure.__name__}: "


@pytest.fixture
def run_schedules(request, streamcheck_seed):
    """`run_schedules(fn, atol=0, rtol=0)`: run `fn(device) -> result` once on a sequential
    device (the reference), then under each schedule; fail on a differing result or (check
    on) on races, with the race report, the schedule and the command that replays it."""
    config = request.config
    item = request.node

    def run(fn: Callable, *, atol: float = 0.0, rtol: float = 0.0, schedules: Optional[int] = None,
            policies: Optional[Sequence[str]] = None, check: Optional[str] = None) -> ScheduleRun:
        __tracebackhide__ = True  # the failure is the message, not this frame
        settings = config.stash[SETTINGS_KEY]
        tconf = _test_config(item, settings)
        count = schedules if schedules is not None else tconf.schedules
        names = _policies(",".join(policies), "run_schedules(policies=...)") if policies else tconf.policies
        check_mode = check if check is not None else tconf.check
        if check_mode not in CHECK_MODES:
            raise _bad("run_schedules(check=...)", str(check_mode), ", ".join(CHECK_MODES))
        found = _findings(item)
        found.check = check_mode

        reference_spec = ScheduleSpec("sequential", 0, streamcheck_seed)
        ref_device = _make_device(config, reference_spec, check_mode)
        reference = _call(fn, ref_device, reference_spec, config, item.nodeid)
        found.add_races(ref_device.races)

        results, first_wrong, first_device = [], None, None
        for spec in schedule_specs(streamcheck_seed, names, count, settings.replay):
            device = _make_device(config, spec, check_mode)
            got = _call(fn, device, spec, config, item.nodeid)
            found.add_races(device.races)
            diff = compare(reference, got, atol=atol, rtol=rtol)
            schedule = describe_schedule(spec, device)
            results.append(ScheduleResult(spec, schedule, diff is None))
            if first_device is None:
                first_device = device
            if diff is not None and first_wrong is None:
                first_wrong = (spec, schedule, diff, device)
        found.schedules += len(results)
        wrong = sum(not r.matches for r in results)
        found.wrong += wrong
        races = tuple(found.races.values())
        outcome = ScheduleRun(reference, tuple(results), races)
        width = terminal_width(config) - EXCEPTION_MARGIN

        if first_wrong is not None:
            spec, schedule, diff, device = first_wrong
            found.schedule = schedule
            found.replay = replay_command(config, item.nodeid, spec)
            written = _trace_note(_write_trace(config, item.nodeid, device))
            raise ScheduleFailure(_failure_text(
                f"schedule {spec.label} gave values that differ from the sequential reference "
                f"({wrong} of {len(results)} schedules wrong)",
                spec, describe_schedule(spec, device, elide=True), diff,
                (device.report() if check_mode != "off" else "") + written, found.replay, width,
                len(EXCEPTION_NAME)))
        if races and check_mode == "on":
            # The trace files and the schedule line name the same run: the first schedule.
            spec, found.schedule = results[0].spec, results[0].schedule
            found.replay = replay_command(config, item.nodeid, spec)
            written = _trace_note(_write_trace(config, item.nodeid, first_device))
            matched = "in the 1 schedule" if len(results) == 1 else f"in all {len(results)} schedules"
            raise ScheduleFailure(_failure_text(
                f"the happens-before checker found {len(races)} race{'s' if len(races) != 1 else ''}; "
                f"values matched the reference {matched} (the race has not struck yet)",
                spec, describe_schedule(spec, first_device, elide=True), None, _format_races(races) + written,
                found.replay, width, len(EXCEPTION_NAME)))
        return outcome

    return run


def _call(fn, device, spec: ScheduleSpec, config, nodeid: str):
    try:
        return fn(device)
    except Exception as exc:
        if hasattr(exc, "add_note"):  # Python 3.11+; on 3.10 the traceback alone must do
            exc.add_note(f"streamcheck: raised under schedule {spec.label} (seed {spec.seed}); replay: "
                         f"{replay_command(config, nodeid, spec if spec.policy != 'sequential' else None)}")
        raise


def _format_races(races, width: Optional[int] = None) -> str:
    from ..core.hb import format_report

    return format_report(list(races), width)


def _failure_text(headline: str, spec: ScheduleSpec, schedule: str, diff: Optional[str], report: str,
                  replay: str, width: Optional[int] = None, first_line_taken: int = 0) -> str:
    """The failure message. With `width`, lines are wrapped at it, the headline `first_line_taken`
    columns narrower (pytest prints the exception's name before it); the replay line stays
    whole, since it is pasted back into a shell."""
    from ..core.hb import CONTINUATION_INDENT, MIN_WRAP_WIDTH, wrap_lines

    first = f"streamcheck: {headline}"
    if width is not None:
        # Wrapped as if the exception's name were part of it, which is then cut off again.
        taken = " " * first_line_taken
        first = "\n".join(textwrap.wrap(first, max(width, MIN_WRAP_WIDTH), initial_indent=taken,
                                        subsequent_indent=CONTINUATION_INDENT, break_long_words=False,
                                        break_on_hyphens=False))[len(taken):]
    lines = [f"  schedule: {schedule or f'{spec.label} = {spec.policy} seed {spec.seed}'}"]
    if diff:
        lines.append(f"  mismatch: {diff}")
    if report:
        lines.append(report)
    return "\n".join([first, wrap_lines("\n".join(lines), width), f"  replay: {replay}"])


# --- comparing results --------------------------------------------------------------------


def _host(value):
    """numpy view of a result: cupy arrays come back with .get(), others through __array__."""
    import numpy as np

    if type(value).__module__.split(".")[0] == "cupy":
        return value.get()
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        return np.asarray(value)
    return value


def compare(want, got, *, atol: float = 0.0, rtol: float = 0.0, path: str = "result") -> Optional[str]:
    """None when `got` equals `want` (arrays exactly, or within atol/rtol; NaN equals NaN),
    else a one-line description of the first difference."""
    import numpy as np

    want, got = _host(want), _host(got)
    if isinstance(want, dict) and isinstance(got, dict):
        if set(want) != set(got):
            return f"{path}: keys {sorted(map(str, got))} differ from the reference's {sorted(map(str, want))}"
        for key in want:
            diff = compare(want[key], got[key], atol=atol, rtol=rtol, path=f"{path}[{key!r}]")
            if diff:
                return diff
        return None
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(want) != len(got):
            return f"{path}: {len(got)} items, the reference has {len(want)}"
        for i, (w, g) in enumerate(zip(want, got)):
            diff = compare(w, g, atol=atol, rtol=rtol, path=f"{path}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
        w, g = np.asarray(want), np.asarray(got)
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"{path}: got {g.dtype}{list(g.shape)}, the reference is {w.dtype}{list(w.shape)}"
        nan_ok = w.dtype.kind in "fc"
        if atol == 0 and rtol == 0:
            bad = ~((w == g) | (np.isnan(w) & np.isnan(g) if nan_ok else False))
        else:
            bad = ~np.isclose(g, w, atol=atol, rtol=rtol, equal_nan=nan_ok)
        if not bad.any():
            return None
        index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
        tol = f" (atol={atol}, rtol={rtol})" if atol or rtol else " (exact)"
        return (f"{path}: {int(bad.sum())} of {bad.size} elements differ{tol}; first at {index}: "
                f"got {g[index]!r}, want {w[index]!r}")
    if want != got:
        return f"{path}: got {got!r}, want {want!r}"
    return None


# --- traces of failing tests --------------------------------------------------------------


def _safe_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:150] or "test"


def _write_trace(config, nodeid: str, device) -> Optional[str]:
    """With --streamcheck-trace-dir: DIR/<node id>/ gets the failing run's trace.json and
    report.txt, and (where streamcheck.export / streamcheck.timeline are installed)
    perfetto.json for ui.perfetto.dev and timeline.png."""
    trace_dir = config.stash[SETTINGS_KEY].trace_dir
    if not trace_dir or device is None:
        return None
    out = os.path.join(trace_dir, _safe_name(nodeid))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "trace.json"), "w") as fh:
        fh.write(device.trace.to_json())
    notes = [device.report()]
    schedule = device.schedule
    if schedule is not None:
        notes.append(f"schedule: {schedule.policy} seed {schedule.seed}, decisions {schedule.compact() or '-'}")
    for module, function, filename in (("export", "write_chrome_trace", "perfetto.json"),
                                       ("timeline", "render_timeline", "timeline.png")):
        try:
            writer = getattr(__import__(f"streamcheck.{module}", fromlist=[function]), function)
            writer(device, os.path.join(out, filename))
        except Exception as exc:  # an exporter problem must not hide the test's own failure
            notes.append(f"{filename} not written: streamcheck.{module}.{function} raised "
                         f"{type(exc).__name__}: {exc}")
    with open(os.path.join(out, "report.txt"), "w") as fh:
        fh.write("\n".join(notes) + "\n")
    return out


def _trace_note(out: Optional[str]) -> str:
    """The line a failure message gets when --streamcheck-trace-dir wrote files."""
    if not out:
        return ""
    return (f"\n  trace files: {out}/ (perfetto.json for ui.perfetto.dev, timeline.png, trace.json, "
            "report.txt)")


# --- reporting ----------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    found = item.stash.get(FINDINGS_KEY, None)
    if found is None or call.when != "call":
        return report
    config = item.config
    device = found.device
    if device is not None:
        found.add_races(device.races)
        found.schedule = found.schedule or describe_schedule(found.spec, device)
    races = list(found.races.values())
    check = found.check
    width = terminal_width(config)
    ours = call.excinfo is not None and call.excinfo.errisinstance(ScheduleFailure)
    if device is not None and races and check == "on" and report.passed:
        # The race did not strike on this schedule, but nothing orders the accesses.
        report.outcome = "failed"
        report.longrepr = _failure_text(
            f"the happens-before checker found {len(races)} race{'s' if len(races) != 1 else ''} "
            "(streamcheck_device: values are the test's to check)",
            found.spec, describe_schedule(found.spec, device, elide=True), None, _format_races(races),
            found.replay, width)
    elif races and not ours:
        # Races beside some other outcome (warn mode, or the test failed for its own reason).
        text = _format_races(races, width)
        if report.failed and hasattr(report.longrepr, "addsection"):
            report.longrepr.addsection("streamcheck races", text)  # in the failure: --junitxml keeps it
        else:
            report.sections.append(("streamcheck races", text))
    if device is not None and report.failed:
        written = _write_trace(config, item.nodeid, device)
        if written:
            report.sections.append(("streamcheck trace", _trace_note(written).strip()))
    found_something = bool(races or found.wrong)
    # JSON, not a dict: --junitxml writes each property with str(), and JSON is what a CI
    # reads back. Call sites are relative to the rootdir, as pytest's node ids are.
    entry = ("streamcheck", json.dumps({
        "races": [race.to_dict(str(config.rootpath)) for race in races],
        "schedules": found.schedules, "wrong": found.wrong,
        "schedule": found.schedule if found_something else "",
        "replay": found.replay if found_something else ""}))
    report.user_properties.append(entry)  # for the summary (on the xdist controller too)
    # and on the item, as record_property does: --junitxml reads the teardown report's
    # properties, which pytest copies from the item after this.
    item.user_properties.append(entry)
    return report


class _Summary:
    """Collects each test's findings from its report (on the xdist controller too:
    user_properties travel with the report) and prints them at the end."""

    def __init__(self, config):
        self.config = config
        self.rows: list = []  # (node id, outcome, findings) in report order

    def pytest_runtest_logreport(self, report) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == "streamcheck" and isinstance(value, str):
                self.rows.append((report.nodeid, report.outcome, json.loads(value)))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        from ..core.hb import wrap_lines

        if not self.rows:
            return
        settings = self.config.stash[SETTINGS_KEY]
        width = terminal_width(self.config)
        found = [row for row in self.rows if row[2]["races"] or row[2]["wrong"]]
        terminalreporter.section("streamcheck")
        for nodeid, outcome, value in found:
            parts = []
            races = value["races"]
            if races:
                kinds = sorted({f"{race['kind']} on {race['buffer']}" for race in races})
                parts.append(f"{len(races)} race{'s' if len(races) != 1 else ''} ({', '.join(kinds)})")
            if value["wrong"]:
                parts.append(f"{value['wrong']} of {value['schedules']} schedules gave wrong values")
            terminalreporter.line(wrap_lines(f"{outcome.upper()} {nodeid}: {'; '.join(parts)}", width))
            if value["replay"]:
                terminalreporter.line(f"    replay: {value['replay']}")  # whole: it is pasted back
        racy = sum(1 for row in found if row[2]["races"])
        schedules = sum(row[2]["schedules"] for row in self.rows)
        tests = len(self.rows)
        terminalreporter.line(wrap_lines(
            f"streamcheck: {tests} test{'s' if tests != 1 else ''}, {schedules} "
            f"schedule{'s' if schedules != 1 else ''}, races found in {racy} test{'s' if racy != 1 else ''}; "
            f"--streamcheck-seed={settings.seed}", width))
