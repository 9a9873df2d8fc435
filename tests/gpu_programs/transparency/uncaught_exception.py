# transparency-exit: 1
"""Prints a result, then raises: both runs must print the same output, end with the same
exception line and exit with status 1, as Python does for an uncaught exception."""
import cupy


def check(values):
    if float(values.sum()) > 0:
        raise ValueError("raised on purpose after printing")


values = cupy.ones(4, dtype=cupy.float32)
print("values", values.get().tolist())
check(values)
