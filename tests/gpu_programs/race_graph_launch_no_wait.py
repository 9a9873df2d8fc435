"""A graph launched on stream L and a consumer on another non-blocking stream K that reads the
graph's output without waiting for L. Delay L (s1): streamcheck spins on L before the graph
launch, the graph runs late, and K copies the previous launch's y."""
import cupy

from _common import buffers, copy, fill, report, value_of
from _graph_common import LAUNCHES, matmul_like, warm_up

launcher = cupy.cuda.Stream(non_blocking=True)  # s1: captures and launches the graph
consumer = cupy.cuda.Stream(non_blocking=True)  # s2
x, y, r, out = buffers("x", "y", "r", "out")
(z,) = buffers("z")
warm_up(x, y, r, out)

launcher.begin_capture()
with launcher:
    matmul_like(x, y)
graph = launcher.end_capture()

observed, expected = [], []
for step in range(1, LAUNCHES + 1):
    with launcher:
        fill(x, step)
    graph.launch(stream=launcher)
    with consumer:
        copy(y, z)  # BUG: no consumer.wait_event(launcher.record()) after the graph launch
    observed.append(value_of(z))
    expected.append(float(2 * step))
report(observed, expected)
