"""Correct twin of race_missing_wait.py: B waits for an event recorded on A after the producer."""
import cupy

from _common import STEPS, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
b = cupy.cuda.Stream(non_blocking=True)  # s2: consumer
y, z = buffers("y", "z")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    b.wait_event(a.record())
    with b:
        copy(y, z)
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
