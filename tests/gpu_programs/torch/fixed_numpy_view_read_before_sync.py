"""Fixed twin of race_numpy_view_read_before_sync.py: `ready.synchronize()` before the host reads
the numpy view of the pinned tensor the non_blocking copy writes."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
        ready.synchronize()  # THE FIX: the copy has written the pinned tensor
        observed.append(float(view[0]))
report(observed, [float(s) for s in range(1, STEPS + 1)])
