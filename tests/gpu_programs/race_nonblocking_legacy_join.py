"""Relying on the legacy default stream's implicit join with a non-blocking stream: work on
the legacy stream waits for *blocking* streams only, so the consumer does not wait for A."""
import cupy

from _common import STEPS, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1: BUG: non-blocking, never joined by the legacy stream
y, z = buffers("y", "z")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    copy(y, z)  # on the legacy default stream (CuPy's current stream by default)
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
