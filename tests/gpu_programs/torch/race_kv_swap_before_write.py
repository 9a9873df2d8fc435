"""A copy stream reads a KV block before the compute stream's write (RAW).

Rebuilds a bug of inference engines that offload the KV cache: KV blocks are swapped out to
pinned host memory on a dedicated copy stream, so the transfer overlaps the next step's
compute. Each step's attention writes its new KV block on the compute stream; the swap-out of
that block was issued on the copy stream without waiting for the write, so under load the host
copy holds the block's old contents (zeros here, stale KV in the engine), and a later swap-in
restores them.
The fix the projects shipped: the copy stream waits for the compute stream before the swap-out
(`swap.wait_stream(compute)`, or an event recorded after the write) (fixed_kv_swap_before_write.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, column, compiled, report


# The kernels, as functions that test_compiled_programs_gpu.py compiles (`compiled`).
@compiled
def fill(t, value):
    t.fill_(value)


compute = torch.cuda.Stream()  # s1: the model's stream
swap = torch.cuda.Stream()  # s2: the KV offload stream
kv = torch.zeros(STEPS, N, device="cuda")  # one KV block per step
swapped = torch.zeros(STEPS, N, pin_memory=True)  # their host copies
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    with torch.cuda.stream(compute):
        fill(kv[step - 1], float(step))  # the step's attention writes its KV block on s1
    # BUG: no swap.wait_stream(compute) before the swap-out reads the block
    with torch.cuda.stream(swap):
        swapped[step - 1].copy_(kv[step - 1], non_blocking=True)  # async D2H on s2
report(column(swapped), [float(s) for s in range(1, STEPS + 1)])
