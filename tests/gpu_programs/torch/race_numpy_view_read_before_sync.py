"""The host reads a numpy view of a pinned buffer before the non_blocking device-to-host copy into
it ran (RAW on host memory, through the view).

Rebuilds vLLM's accepted-token counts: the engine keeps a numpy view of a pinned staging tensor
(`pinned.numpy()` shares its bytes), copies the step's counts into the tensor with
`copy_(..., non_blocking=True)` and records an event; the host reads the view before that event
is synchronized. Neither a dispatch mode nor torch's sanitizer sees numpy's reads; streamcheck's
host views do.
The fix (fixed_numpy_view_read_before_sync.py): `ready.synchronize()` before the view is read.
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, report

sampler = torch.cuda.Stream()  # s1
counts = torch.zeros(N, device="cuda")
pinned = torch.zeros(N, pin_memory=True)
view = pinned.numpy()  # the engine's host view of the staging tensor
torch.cuda.synchronize()
observed = []
with torch.cuda.stream(sampler):
    for step in range(1, STEPS + 1):
        counts.fill_(float(step))  # the step's counts, on s1
        pinned.copy_(counts, non_blocking=True)  # async D2H on s1 into the pinned tensor
        ready = torch.cuda.Event()
        ready.record()
        observed.append(float(view[0]))  # BUG: read before ready.synchronize()
        ready.synchronize()
report(observed, [float(s) for s in range(1, STEPS + 1)])
