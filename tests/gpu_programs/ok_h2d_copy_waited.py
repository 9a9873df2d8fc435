"""Correct twin of race_h2d_copy_reader.py: the reader waits for the copy's stream."""
import cupy
import numpy as np

from _common import N, STEPS, buffers, copy, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1: copy stream
b = cupy.cuda.Stream(non_blocking=True)  # s2: reader
x, z = buffers("x", "z")
observed, expected = [], []
for step in range(1, STEPS + 1):
    host = np.full(N, step, dtype=np.float32)
    with a:
        x.set(host)
    b.wait_event(a.record())
    with b:
        copy(x, z)
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
