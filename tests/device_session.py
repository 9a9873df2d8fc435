"""A pytest plugin for GPU sessions, where one command may run 600 s at most and what it
printed comes back only from files it wrote (load it with `-p tests.device_session`):

    --shard K/N         run the K-th of N disjoint parts of the collected tests (K from 1), chosen
                        by crc32 of each test's node id, so a part does not depend on collection
                        order and N parts together run every test once
    --failures-log F    append each failure (its node id, phase and traceback) to F as it happens:
                        a command that runs out of time still tells which tests failed and why
                        (pytest's summary, and xdist's, come only at the end)

benchmarks/gpu_session.sh runs the `gpu` tests this way.
"""
from __future__ import annotations

import zlib

import pytest

TRACEBACK_CHARS = 6000  # per failure: the assertion and the frames around it
SHARD = pytest.StashKey[tuple]()  # (K, N), parsed once at configure


def _shard(text: str) -> tuple:
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard: expected K/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard: K must be between 1 and N, got {text!r}")
    return k, n


def pytest_addoption(parser):
    group = parser.getgroup("device session")
    group.addoption("--shard", default=None, help="run part K of N of the tests (K/N, K from 1)")
    group.addoption("--failures-log", default=None, help="append each failure to this file as it happens")


def pytest_configure(config):
    text = config.getoption("--shard")
    if text is not None:
        config.stash[SHARD] = _shard(text)  # a bad value is a usage error before anything runs
    path = config.getoption("--failures-log")
    if path and not hasattr(config, "workerinput"):  # xdist: the controller writes, its workers do not
        config.pluginmanager.register(FailuresLog(path), "device-session-failures-log")


class FailuresLog:
    def __init__(self, path: str):
        self.path = path

    def pytest_runtest_logreport(self, report):
        if report.failed:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-TRACEBACK_CHARS:]}\n")


def pytest_collection_modifyitems(config, items):
    if SHARD not in config.stash:
        return
    k, n = config.stash[SHARD]
    keep, drop = [], []
    for item in items:
        (keep if zlib.crc32(item.nodeid.encode()) % n == k - 1 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
