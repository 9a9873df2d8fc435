"""Fixed twin of race_cupy_reads_torch_write.py: CuPy's stream, wrapped for torch as a
torch.cuda.ExternalStream, waits for torch's stream before each CuPy kernel."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import cupy
import torch

from _torch_common import N, STEPS, cupy_column, report

producer = torch.cuda.Stream()  # s1: torch's stream
consumer = cupy.cuda.Stream(non_blocking=True)  # s2: CuPy's own stream
consumer_for_torch = torch.cuda.ExternalStream(consumer.ptr)  # the same CUDA stream, as torch sees it
x = torch.zeros(STEPS, N, device="cuda")  # one row per step
torch.cuda.synchronize()
x_cupy = cupy.from_dlpack(x)  # the same memory, no copy
out = cupy.zeros((STEPS, N), dtype=cupy.float32)
cupy.cuda.Device().synchronize()
for step in range(1, STEPS + 1):
    with torch.cuda.stream(producer):
        x[step - 1].fill_(float(step))  # torch writes the step's row on s1
    consumer_for_torch.wait_stream(producer)  # THE FIX: CuPy's stream waits for torch's write
    with consumer:
        cupy.multiply(x_cupy[step - 1], 2.0, out=out[step - 1])  # CuPy reads the row on s2
report(cupy_column(out), [2.0 * s for s in range(1, STEPS + 1)])
