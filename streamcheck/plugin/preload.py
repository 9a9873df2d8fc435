"""--streamcheck-emulate-cuda runs re-exec pytest with the emulation's native CUDA guard preloaded
(streamcheck/emulation/native): torch's autograd engine needs it on emulated tensors, and torch
reads its CUDA hooks once, at its import, so it must be in the process before torch is, and
before any conftest imports torch. This is the earliest hook that sees the options: the process
replaces itself with the same command line (os.execve), built once and cached; xdist's workers
inherit the preload. A pytest run inside another program (pytester's inline runs) is never
replaced: it goes on without it, as does a run where the library cannot be had, whose backward()
is then refused in one line that says why.
"""
from __future__ import annotations

import sys

import pytest

_TRUE = ("true", "yes", "on", "1")


def _asks_emulation(config) -> bool:
    value = getattr(config.known_args_namespace, "streamcheck_emulate_cuda", None)
    if value is None:
        value = config.getini("streamcheck_emulate_cuda")
    return value is not None and str(value).strip().lower() in _TRUE


def _owns_process(config) -> bool:
    """Whether this pytest is the process's own command line (`pytest ...`, `python -m pytest ...`)."""
    return tuple(config.invocation_params.args) == tuple(sys.argv[1:])


# Outermost (tryfirst wrapper): before pytest's capture starts in this hook and before conftests load.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    if _asks_emulation(early_config) and _owns_process(early_config):
        from ..emulation import native  # imports no torch

        native.reexec_with_library(native.python_argv())
    return (yield)
