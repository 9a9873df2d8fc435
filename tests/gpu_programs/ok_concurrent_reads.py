"""Concurrent reads: A and B read y at the same time (const pointers), each into its own
output; reads never race with reads."""
import cupy

from _common import STEPS, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1
b = cupy.cuda.Stream(non_blocking=True)  # s2
y, z1, z2 = buffers("y", "z1", "z2")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    b.wait_event(a.record())
    with a:
        copy(y, z1)
    with b:
        copy(y, z2)
    observed += [value_of(z1), value_of(z2)]
    expected += [float(step), float(step)]
report(observed, expected)
