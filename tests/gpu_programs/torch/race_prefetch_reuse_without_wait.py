"""A prefetch loader's batch allocated on its stream while the compute stream still reads the
previous batch's block (FREE: the caching allocator's reuse).

Rebuilds a prefetching data loader: each batch is allocated and filled on a prefetch stream and
handed to the compute stream, which waits for it; the loop drops the batch after the step. torch's
caching allocator files the block under the prefetch stream and hands it to the next allocation
there at once, so the next batch's fill overwrites bytes the compute stream may still read.
The fix the project shipped (fixed_prefetch_reuse_without_wait.py): the prefetch stream waits for
the compute stream before each allocation (instead of `record_stream`). The last batch is dropped
while its read may be pending; nothing reuses its block: a hazard line, not a race.
"""
# expect: FREE
# delay: --delay-stream s2
# strikes: yes
import torch

from _torch_common import N, STEPS, column, report

prefetch = torch.cuda.Stream()  # s1: allocates and fills the batches
compute = torch.cuda.Stream()  # s2: reads them
sums = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    # BUG: no prefetch.wait_stream(compute): the batch may get the block the last step still reads
    with torch.cuda.stream(prefetch):
        batch = torch.full((N,), float(step), device="cuda")  # on s1, in the previous batch's block
    compute.wait_stream(prefetch)
    with torch.cuda.stream(compute):
        torch.add(batch, 0.0, out=sums[step - 1])  # reads the batch on s2
    del batch  # the block goes back to s1's pool
report(column(sums), [float(s) for s in range(1, STEPS + 1)])
