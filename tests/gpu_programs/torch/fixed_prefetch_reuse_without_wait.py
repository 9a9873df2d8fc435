"""Fixed twin of race_prefetch_reuse_without_wait.py: the prefetch stream waits for the compute
stream before each allocation, so the allocation that gets the previous batch's block is ordered
after that batch's read. The last batch is dropped with its read pending and nothing reuses the
block: a hazard line (`--strict-free` makes it a race), not a race."""
# expect: clean
# delay: --delay-stream s2
# strikes: no
import torch

from _torch_common import N, STEPS, column, report

prefetch = torch.cuda.Stream()  # s1: allocates and fills the batches
compute = torch.cuda.Stream()  # s2: reads them
sums = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    prefetch.wait_stream(compute)  # THE FIX: the next allocation on s1 comes after the last step's read
    with torch.cuda.stream(prefetch):
        batch = torch.full((N,), float(step), device="cuda")  # on s1, in the previous batch's block
    compute.wait_stream(prefetch)
    with torch.cuda.stream(compute):
        torch.add(batch, 0.0, out=sums[step - 1])  # reads the batch on s2
    del batch  # the block goes back to s1's pool
report(column(sums), [float(s) for s in range(1, STEPS + 1)])
