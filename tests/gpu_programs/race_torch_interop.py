"""CuPy kernels on torch memory: a torch tensor viewed through DLPack is written on torch's
current stream (the caller's stream, through streamcheck.instrument.torch_stream) and read
by a CuPy stream that does not wait for it. PyTorch's CUDA sanitizer sees only ATen ops and
misses this; streamcheck maps the tensor's pointer to its driver allocation."""
import cupy
import torch

from streamcheck.record.instrument import torch_stream

from _common import N, STEPS, buffers, copy, fill, report, value_of

side = torch.cuda.Stream()  # torch's stream: the caller's stream below
t = torch.zeros(N, device="cuda", dtype=torch.float32)
torch.cuda.synchronize()
x = cupy.from_dlpack(t)  # no copy: x is t's memory
b = cupy.cuda.Stream(non_blocking=True)  # the CuPy consumer
(z,) = buffers("z")
observed, expected = [], []
with torch.cuda.stream(side):
    caller = torch_stream()
    for step in range(1, STEPS + 1):
        with caller:
            fill(x, step)
        with b:
            copy(x, z)  # BUG: no b.wait_event(caller.record())
        observed.append(value_of(z))
        expected.append(float(step))
report(observed, expected)
