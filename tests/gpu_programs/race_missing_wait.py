"""Missing wait: the consumer on stream B reads y while the producer on stream A may still
be writing it. Delay stream s1 (A) and B copies the previous step's value."""
import cupy

from _common import STEPS, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
b = cupy.cuda.Stream(non_blocking=True)  # s2: consumer
y, z = buffers("y", "z")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    with b:
        copy(y, z)  # BUG: no b.wait_event(a.record()) before reading y
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
