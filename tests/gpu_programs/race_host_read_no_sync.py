"""Host read without a sync: ndarray.get() synchronizes only the current (legacy) stream,
not the non-blocking stream that wrote the array."""
import cupy

from _common import STEPS, buffers, fill, report

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
(y,) = buffers("y")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    observed.append(float(y[:1].get()[0]))  # BUG: no a.synchronize() first
    expected.append(float(step))
    cupy.cuda.Device().synchronize()  # keep the steps apart
report(observed, expected)
