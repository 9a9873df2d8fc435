"""Event recorded before the producer: the event captures A's work *so far*, which does not
include the fill issued after it."""
import cupy

from _common import STEPS, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
b = cupy.cuda.Stream(non_blocking=True)  # s2: consumer
y, z = buffers("y", "z")
observed, expected = [], []
for step in range(1, STEPS + 1):
    ready = a.record()  # BUG: recorded before the producer is issued
    with a:
        fill(y, step)
    b.wait_event(ready)
    with b:
        copy(y, z)
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
