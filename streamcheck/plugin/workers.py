"""pytest-xdist across GPUs: with `-n N` and --streamcheck-gpus, each worker is pinned to one GPU.

Opt-in (--streamcheck-gpus=auto or a count; 0, the default, pins nothing): the plugin is loaded
by every project in the environment, and a suite whose workers each use several GPUs must keep
its CUDA_VISIBLE_DEVICES. The controller finds the GPUs once and hands the list to every
worker, as seeds.py hands the base seed; worker gwK then sets
CUDA_VISIBLE_DEVICES to GPU K mod count in its pytest_configure, which runs before any test module
is imported, so before CuPy or torch can initialise CUDA there (CUDA reads the variable when the
driver initialises; importing either library does not initialise it). With fewer GPUs than
workers the workers share them round-robin, and the controller says so.

Finding the GPUs imports neither CuPy nor torch: CUDA_VISIBLE_DEVICES's list when it is set (the
GPUs this process may use), else `nvidia-smi -L`, else the driver's cuDeviceGetCount through
ctypes, else none (a CPU machine: nothing is pinned).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import warnings
from typing import Optional

import pytest

from .options import bad_value, option_value
from .usage import TIMING_MARKER

GPUS_KEY = "streamcheck_gpus"  # in xdist's workerinput: the GPU ids the workers share
GPU_LIST_KEY = pytest.StashKey[list]()
VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus() -> Optional[list]:
    """The ids CUDA_VISIBLE_DEVICES lists, up to the first invalid one (CUDA ignores the rest;
    `-1` hides every GPU); None when it is not set."""
    value = os.environ.get(VISIBLE)
    if value is None:
        return None
    ids = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        ids.append(entry)
    return ids


def nvidia_smi_count() -> Optional[int]:
    """GPUs `nvidia-smi -L` lists (its `GPU n: ...` lines; MIG instances are indented under them)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def driver_count() -> Optional[int]:
    """cuDeviceGetCount from libcuda (no CUDA context is created); None without a driver."""
    for name in ("libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return None


def detect_gpus() -> list:
    """The GPU ids workers may be pinned to (strings, as CUDA_VISIBLE_DEVICES takes them)."""
    visible = visible_gpus()
    if visible is not None:
        return visible
    for count in (nvidia_smi_count(), driver_count()):
        if count is not None:
            return [str(i) for i in range(count)]
    return []


def gpu_list(config) -> list:
    """The controller's GPU list from --streamcheck-gpus (cached): auto detects, N means GPUs 0..N-1
    (whether or not they exist: for tests and for machines the tools cannot see), 0 (the default) none."""
    ids = config.stash.get(GPU_LIST_KEY, None)
    if ids is None:
        value, source = option_value(config, "streamcheck_gpus")
        if value == "auto":
            ids = detect_gpus()
        elif value.isdigit():
            ids = [str(i) for i in range(int(value))]
        else:
            raise bad_value(source, value, "auto, or a number of GPUs >= 0 (0: no pinning)")
        config.stash[GPU_LIST_KEY] = ids
    return ids


def worker_index(workerid: str) -> Optional[int]:
    """K of xdist's worker id gwK (None for an id of another form)."""
    return int(workerid[2:]) if workerid.startswith("gw") and workerid[2:].isdigit() else None


def pinning(ids: list, workers: int) -> str:
    """What the controller says about the pinning of `workers` workers to `ids`."""
    if workers <= len(ids):
        placed = ", ".join(f"gw{k} on GPU {ids[k]}" for k in range(workers))
        return f"streamcheck: xdist workers pinned one per GPU (CUDA_VISIBLE_DEVICES): {placed}"
    shared = "; ".join(f"{', '.join(f'gw{k}' for k in range(g, workers, len(ids)))} on GPU {gpu}"
                       for g, gpu in enumerate(ids))
    return (f"streamcheck: {workers} xdist workers but {len(ids)} GPU{'s' if len(ids) != 1 else ''}: fewer GPUs "
            f"than workers, so the run goes on with the GPUs there are and the workers share them round-robin "
            f"(CUDA_VISIBLE_DEVICES): {shared}")


def shared_gpu(config) -> Optional[str]:
    """Why this xdist worker does not have its GPU to itself (workers outnumber the GPUs, or none
    are pinned), or None: a timing test (streamcheck_gpu_timing) is only meaningful alone on its GPU, since
    another worker's kernels delay its streams as an injected delay would."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    ids = workerinput.get(GPUS_KEY) or []
    workers = int(workerinput.get("workercount", 1))
    if workers <= max(len(ids), 1) and (ids or workers == 1):
        return None
    return (f"{workers} xdist workers share {len(ids) or 'the'} GPU{'s' if len(ids) != 1 else ''}"
            + ("" if ids else " (none pinned: --streamcheck-gpus=auto pins one per worker)"))


def pytest_runtest_setup(item) -> None:
    # After pytest's own skipif marks (its hook runs first): a machine without a GPU says so.
    if item.get_closest_marker(TIMING_MARKER) is not None:
        why = shared_gpu(item.config)
        if why is not None:
            pytest.skip(f"timing test: it needs the GPU to itself and {why}; run it without -n (or with no more "
                        "workers than GPUs)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Worker gwK: CUDA_VISIBLE_DEVICES = GPU K mod count, first of all configure hooks and before
    any test module is imported. Controller: a bad --streamcheck-gpus stops the run at start-up."""
    config.addinivalue_line("markers", f"{TIMING_MARKER}: a GPU test whose outcome depends on timing (a race that "
                                       "must not strike without its delay); skipped when xdist workers share a GPU")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        value, source = option_value(config, "streamcheck_gpus")
        if value != "auto" and not value.isdigit():
            raise bad_value(source, value, "auto, or a number of GPUs >= 0 (0: no pinning)")
        return
    ids = workerinput.get(GPUS_KEY)
    if not ids:
        return
    k = worker_index(str(workerinput.get("workerid", "")))
    if k is None:
        warnings.warn(pytest.PytestConfigWarning(
            f"streamcheck: xdist worker id {workerinput.get('workerid')!r} is not gwN; not pinned to a GPU"))
        return
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        warnings.warn(pytest.PytestConfigWarning(
            f"streamcheck: CUDA was initialised in worker gw{k} before pytest_configure (by a conftest?); "
            f"{VISIBLE} set now does not move it to GPU {ids[k % len(ids)]}"))
    os.environ[VISIBLE] = ids[k % len(ids)]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker gets the controller's GPU list; the first says how they share it."""
    config = node.config
    ids = gpu_list(config)
    node.workerinput[GPUS_KEY] = ids
    if ids and node.workerinput.get("workerid") == "gw0":
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        message = pinning(ids, int(node.workerinput.get("workercount", 1)))
        if reporter is not None:
            reporter.write_line(message)
