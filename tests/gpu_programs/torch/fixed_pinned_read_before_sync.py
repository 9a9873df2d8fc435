"""Fixed twin of race_pinned_read_before_sync.py: `ready.synchronize()` before the host reads
the pinned result of the non_blocking copy."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
        ready.synchronize()  # THE FIX: the copy has written the pinned buffer
        observed.append(host_tokens[0].item())
report(observed, [float(s) for s in range(1, STEPS + 1)])
