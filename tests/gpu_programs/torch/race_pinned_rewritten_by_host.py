"""A pinned host buffer rewritten by the host while a non_blocking H2D copy from it is pending
(WAR on host memory).

Rebuilds a bug of data loaders and serving engines that collate each batch into one reusable
pinned staging buffer with CPU tensor ops (`copy_` of the batch, `fill_` of the padded tail)
and upload it with `copy_(staging, non_blocking=True)`. The upload returns before the copy ran;
the next batch is collated into the same buffer at once, so an upload still queued on its
stream sends the next batch's data.
The fix the projects shipped: record an event after the upload and `event.synchronize()` before
the host rewrites the buffer (fixed_pinned_rewritten_by_host.py).
"""
# expect: WAR
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, column, report

BODY = N - 4096  # the batch's data; the rest is the padded tail

upload = torch.cuda.Stream()  # s1: the H2D stream
batches = [torch.full((BODY,), float(k)) for k in range(1, STEPS + 1)]  # the loader's output (pageable)
staging = torch.empty(N, pin_memory=True)  # the one pinned staging buffer
device_batches = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    # BUG: no wait for the previous upload before the host rewrites the staging buffer
    staging[:BODY].copy_(batches[step - 1])  # the host collates the batch into pinned memory
    staging[BODY:].fill_(float(-step))  # and writes the tail
    with torch.cuda.stream(upload):
        device_batches[step - 1].copy_(staging, non_blocking=True)  # async H2D on s1, pending
observed = [v for pair in zip(column(device_batches, 0), column(device_batches, N - 1)) for v in pair]
report(observed, [v for s in range(1, STEPS + 1) for v in (float(s), float(-s))])
