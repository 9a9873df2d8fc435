"""pytest plugin: seeded schedules, injected delays and happens-before checking in tests.

Registered through the pytest11 entry point `streamcheck` (with PYTEST_DISABLE_PLUGIN_AUTOLOAD:
`-p streamcheck.plugin`); `-p no:streamcheck` removes all of it. As pytest's own features are,
each feature is a plugin module of its own, over public hooks:

- options: the `--streamcheck-…` options and their ini twins, validated at start-up;
- preload: a --streamcheck-emulate-cuda run re-execs itself with the emulation's native CUDA guard
  preloaded (torch's autograd needs it; torch must find it at its import);
- usage: whether the run uses streamcheck (an option given, a test with its fixtures or markers):
  until then the plugin prints, stores, pins and imports nothing;
- seeds: the base seed (random, given, `last`, the controller's under xdist), per-test and
  per-schedule seeds, the replay command;
- fixtures: streamcheck_seed, streamcheck_device, run_schedules, streamcheck_gpu and the streamcheck marker;
- emulation: tests' torch code with CUDA emulated on the sim (--streamcheck-emulate-cuda: from
  pytest_configure on, for collection too; streamcheck_gpu without a GPU);
- time_limit: one --streamcheck-timeout for a whole emulated, streamcheck_gpu or streamcheck_device
  test: a hung one fails, saying where it was;
- reporting: the header, race reports in failures, the junitxml property, the summary, the
  trace files of failing tests;
- profiles: our hypothesis profiles, when asked for, and the shared example database;
- workers: pytest-xdist workers pinned one per GPU (CUDA_VISIBLE_DEVICES), when --streamcheck-gpus asks.

results.py holds run_schedules' comparison (no hooks). Loading the plugin imports neither cupy,
torch, numpy, hypothesis nor streamcheck's core: the fixtures import what they use.
"""
import importlib

# Registered with this package, each after the ones it imports: pytest marks a plugin module for
# assertion rewriting just before importing it, and warns about one a sibling imported earlier.
pytest_plugins = [
    "streamcheck.plugin.options",
    "streamcheck.plugin.preload",
    "streamcheck.plugin.usage",
    "streamcheck.plugin.seeds",
    "streamcheck.plugin.reporting",
    "streamcheck.plugin.fixtures",
    "streamcheck.plugin.emulation",
    "streamcheck.plugin.time_limit",
    "streamcheck.plugin.profiles",
    "streamcheck.plugin.workers",
]

# The public names of the plugin's modules, importable from `streamcheck.plugin` as when it was
# one module (hooks and fixtures stay in their modules: here they would be registered twice).
_EXPORTS = {
    "options": ("BACKEND_KEY", "BACKENDS", "CHECK_MODES", "POLICIES", "SETTINGS_KEY", "Settings", "backend_name"),
    "seeds": ("CACHE_KEY", "SEED_MOD", "WORKER_KEY", "ScheduleSpec", "base_seed", "per_test_seed", "replay_command",
              "schedule_seed", "schedule_specs"),
    "fixtures": ("ScheduleResult", "ScheduleRun"),
    "reporting": ("DECISIONS_ELIDED_OVER", "DECISIONS_HEAD", "DECISIONS_TAIL", "EXCEPTION_MARGIN", "EXCEPTION_NAME",
                  "FINDINGS_KEY", "WORKER_WIDTH_KEY", "Findings", "ScheduleFailure", "describe_schedule",
                  "terminal_width"),
    "results": ("compare",),
    "usage": ("FIXTURES", "MARKERS", "in_use", "uses_streamcheck"),
    "workers": ("GPUS_KEY", "detect_gpus", "pinning"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name):
    # Lazy: imported here, the modules would be imported before pytest marks them (see above).
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
