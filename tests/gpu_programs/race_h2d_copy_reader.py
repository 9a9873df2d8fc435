"""An async host-to-device copy raced by a reader: ndarray.set() enqueues the copy on the
current stream (A); the reader on B does not wait for it."""
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
        x.set(host)  # async H2D copy on a
    with b:
        copy(x, z)  # BUG: no b.wait_event(a.record())
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
