"""Fixed twin of race_write_after_device_side_check.py: the check is `torch.equal`, which hands
the host a bool: the host waited for the reader stream inside the call, so the next step's fill
on the other stream is issued after the reader's read of the input."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
        checks.append(torch.equal(results[step - 1], expected))  # THE FIX: a host bool: the host waited for s1
observed = column(results)
report(observed, [2.0 * s for s in range(1, STEPS + 1)])
