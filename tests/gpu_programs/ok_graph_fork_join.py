"""Correct twin of race_graph_missing_join.py: the post-scale waits for an event recorded on A
after the matmul, inside the capture, so the graph orders it after the (spinning) matmul."""
import cupy

from _common import buffers, fill, report, value_of
from _graph_common import LAUNCHES, SPIN_NS, event, matmul_like, post_scale, rms_like, spin, warm_up

origin = cupy.cuda.Stream(non_blocking=True)  # s1
a = cupy.cuda.Stream(non_blocking=True)  # s2: matmul
b = cupy.cuda.Stream(non_blocking=True)  # s3: RMS
x, y, r, out = buffers("x", "y", "r", "out")
warm_up(x, y, r, out)

origin.begin_capture()
fork = origin.record(event())
a.wait_event(fork)
b.wait_event(fork)
with a:
    spin(SPIN_NS)
    matmul_like(x, y)
with b:
    rms_like(x, r)
origin.wait_event(a.record(event()))  # join_mm
origin.wait_event(b.record(event()))  # join_rms
with origin:
    post_scale(y, r, out)
graph = origin.end_capture()

observed, expected = [], []
for step in range(1, LAUNCHES + 1):
    with origin:
        fill(x, step)
    graph.launch(stream=origin)
    observed.append(value_of(out))
    expected.append(float(2 * step * (step + 1)))
report(observed, expected)
