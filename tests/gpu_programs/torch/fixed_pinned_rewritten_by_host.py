"""Fixed twin of race_pinned_rewritten_by_host.py: an event recorded after each upload, and
`uploaded.synchronize()` before the host rewrites the staging buffer (a no-op before the first
record)."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import torch

from _torch_common import N, STEPS, column, report

BODY = N - 4096  # the batch's data; the rest is the padded tail

upload = torch.cuda.Stream()  # s1: the H2D stream
batches = [torch.full((BODY,), float(k)) for k in range(1, STEPS + 1)]  # the loader's output (pageable)
staging = torch.empty(N, pin_memory=True)  # the one pinned staging buffer
device_batches = torch.zeros(STEPS, N, device="cuda")
uploaded = torch.cuda.Event()
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    uploaded.synchronize()  # THE FIX: the previous upload has read the staging buffer
    staging[:BODY].copy_(batches[step - 1])  # the host collates the batch into pinned memory
    staging[BODY:].fill_(float(-step))  # and writes the tail
    with torch.cuda.stream(upload):
        device_batches[step - 1].copy_(staging, non_blocking=True)  # async H2D on s1
        uploaded.record()  # on s1, after the upload
observed = [v for pair in zip(column(device_batches, 0), column(device_batches, N - 1)) for v in pair]
report(observed, [v for s in range(1, STEPS + 1) for v in (float(s), float(-s))])
