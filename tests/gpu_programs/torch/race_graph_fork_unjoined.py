"""A side stream forked into `torch.cuda.graph` capture and never joined back.

Rebuilds a bug of graph-captured decoding in inference engines: part of the decode step is
forked onto a side stream inside the capture (`side.wait_stream(current)`, then work on
`side`), and the capture stream is never made to wait for the side stream before the capture
ends. CUDA refuses to end such a capture (cudaErrorStreamCaptureUnjoined): torch raises the
error when the `with torch.cuda.graph(...)` block exits, and no graph is built. The program
prints the refusal and reports the replays it could not run as missing values.
The fix the projects shipped: `torch.cuda.current_stream().wait_stream(side)` before the
capture ends (fixed_graph_fork_unjoined.py).
"""
# expect: capture-error: cudaErrorStreamCaptureUnjoined
# delay: none
# strikes: yes
import torch

from _torch_common import N, STEPS, report

capture = torch.cuda.Stream()  # s1: the capture stream (also where the graph is built)
side = torch.cuda.Stream()  # s2: the forked branch
x = torch.zeros(N, device="cuda")
y = torch.zeros(N, device="cuda")
out = torch.zeros(N, device="cuda")
torch.cuda.synchronize()

# Warm up eagerly before capturing (torch's advice: kernels loaded, nothing lazy inside the capture).
with torch.cuda.stream(capture):
    side.wait_stream(capture)
    with torch.cuda.stream(side):
        torch.mul(x, 2.0, out=y)
    torch.add(x, 1.0, out=out)
    capture.wait_stream(side)
torch.cuda.synchronize()

graph = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(graph, stream=capture):
        side.wait_stream(torch.cuda.current_stream())  # fork: the side stream joins the capture
        with torch.cuda.stream(side):
            torch.mul(x, 2.0, out=y)  # the branch on s2
        torch.add(x, 1.0, out=out)  # the capture stream's own work
        # BUG: no torch.cuda.current_stream().wait_stream(side): the fork is never joined back
    built = True
except RuntimeError as exc:
    print(f"torch.cuda.graph refused the capture: {exc}", flush=True)
    built = False

observed = []
if built:
    for step in range(1, STEPS + 1):
        x.fill_(float(step))  # the step's input, on the default stream
        graph.replay()  # on the default stream, after the fill
        torch.cuda.synchronize()
        observed += [y[0].item(), out[0].item()]
report(observed, [v for s in range(1, STEPS + 1) for v in (2.0 * s, s + 1.0)])
