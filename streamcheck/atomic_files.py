"""Files and directories that appear whole or not at all, and the temporaries a killed writer leaves.

Every output streamcheck and its commands write (JSON reports, Perfetto traces, timelines, the
trace directory of a failing test, a folded checkpoint's files) goes through here:

    write_file(path, write)        write(temporary) fills a temporary file next to `path`; it is
                                   flushed to disk and renamed onto `path` (replacing an old one)
    write_text(path, text)         the same for a string
    write_directory(path, fill)    fill(temporary) fills a temporary directory next to `path`,
                                   renamed onto `path` once complete
    sync_tree(directory)           flush a directory's files and the directory itself to disk
    sync_directory(directory)      flush a directory's names (after a rename into it)
    remove_stale_temporaries(dir)  remove the temporaries of writers that are dead
    owned_temporary_directory(p)   a scratch directory in the system's temp folder, removed at the end
                                   (or by the next run, if this process is killed)

A rename is atomic only within one filesystem, so the temporary is a sibling of its target. It is
named `.NAME.PID-TOKEN.tmp.SUFFIX` (SUFFIX kept: matplotlib picks the format from it): a later
writer into the same directory removes the ones whose PID is no longer a running process. Without
the fsync before the rename, a crash of the machine could leave the new name pointing at
unwritten blocks (ext4, xfs with delayed allocation).
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator

# `.NAME.PID-TOKEN.tmp` or `.NAME.PID-TOKEN.tmp.SUFFIX`; `.NAME.PID.tmp.SUFFIX` too, as repro wrote them before.
_TEMPORARY = re.compile(r"\..+\.(?P<pid>\d+)(-[0-9a-f]{8})?\.tmp(\.[^.]+)?")


def owner_alive(pid: int) -> bool:
    """Whether `pid` is a running process (another user's counts: it may still be writing)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temporary_path(path: str | os.PathLike, directory: bool = False) -> str:
    """A fresh temporary name next to `path`, owned by this process (a file's keeps its suffix)."""
    head, base = os.path.split(os.path.abspath(path))
    stem, suffix = (base, "") if directory else os.path.splitext(base)
    return os.path.join(head, f".{stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{suffix}")


def remove_stale_temporaries(directory: str | os.PathLike) -> list:
    """Remove the temporaries in `directory` whose writer is dead; return their paths."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:  # missing or unreadable: the write that follows says so
        return removed
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None or owner_alive(int(match["pid"])):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except FileNotFoundError:  # another writer removed it first
            pass
        except OSError:  # not ours to remove (another user's directory): leave it
            continue
        removed.append(entry.path)
    return removed


def _sync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(directory: str | os.PathLike) -> None:
    """fsync a directory: the names created, renamed or removed in it reach the disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # a filesystem without fsync on directories: the rename happened all the same
        pass
    finally:
        os.close(fd)


def sync_tree(directory: str | os.PathLike) -> None:
    """fsync every file under `directory`, then each directory (a new name lives in its directory)."""
    for folder, _dirs, files in os.walk(directory, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                _sync_file(path)
        sync_directory(folder)


def write_file(path: str | os.PathLike, write: Callable[[str], object]) -> str:
    """Call write(temporary), then put the finished file at `path` in one rename; return `path`.

    On any failure (or a kill) `path` keeps what it had, and the temporary is removed (or, after
    a kill, by the next write into the directory)."""
    path = os.fspath(path)
    remove_stale_temporaries(os.path.dirname(os.path.abspath(path)))
    temporary = temporary_path(path)
    try:
        write(temporary)
        _sync_file(temporary)
        os.replace(temporary, path)
    except OSError as exc:
        if exc.filename is None or exc.filename == temporary:  # the caller's name, not our temporary's
            exc.filename = path
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    sync_directory(os.path.dirname(os.path.abspath(path)))
    return path


def write_text(path: str | os.PathLike, text: str) -> str:
    def write(name: str) -> None:
        with open(name, "w", encoding="utf-8") as f:
            f.write(text)

    return write_file(path, write)


def write_directory(path: str | os.PathLike, fill: Callable[[str], object]) -> str:
    """Call fill(temporary directory), then put the finished directory at `path`; return `path`.

    An older directory at `path` is replaced: it is renamed aside first, so `path` holds the old
    directory, nothing, or the new one, never a mixture."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(parent)
    temporary = temporary_path(path, directory=True)
    os.mkdir(temporary)
    try:
        fill(temporary)
        sync_tree(temporary)
        if os.path.isdir(path) and not os.path.islink(path):
            old = temporary_path(path, directory=True)
            os.rename(path, old)  # POSIX rename cannot replace a non-empty directory
            os.rename(temporary, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temporary, path)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    sync_directory(parent)
    return path


@contextlib.contextmanager
def owned_temporary_directory(prefix: str) -> Iterator[str]:
    """A new directory `PREFIX-PID-TOKEN` in the system's temp folder, removed at the end.

    A process killed inside leaves it behind; the next one with the same prefix removes it
    (its PID is dead) before making its own."""
    base = tempfile.gettempdir()
    owned = re.compile(re.escape(prefix) + r"-(?P<pid>\d+)-[0-9a-f]{8}")
    for entry in os.scandir(base):
        match = owned.fullmatch(entry.name)
        if match and not owner_alive(int(match["pid"])) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
    path = os.path.join(base, f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(path, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
