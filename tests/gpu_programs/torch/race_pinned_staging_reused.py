"""One pinned staging tensor rewritten by the host every step while its non_blocking upload is
still pending (WAR on host memory).

Rebuilds a data-loading pattern: each step's batch is written into pinned memory by the host and
uploaded with `copy_(..., non_blocking=True)` on an upload stream; the loop keeps one staging
tensor for all steps, so the host's next write lands in bytes the previous upload has not read.
The fix (fixed_pinned_staging_reused.py): a fresh `torch.empty(..., pin_memory=True)` per step.
torch's pinned memory has a caching allocator too (CachingHostAllocator): it records an event on
the stream of each non_blocking copy that uses a pinned block and hands the block out again only
once that event completed, so a fresh staging tensor never aliases a pending upload's bytes.
"""
# expect: WAR
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, column, report

upload = torch.cuda.Stream()  # s1: the H2D stream
device_batches = torch.zeros(STEPS, N, device="cuda")
staging = torch.empty(N, pin_memory=True)  # BUG: one staging tensor for every step
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    staging.fill_(float(step))  # the host writes the batch into pinned memory
    with torch.cuda.stream(upload):
        device_batches[step - 1].copy_(staging, non_blocking=True)  # async H2D on s1, pending
report(column(device_batches), [float(s) for s in range(1, STEPS + 1)])
