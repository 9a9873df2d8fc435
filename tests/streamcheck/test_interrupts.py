"""Ctrl-C in the `streamcheck` command, wherever it lands: exit status 130 and one line on stderr,
never a traceback (streamcheck/interrupts.py). Each case sends a real SIGINT to the process at one
point (tests/fault_injection/sitecustomize.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamcheck.cli import INTERRUPTED_LINE
from tests.paths import FAULT_INJECTION, ROOT
from tests.sigint import sigint_from_a_terminal


def run_with_fault(fault: str, *argv: str, cwd) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(FAULT_INJECTION), str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, STREAMCHECK_TEST_FAULT=fault)
    with sigint_from_a_terminal():
        return subprocess.run([sys.executable, "-m", "streamcheck", *argv], env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=120)


@pytest.mark.parametrize("fault, argv", [
    ("INT import numpy", ["demo"]),  # the start-up imports: numpy comes with the built-in commands
    ("INT atexit", ["--version"]),  # interpreter shutdown, after every other atexit callback (torch's)
], ids=["start-up-import", "shutdown"])
def test_ctrl_c_gives_one_line_and_130(fault, argv, tmp_path):
    done = run_with_fault(fault, *argv, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (130, INTERRUPTED_LINE + "\n")


def test_a_run_without_ctrl_c_is_untouched_by_the_injector(tmp_path):
    # The injector itself changes nothing: the same command, the fault never reached, succeeds.
    done = run_with_fault("INT import no_such_module_is_imported", "--version", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("streamcheck ")
