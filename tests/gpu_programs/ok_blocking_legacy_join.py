"""Correct twin of race_nonblocking_legacy_join.py: with a blocking stream, work issued to
the legacy default stream waits for it (CUDA's implicit legacy-stream synchronization)."""
import cupy

from _common import STEPS, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=False)  # s1: blocking: the legacy stream joins it
y, z = buffers("y", "z")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    copy(y, z)  # on the legacy default stream: waits for earlier work on blocking streams
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
