"""Over-synchronized torch steps for `streamcheck run --audit-syncs`: a device-wide
synchronize whose only use is ordering a side stream after the current one (a device-side
wait suffices), a wait_stream issued twice, a busy loop on Event.query(), and `.item()`, the
host read that needs its sync.

    python audit_oversync_torch.py [STEPS]    (default 4)
"""
import json
import sys

import torch

N = 1 << 20
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 4

side = torch.cuda.Stream()
x = torch.zeros(N, device="cuda")
y = torch.zeros(N, device="cuda")
observed, expected = [], []
for step in range(1, STEPS + 1):
    x.fill_(step)  # on the current (legacy default) stream
    torch.cuda.synchronize()  # only orders the side stream after fill_: a wait would do
    with torch.cuda.stream(side):
        y.copy_(x)
    done = torch.cuda.Event()
    done.record(side)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.current_stream().wait_stream(side)  # the same wait twice: redundant
    while not done.query():  # polling: timing-dependent
        pass
    observed.append(y[0].item())  # the host reads what the GPU wrote: needed
    expected.append(float(step))
wrong = sum(1 for o, e in zip(observed, expected) if o != e)
print("RESULT " + json.dumps({"observed": observed, "expected": expected, "wrong": wrong}), flush=True)
