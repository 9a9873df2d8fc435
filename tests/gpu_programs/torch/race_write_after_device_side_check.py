"""A buffer refilled on another stream while a check of the step's result is still pending on the
reader's stream (WAR): the check stays on the device, so the host never waits for the reader.

Rebuilds a pattern of validation loops: each step's input is filled on a producer stream, a
consumer stream computes from it, and the step's result is checked before the next input is
filled. Here the check is a device tensor (`(result == expected).all()`), read only at the end:
nothing orders the next step's fill after the consumer's read of the input.
The fix (fixed_write_after_device_side_check.py): the check as `torch.equal`, which hands the
host a bool, so the host has waited for the consumer stream before it issues the next fill
(torch's `equal`, `allclose`, `nonzero`, boolean masks, `.item()` all make the host wait).
"""
# expect: WAR
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, column, report

reader = torch.cuda.Stream()  # s1: computes from the input
filler = torch.cuda.Stream()  # s2: fills the next input
inputs = torch.zeros(N, device="cuda")
results = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
checks = []
for step in range(1, STEPS + 1):
    with torch.cuda.stream(filler):
        inputs.fill_(float(step))  # the step's input, on s2
    reader.wait_stream(filler)
    with torch.cuda.stream(reader):
        torch.mul(inputs, 2.0, out=results[step - 1])  # reads the input on s1
        expected = torch.full((N,), 2.0 * step, device="cuda")
        checks.append((results[step - 1] == expected).all())  # BUG: stays on the device, the host never waits
observed = column(results)
report(observed, [2.0 * s for s in range(1, STEPS + 1)])
