"""A side stream reads a make_graphed_callables output after the next call has overwritten it (WAR).

Rebuilds a bug of training and inference loops that graph a module or function with
`torch.cuda.make_graphed_callables` and hand its output to a side stream (a logger, a metrics or
offload stream copying it to the host). A graphed callable returns views of the graph's static
output memory: each call copies its inputs in and replays the graph, so call k+1 overwrites what
call k returned. The side stream waited for the call before its copy, but the next call was not
ordered after that copy, so a late copy reads call k+1's values.
The fix: the calling stream waits for the side stream before the next call (or the output is
cloned before the hand-off) (fixed_graphed_callable_output_overwritten.py).
"""
# expect: WAR
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, column, report


def step(x):
    return x * 2.0


side = torch.cuda.Stream()  # s1: the logger's stream
sample = torch.zeros(N, device="cuda")
graphed = torch.cuda.make_graphed_callables(step, (sample,))  # captures step into a CUDA graph
inputs = [torch.full((N,), float(i), device="cuda") for i in range(1, STEPS + 1)]
hosts = torch.zeros(STEPS, N, pin_memory=True)
torch.cuda.synchronize()
for i in range(1, STEPS + 1):
    out = graphed(inputs[i - 1])  # call i: its input copied in, the graph replayed on the default stream
    side.wait_stream(torch.cuda.current_stream())  # the copy waits for call i
    with torch.cuda.stream(side):
        hosts[i - 1].copy_(out, non_blocking=True)  # the logger reads out on s1
    # BUG: no torch.cuda.current_stream().wait_stream(side): call i + 1 may overwrite out first
torch.cuda.synchronize()
report(column(hosts), [2.0 * i for i in range(1, STEPS + 1)])
