"""A side stream reads a CUDA-graph output after the next replay has overwritten it (WAR).

Rebuilds a bug of serving loops that compile their decode step with
`torch.compile(mode="reduce-overhead")` (CUDA graph trees) and hand each step's output to a side
stream (an asynchronous output processor copying logits or tokens to the host). Graph trees give
every replay the same output memory: replay k+1 overwrites what replay k returned. The side stream
waited for the replay before its copy, but the loop's next replay was not ordered after that copy,
so a late copy reads step k+1's values, and the host sees a step twice.
The fix the projects shipped: the compute stream waits for the side stream before the next replay
(or the output is cloned before the hand-off) (fixed_graph_tree_output_overwritten.py).
"""
# expect: WAR
# delay: --delay-stream s1
# strikes: yes
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
    # BUG: no torch.cuda.current_stream().wait_stream(side): replay i + 1 may overwrite out first
torch.cuda.synchronize()
report(column(hosts), [float(i) for i in range(1, STEPS + 1)])
