"""Fixed twin of race_torch_reads_cupy_write.py: torch's stream waits for CuPy's stream, wrapped
for torch as a torch.cuda.ExternalStream, before each read."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import cupy
import torch

from _torch_common import N, STEPS, column, report

producer = cupy.cuda.Stream(non_blocking=True)  # s1: CuPy's own stream
consumer = torch.cuda.Stream()  # s2: torch's stream
producer_for_torch = torch.cuda.ExternalStream(producer.ptr)  # the same CUDA stream, as torch sees it
x = torch.zeros(STEPS, N, device="cuda")  # one row per step
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
x_cupy = cupy.asarray(x)  # a view through __cuda_array_interface__: the same memory
for step in range(1, STEPS + 1):
    with producer:
        x_cupy[step - 1].fill(float(step))  # CuPy writes the step's row on s1
    consumer.wait_stream(producer_for_torch)  # THE FIX: torch's stream waits for CuPy's write
    with torch.cuda.stream(consumer):
        torch.mul(x[step - 1], 2.0, out=outs[step - 1])  # torch reads the row on s2
report(column(outs), [2.0 * s for s in range(1, STEPS + 1)])
