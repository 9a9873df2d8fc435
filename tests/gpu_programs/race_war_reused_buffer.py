"""Write-after-read on a reused buffer: the next step's producer overwrites y while the
consumer of the previous step may still be reading it. Delay s2 (the consumer)."""
import cupy

from _common import N, STEPS, buffers, copy, fill, report

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
b = cupy.cuda.Stream(non_blocking=True)  # s2: consumer
(y,) = buffers("y")
(out,) = buffers("out", n=STEPS * N)
rows = out.reshape(STEPS, N)
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)  # BUG: from step 2 on, overwrites y without waiting for the previous copy
    b.wait_event(a.record())
    with b:
        copy(y, rows[step - 1])
cupy.cuda.Device().synchronize()
host = out.get()
report([float(host[i * N]) for i in range(STEPS)], [float(s) for s in range(1, STEPS + 1)])
