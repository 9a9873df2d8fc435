"""The plugin's options: each `--streamcheck-…` flag with its ini twin, read and validated once
in pytest_configure; a bad value is a pytest.UsageError naming the option and what it accepts.

The seed option is declared here with the others; seeds.py reads it (it has a cache and xdist
workers to deal with).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional

import pytest

POLICIES = ("sequential", "eager", "delay", "random", "pct")
BACKENDS = ("auto", "sim", "cupy")
CHECK_MODES = ("on", "warn", "off")  # on: races fail the test; warn: only reported; off: no checker
# Seconds for one run_schedules call (its reference and all its schedules together), or one whole
# test under the emulation or streamcheck_gpu / streamcheck_device: far above what an honest test
# takes on the sim (a decode test's schedule: well under 1 s), and a hung one fails in minutes.
DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Settings:
    """The run's validated options (the base seed is seeds.base_seed's)."""

    schedules: int
    policies: tuple
    backend: str  # as asked: auto, sim or cupy (resolved lazily, see backend_name)
    delay_us: int
    delay_steps: int
    check: str
    trace_dir: Optional[str]  # absolute (see _trace_dir)
    replay: Optional[tuple]  # (policy, index): run only that schedule
    confirm: bool = False  # a failing test's races are confirmed on the sim (streamcheck.proofs.confirm)
    timeout: float = DEFAULT_TIMEOUT  # seconds a run_schedules call or a whole test may take; 0: no limit
    audit_syncs: bool = False  # each test's synchronizations are audited (streamcheck.analyses.sync_audit)
    emulate_cuda: bool = False  # every test runs with CUDA emulated on the sim (plugin/emulation.py)
    memory_capacity: Optional[int] = None  # bytes of each emulated device; None: the emulation's default
    strict_free: bool = False  # a free with a pending use is a FREE race even if nothing reuses it (core.trace.Free)


SETTINGS_KEY = pytest.StashKey[Settings]()
LIBRARIES_KEY = pytest.StashKey[tuple]()
IN_USE_KEY = pytest.StashKey[bool]()  # set by usage.py
BACKEND_KEY = pytest.StashKey[str]()

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
    ("--streamcheck-confirm", "streamcheck_confirm", "",
     "sim: a failing run_schedules test's report says, per race, whether holding its first access until "
     "its second ran made a value differ, with the values (docs/confirm.md).", "false"),
    ("--streamcheck-audit-syncs", "streamcheck_audit_syncs", "",
     "audit each run_schedules / streamcheck_device / streamcheck_gpu test's synchronizations (run_schedules: "
     "its sequential run's): which are "
     "needed, which are redundant, which host syncs could be device-side waits (docs/sync-audit.md); a "
     "line per test in the summary, the table in the test's report.", "false"),
    ("--streamcheck-emulate-cuda", "streamcheck_emulate_cuda", "",
     "emulate CUDA on the sim for the whole run (docs/emulation.md; also STREAMCHECK_EMULATE_CUDA=1): from "
     "start-up on, so collection, skipif guards and module-level flags see a GPU (torch.cuda.is_available()); "
     "each test's unmodified torch code on device='cuda' runs on this CPU on a fresh emulated device under the "
     "first policy's schedule, checked; a race fails the test with the report and the replay line. For CPU "
     "runners of a suite written for GPUs.", "false"),
    ("--streamcheck-memory-capacity", "streamcheck_memory_capacity", "SIZE",
     "memory of each emulated CUDA device (e.g. 16GiB; --streamcheck-emulate-cuda and streamcheck_gpu tests on "
     "the sim): more than it raises torch's OutOfMemoryError. Default: STREAMCHECK_MEMORY_CAPACITY's, else 8GiB.",
     ""),
    ("--streamcheck-strict-free", "streamcheck_strict_free", "",
     "report a free while another stream may still use the memory as a FREE race even when no allocation gets "
     "its bytes in the test (default: a hazard line; the race is an allocation that gets the bytes before that use "
     "is ordered before it).", "false"),
    ("--streamcheck-gpus", "streamcheck_gpus", "auto|N|0",
     "pytest-xdist: GPUs the workers are pinned to, one each, round-robin (CUDA_VISIBLE_DEVICES); auto: "
     "CUDA_VISIBLE_DEVICES's, else nvidia-smi -L's, else the driver's count; 0: no pinning.", "0"),
    ("--streamcheck-example-db", "streamcheck_example_db", "DIR",
     "a hypothesis example database (DirectoryBasedExampleDatabase) for the loaded profile and ours, shared "
     "by every xdist worker: a failure one finds, the others and later runs replay first. Relative as "
     "--streamcheck-trace-dir.", ""),
    ("--streamcheck-timeout", "streamcheck_timeout", "SECONDS",
     "a run_schedules call (its sequential reference and all its schedules together), or a whole test under "
     "--streamcheck-emulate-cuda or with streamcheck_gpu / streamcheck_device, that runs longer is interrupted "
     "and fails, saying where it was and what finished; 0: no limit (the program runs in the test's own "
     "thread).", f"{DEFAULT_TIMEOUT:g}"),
    ("--streamcheck-library", "streamcheck_library", "PATH[,PATH...]",
     "your own wrappers (directories or files): reports skip their frames, as torch's, to name your call "
     "as the site, and show the wrapper's line as the innermost frame. Relative as --streamcheck-trace-dir.", ""),
)
_DEFAULTS = {ini: default for _, ini, _, _, default in _OPTIONS}
_SWITCHES = {"streamcheck_confirm", "streamcheck_audit_syncs", "streamcheck_emulate_cuda", "streamcheck_strict_free"}
# Options a CI job can set once for every pytest run in it (command line > environment > ini file).
_ENVIRONMENT = {"streamcheck_emulate_cuda": "STREAMCHECK_EMULATE_CUDA"}
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def pytest_addoption(parser: pytest.Parser) -> None:
    """Each option, with its ini twin."""
    group = parser.getgroup("streamcheck", "streamcheck: CUDA stream race checking")
    for flag, ini, metavar, help, default in _OPTIONS:
        # No ini default: None tells an unset option from one set to its default (options_given).
        ini_help = f"default for {flag} ({default or 'none'}): {help}"
        if ini in _SWITCHES:  # a switch (a value after it would swallow a test path)
            group.addoption(flag, dest=ini, action="store_const", const="true", default=None, help=help)
            group.addoption("--no-" + flag[2:], dest=ini, action="store_const", const="false",
                            help=f"turn {flag} off (where the ini file turns it on).")
            parser.addini(ini, help=ini_help, default=None)
            continue
        group.addoption(flag, dest=ini, metavar=metavar, default=None, help=help)
        # linelist: a TOML list (["delay", "pct"], as the marker takes) or an ini file's string.
        parser.addini(ini, help=ini_help, type="linelist" if ini == "streamcheck_policy" else None, default=None)


def pytest_configure(config: pytest.Config) -> None:
    """Validate the options; stash them for the other streamcheck plugins."""
    settings = _read_settings(config)
    if settings.backend == "cupy":
        from ..device.backends import gpu_available

        if not gpu_available():
            raise pytest.UsageError("streamcheck: --streamcheck-backend=cupy needs an NVIDIA GPU and CuPy "
                                    "(pip install 'streamcheck[gpu]'); none found. Use sim or auto.")
    config.stash[SETTINGS_KEY] = settings
    config.stash[LIBRARIES_KEY] = _library_paths(config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session) -> None:
    """Call sites for this run, once it uses streamcheck (the core is imported only then):
    --streamcheck-library's paths are library frames, and reports name files relative to the
    rootdir. The previous settings come back at the end (pytester runs pytest in-process)."""
    config = session.config
    if not in_use(config):
        return
    from ..core.trace import set_site_settings, site_settings

    previous = set_site_settings(replace(site_settings(), libraries=config.stash[LIBRARIES_KEY],
                                         root=str(config.rootpath)))
    config.add_cleanup(lambda: set_site_settings(previous))


def _library_paths(config) -> tuple:
    """--streamcheck-library's paths, checked at start-up."""
    value, source = option_value(config, "streamcheck_library")
    base = config.invocation_params.dir if source.startswith("--") else config.rootpath
    paths = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        path = os.path.normpath(os.path.join(str(base), os.path.expanduser(part)))
        if not os.path.exists(path):
            raise pytest.UsageError(f"streamcheck: {source}={value!r}: {path} does not exist; give the directories "
                                    "or files of your own wrappers")
        paths.append(path)
    return tuple(paths)


