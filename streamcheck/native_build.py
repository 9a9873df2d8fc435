"""streamcheck's C++ libraries, built on the user's machine against the installed torch (its headers
and libc10 / libtorch_cpu), so that they match the torch the program runs: the emulation's CUDA
guard (emulation/native/) and the recorder's operator observer (record/native/).

Each is built with the machine's C++ compiler ($CXX, else g++) once per torch, Python (for a library
that reads Python's frames) and source: cached under $STREAMCHECK_CACHE_DIR (default
~/.cache/streamcheck)/native/, behind a file lock so that parallel workers build it once, and
written whole or not at all. No CUDA toolkit is needed: the sources use c10's device-generic APIs.
Nothing here imports torch (importlib finds it), so a process about to re-exec pays nothing for it.

A library that cannot be had (no compiler, no headers, a failed build) raises NativeUnavailable
with one line that says why and what to do.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

# NDEBUG as torch's release builds have it: some of its headers' structs (RecordFunction) have
# debug-only members, and a library compiled without it would read them at the wrong offsets.
_COMPILE_FLAGS = ("-O2", "-DNDEBUG", "-std=c++20", "-fPIC", "-shared", "-Wall")


class NativeUnavailable(RuntimeError):
    """A library cannot be had here: one line that says why and what to do."""


@dataclass(frozen=True)
class NativeLibrary:
    """One library to build: its file name, its C++ source, and whether it is compiled against this
    Python's headers too (Python.h and the interpreter's frame layout, which change between minor
    versions: the cache key then names this Python)."""

    name: str
    source: Path
    python: bool = False
    headers: tuple = ()  # the Paths of the headers of ours it includes (part of the cache key, as the source)


def torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise NativeUnavailable("torch is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def cache_root() -> Path:
    given = os.environ.get("STREAMCHECK_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "streamcheck"


def _python_include() -> Path:
    return Path(sysconfig.get_paths()["include"])


def library_path(library: NativeLibrary) -> Path:
    """Where `library` is for this torch (and Python) and this source, built or not: keyed by torch's
    version, its location (the library links to its files), the source's and the flags' hash."""
    root = torch_dir()
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    parts = [library.source.read_bytes(), *(header.read_bytes() for header in library.headers), str(root).encode(),
             " ".join(_COMPILE_FLAGS).encode()]
    if library.python:
        parts += [str(_python_include()).encode(), sys.version.encode()]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    return cache_root() / "native" / f"torch-{version}-{digest.hexdigest()[:16]}" / library.name


def build(library: NativeLibrary, before_building: Optional[Callable[[Path], None]] = None) -> Path:
    """The library, built now unless the cache has it (one build at a time: a file lock).
    `before_building(torch_dir)` may refuse a build with NativeUnavailable (a cached library is
    taken as it is)."""
    import fcntl

    path = library_path(library)
    if path.exists():
        return path
    root = torch_dir()
    if before_building is not None:
        before_building(root)
    lib = root / "lib"
    if not (lib / "libc10.so").exists() or not (root / "include" / "c10").is_dir():
        raise NativeUnavailable(f"torch at {root} has no C++ headers or libc10.so to build against")
    includes = [f"-I{root / 'include'}"]
    if library.python:
        include = _python_include()
        if not (include / "Python.h").exists():
            raise NativeUnavailable(f"this Python has no C headers ({include / 'Python.h'} is missing); install them "
                                    f"(the python{sys.version_info[0]}.{sys.version_info[1]}-dev package)")
        includes.append(f"-I{include}")
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise NativeUnavailable("no C++ compiler (g++) to build it; install one (apt-get install g++)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.parent / "build.lock", "w")
    except OSError as exc:
        raise NativeUnavailable(f"cannot write its cache {path.parent} ({exc.strerror}); set STREAMCHECK_CACHE_DIR "
                                "to a writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits here, then finds the library built
        if path.exists():
            return path
        partial = path.with_name(f"{library.name}.{os.getpid()}.partial")
        command = [compiler, *_COMPILE_FLAGS, *includes, str(library.source), "-o", str(partial),
                   f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]  # rpath: no LD_LIBRARY_PATH needed
        try:
            done = subprocess.run(command, capture_output=True, text=True)
        except OSError as exc:
            raise NativeUnavailable(f"the C++ compiler {compiler} could not run ({exc.strerror})") from None
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines() or [""]
            raise NativeUnavailable(f"building it with {compiler} failed: {errors[0].strip()}")
        os.replace(partial, path)  # whole or absent: a reader never sees a partial library
    return path
