"""`streamcheck fuzz --workers N` and its processes: the pytest controller and its xdist workers end
with the command however it ends (SIGKILL too, while the workers still start up), and its scratch
directory is removed at the end or, after a kill, by the next run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.sigint import sigint_from_a_terminal

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="follows processes through /proc (Linux)")
pytest.importorskip("xdist")


def _children() -> dict:
    """parent pid -> child pids, of every process that is not a zombie."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    return children


def _descendants(pid: int) -> list:
    children, found, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _start_fuzz(tmp_path) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("PYTEST_XDIST_WORKER", None)
    with sigint_from_a_terminal():  # the Ctrl-C test's signal must not find SIGINT ignored
        return subprocess.Popen([sys.executable, "-m", "streamcheck", "fuzz", "--backend", "sim", "--workers", "2",
                                 "--budget", "60s", "--steps", "2", "--quiet"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_workers(fuzz: subprocess.Popen) -> list:
    """The controller and both workers, as soon as they exist (the workers may still be importing)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = _descendants(fuzz.pid)
        if len(found) >= 3:
            return found
        time.sleep(0.05)
    pytest.fail("the controller and two workers did not start within 120 s")


def _alive_after(pids: list, seconds: float) -> list:
    """Those of `pids` still running `seconds` from now (or sooner, once none is)."""
    deadline = time.monotonic() + seconds
    while True:
        running = {pid for children in _children().values() for pid in children}
        alive = [pid for pid in pids if pid in running]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def test_sigkill_of_the_command_ends_controller_and_workers_and_the_next_run_removes_its_directory(tmp_path):
    fuzz = _start_fuzz(tmp_path)
    started = _wait_for_workers(fuzz)
    (scratch,) = tmp_path.glob(f"streamcheck-fuzz-{fuzz.pid}-*")
    fuzz.kill()
    fuzz.communicate()
    try:
        assert _alive_after(started, 5) == []  # before the fix: still running 20 s later
    finally:
        for pid in _alive_after(started, 0):
            os.kill(pid, signal.SIGKILL)
    assert scratch.is_dir()  # a SIGKILL leaves it; the next run (below, its first step) removes it

    from streamcheck.atomic_files import owned_temporary_directory

    import tempfile

    tempfile.tempdir, saved = str(tmp_path), tempfile.tempdir
    try:
        with owned_temporary_directory("streamcheck-fuzz"):
            assert not scratch.exists()
    finally:
        tempfile.tempdir = saved


def test_ctrl_c_to_the_command_alone_stops_every_worker_and_keeps_the_table(tmp_path):
    fuzz = _start_fuzz(tmp_path)
    started = _wait_for_workers(fuzz)  # the workers may still be starting up: it must not matter
    fuzz.send_signal(signal.SIGINT)  # to the command only, as `kill -INT` does; not the terminal's group
    out, err = fuzz.communicate(timeout=30)  # long before the 60 s budget: the workers got it too
    try:
        assert _alive_after(started, 5) == []
    finally:
        for pid in _alive_after(started, 0):
            os.kill(pid, signal.SIGKILL)
    assert fuzz.returncode == 130, err
    assert "Traceback" not in out + err
    assert "interrupted (Ctrl-C)" in out and "plans tried: " in out  # the table of what was found so far
    assert list(tmp_path.glob("streamcheck-fuzz-*")) == []
