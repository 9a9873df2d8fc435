"""Seeds you can paste back.

One base seed per run: random unless --streamcheck-seed gives one; `last` is the previous run's
that used streamcheck (usage.py), kept in pytest's cache. Per test `base + crc32(node id)`, so a
test's seed does not depend on which other tests were selected (-k) or which xdist worker runs
it; under xdist the controller
draws the base seed and hands it to the workers. Per schedule, a seed from the test's and the
schedule's name (`POLICY:INDEX`). The replay command of a failure names all of it.
"""
from __future__ import annotations

import random
import shlex
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

import pytest

from .options import SETTINGS_KEY, backend_name, bad_value, option_value, options_given
from .usage import in_use

SEED_MOD = 2**32
CACHE_KEY = "streamcheck/seed"
WORKER_KEY = "streamcheck_seed"  # in xdist's workerinput
SEED_KEY = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    """Read the base seed (drawing one costs nothing: it is stored and shown only if used)."""
    # Not tryfirst: the cacheprovider (tryfirst) must have made config.cache for `last`.
    config.stash[SEED_KEY] = _read_base_seed(config)


def pytest_sessionfinish(session) -> None:
    """Store the seed for `last`, in a run that used streamcheck (on the xdist controller, which
    knows it by then from the workers' reports)."""
    config = session.config
    cache = getattr(config, "cache", None)
    # --co runs no test: `last` must still name the last run that did.
    if (cache is not None and in_use(config) and not hasattr(config, "workerinput")
            and not config.option.collectonly):
        cache.set(CACHE_KEY, base_seed(config))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker uses the controller's base seed."""
    node.workerinput[WORKER_KEY] = base_seed(node.config)


def _read_base_seed(config) -> int:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_KEY in workerinput:
        return int(workerinput[WORKER_KEY])  # xdist worker: the controller's seed
    value, source = option_value(config, "streamcheck_seed")
    integer = f"an integer in [0, {SEED_MOD})"
    accepted = f"{integer} or `last`"
    if value == "":
        return random.SystemRandom().randrange(SEED_MOD)
    if value == "last":
        cache = getattr(config, "cache", None)
        last = cache.get(CACHE_KEY, None) if cache is not None else None
        if not isinstance(last, int):  # `last` again would fail again: an integer is the way
            raise pytest.UsageError(f"streamcheck: {source}=last, but no previous seed is stored in pytest's cache "
                                    "(first run here, cache cleared, or -p no:cacheprovider); "
                                    f"run once without it or pass {integer}")
        return last
    try:
        seed = int(value)
    except ValueError:
        raise bad_value(source, value, accepted) from None
    if not 0 <= seed < SEED_MOD:
        raise bad_value(source, value, accepted)
    return seed


def base_seed(config) -> int:
    """This run's base seed (the same on every xdist worker)."""
    return config.stash[SEED_KEY]


def per_test_seed(base: int, nodeid: str) -> int:
    """Per-test seed: from the name, never from run order."""
    return (base + zlib.crc32(nodeid.encode())) % SEED_MOD


def schedule_seed(test_seed: int, policy: str, index: int) -> int:
    return zlib.crc32(f"{policy}:{index}".encode(), test_seed)


@dataclass(frozen=True)
class ScheduleSpec:
    """The index-th schedule of `policy` in a test; its seed derives from the test's seed."""

    policy: str
    index: int
    seed: int

    @property
    def label(self) -> str:
        return f"{self.policy}:{self.index}"


def schedule_specs(test_seed: int, policies: Sequence[str], count: int,
                   replay: Optional[tuple] = None) -> list[ScheduleSpec]:
    """Round-robin over policies; the k-th schedule of a policy always gets the same seed,
    whatever the other policies or the count, so `POLICY:INDEX` names it for good. `replay`
    (--streamcheck-replay's): only that schedule, which must be one of these."""
    counters = dict.fromkeys(policies, 0)
    specs = []
    for i in range(count):
        policy = policies[i % len(policies)]
        index = counters[policy]
        counters[policy] += 1
        specs.append(ScheduleSpec(policy, index, schedule_seed(test_seed, policy, index)))
    if replay is None:
        return specs
    policy, index = replay
    if counters.get(policy, 0) <= index:
        # Another schedule than the test's would replay nothing the test ever ran.
        accepted = ", ".join(f"{p}:0" if n == 1 else f"{p}:0 to {p}:{n - 1}" for p, n in counters.items() if n)
        raise pytest.UsageError(f"streamcheck: --streamcheck-replay={policy}:{index} is not a schedule this test runs "
                                f"(its policies and count come from the options, its marker or run_schedules' "
                                f"arguments); accepted values: {accepted}")
    return [spec for spec in specs if spec.policy == policy and spec.index == index]


def replay_command(config, nodeid: str, spec: Optional[ScheduleSpec]) -> str:
    """The command that runs `nodeid` again with this run's seed (and only `spec`)."""
    settings = config.stash[SETTINGS_KEY]
    backend = backend_name(config)
    parts = ["pytest", shlex.quote(nodeid), f"--streamcheck-seed={base_seed(config)}",
             f"--streamcheck-backend={backend}"]
    given = options_given(config)
    if "streamcheck_policy" in given:  # the policies and count a replayed schedule must be one of
        parts.append(f"--streamcheck-policy={','.join(settings.policies)}")
    if spec is not None:
        if "streamcheck_schedules" in given:
            parts.append(f"--streamcheck-schedules={settings.schedules}")
        parts.append(f"--streamcheck-replay={spec.label}")
        if backend == "cupy" and spec.policy in ("delay", "pct"):
            parts.append(f"--streamcheck-delay-us={settings.delay_us}")
        elif spec.policy == "delay":
            parts.append(f"--streamcheck-delay-steps={settings.delay_steps}")
    if settings.check != "on":
        parts.append(f"--streamcheck-check={settings.check}")
    if settings.emulate_cuda:  # else a replay skips the test its skipif guard now finds no GPU for
        parts.append("--streamcheck-emulate-cuda")
    command = " ".join(parts)
    if config.invocation_params.dir != config.rootpath:
        command = f"cd {shlex.quote(str(config.rootpath))} && {command}"
    return command
