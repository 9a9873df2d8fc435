"""A CuPy kernel reads a torch tensor (DLPack) on CuPy's own stream, with no edge from the torch
stream that wrote it (RAW).

Rebuilds a bug of projects that mix torch with custom CuPy kernels (post-processing in serving
stacks, custom operators in research code): a torch tensor is handed to CuPy without a copy
through `cupy.from_dlpack` and a CuPy kernel runs on a CuPy stream of the project's own. torch
writes the tensor on its stream before each use, and nothing orders the CuPy kernel after that
write (DLPack's stream handshake happens once, at the exchange, not at each later use), so
CuPy reads the old contents. PyTorch's CUDA sanitizer sees only ATen operators and misses it.
The fix the projects shipped: make CuPy's stream wait for torch's
(`torch.cuda.ExternalStream(consumer.ptr).wait_stream(producer)`) before the CuPy kernel
(fixed_cupy_reads_torch_write.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import cupy
import torch

from _torch_common import N, STEPS, cupy_column, report

producer = torch.cuda.Stream()  # s1: torch's stream
consumer = cupy.cuda.Stream(non_blocking=True)  # s2: CuPy's own stream
x = torch.zeros(STEPS, N, device="cuda")  # one row per step
torch.cuda.synchronize()
x_cupy = cupy.from_dlpack(x)  # the same memory, no copy
out = cupy.zeros((STEPS, N), dtype=cupy.float32)
cupy.cuda.Device().synchronize()
for step in range(1, STEPS + 1):
    with torch.cuda.stream(producer):
        x[step - 1].fill_(float(step))  # torch writes the step's row on s1
    # BUG: nothing orders CuPy's stream after torch's write
    with consumer:
        cupy.multiply(x_cupy[step - 1], 2.0, out=out[step - 1])  # CuPy reads the row on s2
report(cupy_column(out), [2.0 * s for s in range(1, STEPS + 1)])
