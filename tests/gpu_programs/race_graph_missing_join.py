"""The FlashNorm bug inside a CUDA graph: the origin stream forks the matmul to stream A and
the RMS to stream B, but the post-scale waits only for B; A is joined back after the
post-scale, so end_capture succeeds and every launch of the graph races on y. The graph
holds its own 2 ms spin before the matmul (a delay the program captures itself), so the
post-scale reads y before A writes it: the previous launch's value, a one-step lag."""
import cupy

from _common import buffers, fill, report, value_of
from _graph_common import LAUNCHES, SPIN_NS, event, matmul_like, post_scale, rms_like, spin, warm_up

origin = cupy.cuda.Stream(non_blocking=True)  # s1: captures, runs the post-scale, launches
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
origin.wait_event(b.record(event()))
with origin:
    post_scale(y, r, out)  # BUG: no origin.wait_event(a.record()) before reading y
origin.wait_event(a.record(event()))  # A joined back only now, so end_capture succeeds
graph = origin.end_capture()

observed, expected = [], []
for step in range(1, LAUNCHES + 1):
    with origin:
        fill(x, step)  # the step's input, before the graph on the same stream
    graph.launch(stream=origin)
    observed.append(value_of(out))
    expected.append(float(2 * step * (step + 1)))
report(observed, expected)
