"""Over-synchronized CuPy steps, as people ship them, for `streamcheck run --audit-syncs`:
a host synchronize before a device-side consumer, a double wait, a device synchronize after
a host read already ordered everything, and a busy loop on stream.done.

    python audit_oversync_cupy.py [STEPS]    (default 3)
"""
import sys

import cupy

from _common import buffers, copy, fill, report

a = cupy.cuda.Stream(non_blocking=True)  # s1: producer
b = cupy.cuda.Stream(non_blocking=True)  # s2: consumer
x, y = buffers("x", "y")
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(x, step)
    a.synchronize()  # host sync whose only use is ordering b after a: a device-side wait suffices
    with b:
        copy(x, y)
    done = b.record()
    a.wait_event(done)
    a.wait_event(done)  # the same wait twice: redundant
    while not a.done:  # a busy loop on a query: timing-dependent, never offered for removal
        pass
    observed.append(float(y[:1].get(stream=b)[0]))  # host read: the host needs this sync
    cupy.cuda.Device().synchronize()  # implied by the host read's sync and the loop
    expected.append(float(step))
report(observed, expected)
