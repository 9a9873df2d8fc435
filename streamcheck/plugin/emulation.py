"""Tests' torch code with CUDA emulated on the sim (docs/emulation.md): every test with
--streamcheck-emulate-cuda (or STREAMCHECK_EMULATE_CUDA=1), and a streamcheck_gpu test where there
is no GPU.

With the option, the emulation is entered in pytest_configure and lasts the whole run (in each
xdist worker: each runs its own configure): collection, module-level code and skipif conditions
(`torch.cuda.is_available()`, `TEST_CUDA = ...`) see the emulated GPU, since pytest evaluates
them before any test runs. Collection-time work runs on a device of its own, sequentially and
unchecked. Each test then starts from a fresh device: the emulation is reset before its setup
(new streams from s1, an empty allocator, torch's default seeds, a fresh recording and checker),
so its function-scoped fixtures make their CUDA tensors in its run; the test runs under its first
schedule (the first policy, the test's seed), and a race fails it with the report and the replay
line, as a streamcheck_gpu test's race does on a GPU (reporting.py reads `Findings.recording`).
After its teardown the device finishes its pending work; tensors that outlive the test (module-
or session-scoped fixtures, module-level tensors) keep their values and are copied into the next
test's device when it first uses them (Emulation.adopt).

Without the option a streamcheck_gpu test enters an emulation of its own, left after its teardown.
The emulation itself is entered and reset by fixtures.py (streamcheck_gpu uses it too); these are
the hooks that do it for the run and for every test. Without the option nothing here imports torch.
"""
from __future__ import annotations

import pytest

from .fixtures import EMULATION_KEY, RAISED_KEY, start_emulation, start_session_emulation, stop_emulation
from .options import SETTINGS_KEY, in_use

TIMED_OUT_KEY = pytest.StashKey[bool]()  # set by time_limit.py: the test was interrupted


def emulating(config) -> bool:
    return in_use(config) and config.stash[SETTINGS_KEY].emulate_cuda


def _xdist_controller(config) -> bool:
    """The xdist controller runs no test and collects nothing: its workers emulate."""
    return getattr(config, "workerinput", None) is None and config.getoption("dist", "no") != "no"


@pytest.hookimpl(trylast=True)  # after options.py stashed the settings and usage.py marked the run
def pytest_configure(config: pytest.Config) -> None:
    if emulating(config) and not _xdist_controller(config):
        start_session_emulation(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if emulating(item.config):
        start_emulation(item)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except BaseException as exc:
        if EMULATION_KEY in item.stash:  # stop_emulation counts a capture error the test raised once
            item.stash[RAISED_KEY] = exc
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        stop_emulation(item, finish=not item.stash.get(TIMED_OUT_KEY, False))
