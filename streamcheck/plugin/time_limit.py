"""One time limit for a whole test (--streamcheck-timeout, or the streamcheck marker's timeout=):
every test under --streamcheck-emulate-cuda, and every test with streamcheck_gpu or
streamcheck_device. A test still running when it is up is interrupted and fails, saying where it
was (the user's frames), what it had finished and its last device call; the next test runs.

Its setup, call and teardown share the limit (teardown gets at least TEARDOWN_SECONDS, capped at
the limit, so a hung test's fixtures are still torn down). The test runs in pytest's own thread,
as without the limit (the emulation's function mode and current streams are that thread's):
timeout.TimeLimit interrupts it there, with a signal that wakes a blocking call (time.sleep) too.
run_schedules bounds its own runs (fixtures.py); this limit stands a little further out
(MARGIN_SECONDS), so its failure, which names the schedule, comes first.
"""
from __future__ import annotations

import pytest

from .emulation import TIMED_OUT_KEY, emulating
from .options import SETTINGS_KEY, in_use

TEARDOWN_SECONDS = 10.0
MARGIN_SECONDS = 1.5  # run_schedules' limit, then its run's UNWIND_SECONDS to unwind
LIMITED_FIXTURES = ("streamcheck_gpu", "streamcheck_device")
DEADLINE_KEY = pytest.StashKey[object]()
PHASES_KEY = pytest.StashKey[list]()  # the phases that finished


def _limit(item) -> float:
    """The test's limit in seconds (0: none): only for the tests this module bounds."""
    config = item.config
    if not in_use(config):
        return 0.0
    if not (emulating(config) or any(name in getattr(item, "fixturenames", ()) for name in LIMITED_FIXTURES)):
        return 0.0
    from .fixtures import _test_config

    try:
        return _test_config(item, config.stash[SETTINGS_KEY]).timeout
    except pytest.fail.Exception:  # a bad marker: its own failure, in the test's setup
        return 0.0


def _bounded(item, when: str):
    """Run one phase of the test within the test's limit."""
    from ..timeout import Deadline, RunTimedOut, TimeLimit

    if when == "setup":
        limit = _limit(item)
        item.stash[DEADLINE_KEY] = Deadline(limit) if limit else None
        item.stash[PHASES_KEY] = []
    deadline = item.stash.get(DEADLINE_KEY, None)
    if deadline is None:
        return (yield)
    seconds = deadline.remaining() + MARGIN_SECONDS
    if when == "teardown" and deadline.expired:
        seconds = min(TEARDOWN_SECONDS, deadline.seconds)
    try:
        with TimeLimit(seconds):
            result = yield
    except RunTimedOut as exc:
        item.stash[TIMED_OUT_KEY] = True
        problem = _timed_out_text(item, when, deadline, exc)
    else:
        item.stash[PHASES_KEY].append(when)
        return result
    pytest.fail(problem, pytrace=False)  # outside the except: no "during handling" chain


def _timed_out_text(item, when: str, deadline, exc) -> str:
    from ..timeout import last_operation
    from .fixtures import where_it_was
    from .reporting import findings

    found = findings(item)
    device = found.device if found.device is not None else getattr(found.recording, "device", None)
    finished = item.stash.get(PHASES_KEY, [])
    lines = [f"streamcheck: {item.nodeid} did not finish within {deadline.seconds:g} s (--streamcheck-timeout or "
             f"the streamcheck marker's timeout=, for the whole test): interrupted in its {when} "
             f"(finished: {', '.join(finished) if finished else 'nothing'})",
             *where_it_was(exc, item.config)]
    if device is not None and hasattr(device, "trace"):
        lines.append(f"  last recorded operation: {last_operation(device)}")
    if found.replay:
        lines.append(f"replay: {found.replay}")
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: the emulation's own setup is within the limit
def pytest_runtest_setup(item):
    return (yield from _bounded(item, "setup"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    return (yield from _bounded(item, "call"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _bounded(item, "teardown"))
