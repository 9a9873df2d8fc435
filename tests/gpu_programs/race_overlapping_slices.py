"""Overlapping slices written by two streams: rows [400, 600) are written by both A and B
with nothing ordering them. In program order B's value should win there."""
import cupy

from _common import STEPS, buffers, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1
b = cupy.cuda.Stream(non_blocking=True)  # s2
(x,) = buffers("x")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(x[0:600], step)
    with b:
        fill(x[400:1000], 100 + step)  # BUG: overlaps A's slice, and B does not wait for A
    observed.append(value_of(x, 500))
    expected.append(float(100 + step))
report(observed, expected)
