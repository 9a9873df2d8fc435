"""The fixed twin of race_graphed_callable_output_overwritten.py: the next call waits for the copy.

The calling stream waits for the side stream before the next call, so every copy reads its own
call's output.
"""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
    torch.cuda.current_stream().wait_stream(side)  # THE FIX: call i + 1 waits for the copy
torch.cuda.synchronize()
report(column(hosts), [2.0 * i for i in range(1, STEPS + 1)])
