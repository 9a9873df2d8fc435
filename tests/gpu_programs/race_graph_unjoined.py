"""A fork never joined back: stream A enters the capture by waiting on an event recorded on the
origin, runs the matmul, and the origin never waits for A again. CUDA refuses end_capture
with cudaErrorStreamCaptureUnjoined; the script prints CUDA's own error (it is what the
program sees, with or without streamcheck) and builds no graph."""
import cupy

from _common import buffers
from _graph_common import event, matmul_like, rms_like, warm_up

origin = cupy.cuda.Stream(non_blocking=True)  # s1
a = cupy.cuda.Stream(non_blocking=True)  # s2: matmul
x, y, r, out = buffers("x", "y", "r", "out")
warm_up(x, y, r, out)

origin.begin_capture()
a.wait_event(origin.record(event()))
with a:
    matmul_like(x, y)
with origin:
    rms_like(x, r)
try:
    graph = origin.end_capture()  # BUG: origin never waited for an event recorded on a after matmul_like
except cupy.cuda.runtime.CUDARuntimeError as exc:
    print(f"CUDA refused end_capture: {exc}", flush=True)
else:
    print("end_capture succeeded", flush=True)
