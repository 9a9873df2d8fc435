"""Outputs appear whole or not at all, and what a killed writer leaves is removed by the next one
(streamcheck/atomic_files.py; the trace directory of failing tests: plugin/test_trace_files.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from streamcheck.atomic_files import (owned_temporary_directory, remove_stale_temporaries, write_directory,
                                      write_file, write_text)
from tests.paths import ROOT


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "report.json"
    write_text(target, "old\n")

    def half_then_fail(name):
        with open(name, "w") as f:
            f.write("{\"half\": ")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_file(target, half_then_fail)
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["report.json"]


def test_sigkill_mid_write_leaves_the_old_file_and_the_next_write_removes_the_temporary(tmp_path):
    target = tmp_path / "t.png"
    target.write_bytes(b"old")
    killed = subprocess.Popen([sys.executable, "-c", f"""
import os, signal
from streamcheck.atomic_files import write_file
def half_then_killed(name):
    with open(name, "wb") as f:
        f.write(b"\\x89PNG half")
    os.kill(os.getpid(), signal.SIGKILL)
write_file({str(target)!r}, half_then_killed)
"""], cwd=ROOT)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert target.read_bytes() == b"old"
    (left,) = set(os.listdir(tmp_path)) - {"t.png"}
    assert left.startswith(f".t.{killed.pid}-") and left.endswith(".tmp.png")
    write_file(target, lambda name: open(name, "wb").write(b"new"))
    assert os.listdir(tmp_path) == ["t.png"] and target.read_bytes() == b"new"


def test_only_temporaries_of_dead_writers_are_removed(tmp_path):
    dead = dead_pid()
    stale = [f".t.{dead}.tmp.png", f".perfetto.{dead}-0123abcd.tmp.json", f".test_x.{dead}-89abcdef.tmp"]
    for name in stale[:2]:
        (tmp_path / name).write_bytes(b"")  # as repro left them: 0 bytes
    (tmp_path / stale[2]).mkdir()
    (tmp_path / stale[2] / "trace.json").write_text("[]")
    live = f".t.{os.getpid()}-0123abcd.tmp.png"  # this process may still be writing it
    mine = ["t.png", ".hidden.tmp", "notes.1234.tmp.txt"]  # not temporaries of ours
    for name in [live, *mine]:
        (tmp_path / name).write_bytes(b"x")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(os.path.basename(p) for p in removed) == sorted(stale)
    assert sorted(os.listdir(tmp_path)) == sorted([live, *mine])


def test_a_directory_is_replaced_whole(tmp_path):
    target = tmp_path / "test_racy"

    def fill(files):
        def write(folder):
            for name, text in files.items():
                write_text(os.path.join(folder, name), text)
        return write

    def half_then_fail(folder):
        write_text(os.path.join(folder, "trace.json"), "2")
        raise RuntimeError("exporter failed")

    write_directory(target, fill({"trace.json": "1", "old-only.txt": "x"}))
    with pytest.raises(RuntimeError):
        write_directory(target, half_then_fail)
    assert sorted(os.listdir(target)) == ["old-only.txt", "trace.json"]  # the old one, untouched
    write_directory(target, fill({"trace.json": "3", "report.txt": "r"}))
    assert {p: (target / p).read_text() for p in os.listdir(target)} == {"trace.json": "3", "report.txt": "r"}
    assert os.listdir(tmp_path) == ["test_racy"]


def test_owned_scratch_directories_of_dead_processes_are_removed_at_the_next_start(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"streamcheck-fuzz-{dead_pid()}-0123abcd"
    (dead / "tallies").mkdir(parents=True)
    alive = tmp_path / f"streamcheck-fuzz-{os.getppid()}-0123abcd"  # pytest's parent: running
    alive.mkdir()
    with owned_temporary_directory("streamcheck-fuzz") as folder:
        assert os.path.basename(folder).startswith(f"streamcheck-fuzz-{os.getpid()}-")
        assert sorted(os.listdir(tmp_path)) == sorted([alive.name, os.path.basename(folder)])
    assert os.listdir(tmp_path) == [alive.name]
