"""Fixed twin of race_kv_swap_before_write.py: the copy stream waits for the compute stream
(`swap.wait_stream(compute)`) before it swaps the step's KV block out."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
    swap.wait_stream(compute)  # THE FIX: the swap-out comes after the write
    with torch.cuda.stream(swap):
        swapped[step - 1].copy_(kv[step - 1], non_blocking=True)  # async D2H on s2
report(column(swapped), [float(s) for s in range(1, STEPS + 1)])
