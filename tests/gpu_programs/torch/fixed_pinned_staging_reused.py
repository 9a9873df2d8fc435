"""Fixed twin of race_pinned_staging_reused.py: a fresh pinned staging tensor per step. The old
one dies while its upload is pending; torch's CachingHostAllocator hands its block out again only
after the event it recorded behind that upload completed, so the host never writes bytes a
pending upload reads (the same bytes may come back: they are ordered)."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import torch

from _torch_common import N, STEPS, column, report

upload = torch.cuda.Stream()  # s1: the H2D stream
device_batches = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    staging = torch.empty(N, pin_memory=True)  # THE FIX: a fresh staging tensor per step
    staging.fill_(float(step))  # the host writes the batch into pinned memory
    with torch.cuda.stream(upload):
        device_batches[step - 1].copy_(staging, non_blocking=True)  # async H2D on s1, pending
report(column(device_batches), [float(s) for s in range(1, STEPS + 1)])
