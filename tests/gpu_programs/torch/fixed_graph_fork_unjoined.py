"""Fixed twin of race_graph_fork_unjoined.py: the capture stream waits for the side stream
before the capture ends, so CUDA builds the graph, and each replay computes both branches of
the step."""
# expect: clean
# delay: none
# strikes: no
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
        torch.cuda.current_stream().wait_stream(side)  # THE FIX: join the fork back
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
