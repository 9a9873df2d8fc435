"""Tests' torch code with CUDA emulated on the sim (docs/emulation.md): every test with
--streamcheck-emulate-cuda, and a streamcheck_gpu test where there is no GPU.

One emulation per test: entered before the test's setup, left after its teardown, so its
function-scoped fixtures make their CUDA tensors in it. A tensor a wider-scoped fixture made in an
earlier test's emulation is refused in one line where a later test uses it. The test runs under its
first schedule (the first policy, the test's seed); a race fails it with the report and the replay
line, as a streamcheck_gpu test's race does on a GPU (reporting.py reads `Findings.recording`).
The emulation itself is entered and left by fixtures.py (streamcheck_gpu uses it too); these are
the hooks that do it for every test.
"""
from __future__ import annotations

import pytest

from .fixtures import start_emulation, stop_emulation
from .options import SETTINGS_KEY, in_use


def emulating(config) -> bool:
    return in_use(config) and config.stash[SETTINGS_KEY].emulate_cuda


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if emulating(item.config):
        start_emulation(item)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        stop_emulation(item)
