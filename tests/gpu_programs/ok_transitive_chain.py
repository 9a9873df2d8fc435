"""Transitive event chain: C waits only for B, which waited for A, so C may read A's output."""
import cupy

from _common import STEPS, add_arrays, buffers, copy, fill, report, value_of

a = cupy.cuda.Stream(non_blocking=True)  # s1
b = cupy.cuda.Stream(non_blocking=True)  # s2
c = cupy.cuda.Stream(non_blocking=True)  # s3
y, z, out = buffers("y", "z", "out")
observed, expected = [], []
for step in range(1, STEPS + 1):
    with a:
        fill(y, step)
    b.wait_event(a.record())
    with b:
        copy(y, z)
    c.wait_event(b.record())  # covers A's fill through B's wait
    with c:
        add_arrays(y, z, out)
    observed.append(value_of(out))
    expected.append(float(2 * step))
report(observed, expected)
