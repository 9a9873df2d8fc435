"""A host read of a non_blocking D2H result (pinned memory) before its event is synchronized (RAW
on host memory).

Rebuilds a bug of serving engines that copy each step's sampled token ids to the host with
`.to("cpu", non_blocking=True)` (which returns a pinned tensor at once, the copy still queued),
so the transfer overlaps the next step's scheduling. An event is recorded after the copy, but
the host read of the ids was placed before the event's synchronize: the host reads the pinned
buffer before the copy wrote it.
The fix the projects shipped: `ready.synchronize()` before the host reads the result
(fixed_pinned_read_before_sync.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, report

side = torch.cuda.Stream()  # s1: the sampler's stream
tokens = torch.zeros(N, device="cuda")
torch.cuda.synchronize()
observed = []
with torch.cuda.stream(side):
    for step in range(1, STEPS + 1):
        tokens.fill_(float(step))  # the step's sampled ids, on s1
        host_tokens = tokens.to("cpu", non_blocking=True)  # pinned, written by an async D2H on s1
        ready = torch.cuda.Event()
        ready.record()  # on s1, after the copy
        observed.append(host_tokens[0].item())  # BUG: read before ready.synchronize()
        ready.synchronize()  # too late
report(observed, [float(s) for s in range(1, STEPS + 1)])
