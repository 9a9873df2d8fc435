"""A team's GPU test suite: streams and events, pinned memory and a DataLoader, host threads,
training with autograd, CUDA graphs and memory statistics, written as such a suite is written
for a GPU (tests guarded by `skipif(not torch.cuda.is_available())` or a module-level
`TEST_CUDA` flag, fixtures that make CUDA tensors and models). streamcheck keeps it as the
acceptance test of its CUDA emulation (issue 36).

Each `test_race_<name>` is a stream-synchronization bug as projects shipped it, and its
`test_fixed_<name>` twin is the fix they shipped; every other test checks plain GPU behaviour.

How it runs:
- On a CUDA machine: `pytest tests/emulated_suite`. Every test but the racy ones passes. A racy
  test passes or fails by timing (its race strikes only when the GPU happens to run the work in
  the wrong order), except `test_race_graph_fork_unjoined`, which CUDA refuses at every capture.
- On a CPU-only machine: `pytest --streamcheck-emulate-cuda tests/emulated_suite`. CUDA is
  emulated on streamcheck's sim: no test is skipped for want of a GPU, each racy test fails with
  the race report (its kind and the lines of this suite), and each fixed twin passes.
  tests/streamcheck/plugin/test_emulated_suite.py runs it so in CI.
- The project's own run (`pytest` at the repository root) does not collect this folder; a run that
  names it (or a path in it) does.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

HERE = Path(__file__).parent.resolve()


def pytest_ignore_collect(collection_path, config):
    """Collected only by a run that names this folder or a path in it."""
    for arg in config.args:
        named = Path(arg.split("::")[0]).resolve()
        if named == HERE or HERE in named.parents:
            return None
    return True


@pytest.fixture
def side_stream():
    """A fresh non-blocking stream beside the current one."""
    return torch.cuda.Stream()


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()


@pytest.fixture(scope="module")
def eval_model():
    """One model per module, on the GPU, for tests that only run it forward."""
    model = make_model(seed=0).eval()
    yield model
    torch.cuda.synchronize()


@pytest.fixture
def fresh_model():
    """A model of the test's own, on the GPU, for tests that train it."""
    return make_model(seed=1)


@pytest.fixture
def batch():
    """Inputs and regression targets on the GPU (targets: the inputs' sums)."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(64, 8, generator=generator)
    return x.cuda(), x.sum(dim=1, keepdim=True).cuda()


@pytest.fixture
def clean_memory():
    """The device idle, its cache emptied, its peaks and counters reset: memory statistics start here."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    yield
    torch.cuda.synchronize()
