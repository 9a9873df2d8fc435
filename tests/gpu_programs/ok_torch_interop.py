"""Correct twin of race_torch_interop.py: the CuPy consumer waits for torch's stream."""
import cupy
import torch

from streamcheck.record.instrument import torch_stream

from _common import N, STEPS, buffers, copy, fill, report, value_of

side = torch.cuda.Stream()
t = torch.zeros(N, device="cuda", dtype=torch.float32)
torch.cuda.synchronize()
x = cupy.from_dlpack(t)
b = cupy.cuda.Stream(non_blocking=True)
(z,) = buffers("z")
observed, expected = [], []
with torch.cuda.stream(side):
    caller = torch_stream()
    for step in range(1, STEPS + 1):
        with caller:
            fill(x, step)
        b.wait_event(caller.record())
        with b:
            copy(x, z)
        observed.append(value_of(z))
        expected.append(float(step))
report(observed, expected)
