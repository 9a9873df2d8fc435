# transparency-exit: 3
"""Prints a result, then exits with status 3 on purpose: `streamcheck run` must keep the
program's own exit status (and its output) when no --error-exitcode is given."""
import sys

import cupy

squares = cupy.arange(10) ** 2
print("squares", squares.get().tolist())
print("exiting with status 3 on purpose")
sys.exit(3)
