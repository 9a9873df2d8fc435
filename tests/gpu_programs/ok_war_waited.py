"""Correct twin of race_war_reused_buffer.py: the producer waits for an event recorded on the
consumer's stream after its read before overwriting y."""
import cupy

from _common import N, STEPS, buffers, copy, fill, report

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
b = cupy.cuda.Stream(non_blocking=True)  # s2: consumer
(y,) = buffers("y")
(out,) = buffers("out", n=STEPS * N)
rows = out.reshape(STEPS, N)
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    b.wait_event(a.record())
    with b:
        copy(y, rows[step - 1])
    a.wait_event(b.record())  # the WAR edge: y is free again only after the copy
cupy.cuda.Device().synchronize()
host = out.get()
report([float(host[i * N]) for i in range(STEPS)], [float(s) for s in range(1, STEPS + 1)])
