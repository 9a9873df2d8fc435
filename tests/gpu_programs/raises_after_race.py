"""A race, then an uncaught exception: streamcheck run prints the script's traceback, exits
with its status (1) unless --error-exitcode applies, and still reports the race."""
import cupy

from _common import buffers, copy, fill

a = cupy.cuda.Stream(non_blocking=True)
b = cupy.cuda.Stream(non_blocking=True)
y, z = buffers("y", "z")
with a:
    fill(y, 1)
with b:
    copy(y, z)  # BUG: no wait
raise RuntimeError("boom after the race")
