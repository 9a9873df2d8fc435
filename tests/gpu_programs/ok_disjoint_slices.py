"""Correct twin of race_overlapping_slices.py: the two streams write disjoint slices."""
import cupy

from _common import STEPS, buffers, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1
b = cupy.cuda.Stream(non_blocking=True)  # s2
(x,) = buffers("x")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(x[0:500], step)
    with b:
        fill(x[500:1000], 100 + step)
    observed += [value_of(x, 499), value_of(x, 500)]
    expected += [float(step), float(100 + step)]
report(observed, expected)
