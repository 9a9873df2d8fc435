"""Correct twin of race_host_read_no_sync.py: each step orders the host after the producer
another way: stream synchronize, event synchronize, Device().synchronize(), runtime
deviceSynchronize."""
import cupy

from _common import buffers, fill, report

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
(y,) = buffers("y")
syncs = [
    lambda: a.synchronize(),
    lambda: a.record().synchronize(),
    lambda: cupy.cuda.Device().synchronize(),
    lambda: cupy.cuda.runtime.deviceSynchronize(),
]
observed, expected = [], []
for step, sync in enumerate(syncs, start=1):
    with a:
        fill(y, step)
    sync()
    observed.append(float(y[:1].get()[0]))
    expected.append(float(step))
report(observed, expected)