def in_use(config) -> bool:
    """Whether this run uses streamcheck, as usage.py found out so far (collection may still find
    a test that uses it)."""
    return config.stash.get(IN_USE_KEY, False)


def option_value(config, ini: str) -> tuple[str, str]:
    """The option's value and where it came from (for error messages)."""
    flag = "--" + ini.replace("_", "-")
    value = config.getoption(ini)
    if value is not None:
        return str(value).strip(), flag
    variable = _ENVIRONMENT.get(ini)
    if variable and os.environ.get(variable, "").strip():
        return os.environ[variable].strip(), f"environment variable {variable}"
    value = config.getini(ini)
    if value is None:
        return _DEFAULTS[ini], f"the default of {flag}"
    if isinstance(value, list):  # streamcheck_policy's lines or TOML list
        value = ",".join(str(v).strip() for v in value)
    return str(value).strip(), f"ini option {ini}"


def options_given(config) -> list:
    """The streamcheck options this run sets, on the command line or in an ini file: any of them
    means the run uses streamcheck (usage.py)."""
    return [ini for _, ini, _, _, _ in _OPTIONS if config.getoption(ini) is not None or config.getini(ini) is not None
            or os.environ.get(_ENVIRONMENT.get(ini, ""), "").strip()]


def bad_value(source: str, value: str, accepted: str) -> pytest.UsageError:
    return pytest.UsageError(f"streamcheck: {source}={value!r} is not valid; accepted values: {accepted}")


