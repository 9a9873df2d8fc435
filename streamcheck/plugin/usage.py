"""Whether this run uses streamcheck: one of its options given (command line or ini file), or a
test that uses one of its fixtures or markers.

Installed, the plugin is loaded by every project in the environment. Until a run uses it, it
prints no header, stores no seed in the cache, pins no GPU and imports nothing beyond itself, as
pytest's cacheprovider and xdist's looponfail stay silent when unused. The other features ask
`in_use(config)`: true from pytest_configure when an option is given, from collection when a
test uses streamcheck, and on the xdist controller (which collects nothing) when a worker that
collected such a test says so as it finishes (xdist's workeroutput).
"""
from __future__ import annotations

import pytest

from .options import IN_USE_KEY, in_use, options_given

FIXTURES = ("streamcheck_seed", "streamcheck_device", "run_schedules", "streamcheck_gpu")
TIMING_MARKER = "streamcheck_gpu_timing"  # workers.py: skipped when xdist workers share a GPU
MARKERS = ("streamcheck", TIMING_MARKER)
WORKER_OUTPUT_KEY = "streamcheck_in_use"  # in xdist's workeroutput
__all__ = ["FIXTURES", "MARKERS", "TIMING_MARKER", "in_use", "uses_streamcheck"]


FIXTURES_MODULE = "streamcheck.plugin.fixtures"


def uses_streamcheck(item) -> bool:
    """Whether a test asks for one of our fixtures (itself or through its fixtures) or markers."""
    return (any(_resolves_to_ours(item, name) for name in FIXTURES)
            or any(item.get_closest_marker(name) is not None for name in MARKERS))


def _resolves_to_ours(item, name: str) -> bool:
    """Whether `name` is *our* fixture for this test: a project may have a `run_schedules` of its
    own. pytest tells which definitions a test resolves to only on its private _fixtureinfo (its
    own plugins read it too); items without one (doctests) ask for no fixture of ours."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = list(info.name2fixturedefs.get(name, ())) if info is not None else []
    while definitions:  # the innermost applies; one that asks for its own name gets the next one out
        definition = definitions.pop()
        if getattr(definition.func, "__module__", None) == FIXTURES_MODULE:
            return True
        if name not in definition.argnames:
            return False
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.stash[IN_USE_KEY] = bool(options_given(config))


@pytest.hookimpl(trylast=True)  # after -k and -m deselected theirs
def pytest_collection_modifyitems(config, items) -> None:
    if any(uses_streamcheck(item) for item in items):
        config.stash[IN_USE_KEY] = True
    workeroutput = getattr(config, "workeroutput", None)  # an xdist worker: tell the controller
    if workeroutput is not None and in_use(config):
        workeroutput[WORKER_OUTPUT_KEY] = True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: a worker collected a test that uses streamcheck (before the summary and
    sessionfinish, which show and store the seed)."""
    if getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY):
        node.config.stash[IN_USE_KEY] = True
