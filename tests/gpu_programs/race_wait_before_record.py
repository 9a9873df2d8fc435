"""Wait issued before the record: B's wait captures the event's *previous* record (or none,
a no-op, on the first step), so it does not cover this step's producer."""
import cupy

from _common import STEPS, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
b = cupy.cuda.Stream(non_blocking=True)  # s2: consumer
done = cupy.cuda.Event()
y, z = buffers("y", "z")
observed, expected = [], []
for step in range(1, STEPS + 1):
    b.wait_event(done)  # BUG: issued before the record below
    with a:
        fill(y, step)
    done.record(a)
    with b:
        copy(y, z)
    observed.append(value_of(z))
    expected.append(float(step))
report(observed, expected)