def _int(config, ini: str, minimum: int, accepted: str) -> int:
    value, source = option_value(config, ini)
    try:
        number = int(value)
    except ValueError:
        raise bad_value(source, value, accepted) from None
    if number < minimum:
        raise bad_value(source, value, accepted)
    return number


def parse_policies(value: str, source: str) -> tuple:
    """The comma-separated policy names in `value`, checked."""
    names = tuple(p.strip() for p in value.split(","))  # an empty name (`delay,,pct`) is a typo, not a policy
    if any(p not in POLICIES for p in names):
        raise bad_value(source, value, f"a comma-separated list of {', '.join(POLICIES)}")
    return names


def _replay(value: str, source: str) -> Optional[tuple]:
    if value == "":
        return None
    policy, _, index = value.partition(":")
    if policy not in POLICIES or not index.isdigit():
        raise bad_value(source, value, f"POLICY:INDEX with POLICY one of {', '.join(POLICIES)} (e.g. delay:3)")
    return policy, int(index)


def _trace_dir(config) -> Optional[str]:
    """The directory is made when a test fails; its parent must exist (as repro's and fuzz's
    output files: a typo must not create a tree of directories)."""
    path = path_option(config, "streamcheck_trace_dir")
    if path is not None and not os.path.isdir(os.path.dirname(path)):
        value, source = option_value(config, "streamcheck_trace_dir")
        raise pytest.UsageError(f"streamcheck: {source}={value!r}: the directory {os.path.dirname(path)} does not "
                                "exist; create it or choose another place")
    return path


def path_option(config, ini: str) -> Optional[str]:
    """Absolute: a relative path on the command line is taken from where pytest was started,
    as --junitxml's is; one from an ini file from the rootdir, as cache_dir's is."""
    value, source = option_value(config, ini)
    if not value:
        return None
    base = config.invocation_params.dir if source.startswith("--") else config.rootpath
    return os.path.normpath(os.path.join(str(base), os.path.expanduser(value)))


def _read_settings(config) -> Settings:
    backend, source = option_value(config, "streamcheck_backend")
    if backend not in BACKENDS:
        raise bad_value(source, backend, ", ".join(BACKENDS))
    check, source = option_value(config, "streamcheck_check")
    if check not in CHECK_MODES:
        raise bad_value(source, check, ", ".join(CHECK_MODES))
    policies = parse_policies(*option_value(config, "streamcheck_policy"))
    return Settings(
        schedules=_int(config, "streamcheck_schedules", 1, "an integer >= 1"),
        policies=policies,
        backend=backend,
        delay_us=_int(config, "streamcheck_delay_us", 0, "an integer >= 0 (microseconds)"),
        delay_steps=_int(config, "streamcheck_delay_steps", 1, "an integer >= 1"),  # held for 0 calls: no delay
        check=check,
        trace_dir=_trace_dir(config),
        replay=_replay(*option_value(config, "streamcheck_replay")),
        confirm=_bool(config, "streamcheck_confirm"),
        audit_syncs=_bool(config, "streamcheck_audit_syncs"),
        emulate_cuda=_bool(config, "streamcheck_emulate_cuda"),
        strict_free=_bool(config, "streamcheck_strict_free"),
        timeout=parse_timeout(*option_value(config, "streamcheck_timeout")),
        memory_capacity=_memory_capacity(config),
    )


def _memory_capacity(config) -> Optional[int]:
    value, source = option_value(config, "streamcheck_memory_capacity")
    if not value:
        return None
    from ..emulation.memory_stats import parse_size  # torch-free

    try:
        return parse_size(value)
    except ValueError:
        raise bad_value(source, value, "a memory size: bytes (4096) or with a unit (512MiB, 8GiB, 80GB)") from None


def parse_timeout(value: str, source: str) -> float:
    """Seconds >= 0 (0: no limit), checked."""
    accepted = "a number of seconds >= 0 (0: no limit)"
    try:
        seconds = float(value)
    except ValueError:
        raise bad_value(source, value, accepted) from None
    if not seconds >= 0 or seconds == float("inf"):  # `not >=`: NaN too
        raise bad_value(source, value, accepted)
    return seconds


def _bool(config, ini: str) -> bool:
    value, source = option_value(config, ini)
    if value.lower() not in _BOOLS:
        raise bad_value(source, value, "true, false (also yes/no, on/off, 1/0)")
    return _BOOLS[value.lower()]


def backend_name(config) -> str:
    """The backend tests run on: `auto` resolved (cached)."""
    settings = config.stash[SETTINGS_KEY]
    if settings.backend != "auto":
        return settings.backend
    resolved = config.stash.get(BACKEND_KEY, None)
    if resolved is None:
        from ..device.backends import resolve  # tries to import cupy: only when `auto` must be resolved

        resolved = config.stash[BACKEND_KEY] = resolve("auto")
    return resolved
