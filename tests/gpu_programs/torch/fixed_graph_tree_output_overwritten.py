"""The fixed twin of race_graph_tree_output_overwritten.py: the next replay waits for the copy.

The compute stream waits for the side stream before the next replay, so every copy reads its own
step's output.
"""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import torch

from _torch_common import N, STEPS, column, report


def step(x, k):
    return x * k


side = torch.cuda.Stream()  # s1: the output processor's stream
compiled = torch.compile(step, mode="reduce-overhead")
x = torch.ones(N, device="cuda")
hosts = torch.zeros(STEPS, N, pin_memory=True)
k = torch.zeros((), device="cuda")
torch.cuda.synchronize()
for i in range(1, STEPS + 1):
    torch.compiler.cudagraph_mark_step_begin()
    k.fill_(float(i))
    out = compiled(x, k)  # replay i writes the graph's output memory on the default stream
    side.wait_stream(torch.cuda.current_stream())  # the copy waits for replay i
    with torch.cuda.stream(side):
        hosts[i - 1].copy_(out, non_blocking=True)  # the output processor reads out on s1
    torch.cuda.current_stream().wait_stream(side)  # THE FIX: replay i + 1 waits for the copy
torch.cuda.synchronize()
report(column(hosts), [float(i) for i in range(1, STEPS + 1)])
