"""A torch operator reads memory a CuPy kernel wrote (through `__cuda_array_interface__`) on
CuPy's own stream, with no edge from that stream to torch's (RAW).

The other direction of race_cupy_reads_torch_write.py: a project preprocesses into a torch
tensor with a CuPy kernel, through the zero-copy view `cupy.asarray(tensor)`
(`__cuda_array_interface__`, which carries no stream), on a CuPy stream of its own, and the
model then reads the tensor on torch's stream. Nothing orders torch's read after CuPy's write,
so the model reads the tensor's old contents.
The fix the projects shipped: torch's stream waits for CuPy's
(`consumer.wait_stream(torch.cuda.ExternalStream(producer.ptr))`) before the read
(fixed_torch_reads_cupy_write.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import cupy
import torch

from _torch_common import N, STEPS, column, report

producer = cupy.cuda.Stream(non_blocking=True)  # s1: CuPy's own stream
consumer = torch.cuda.Stream()  # s2: torch's stream
x = torch.zeros(STEPS, N, device="cuda")  # one row per step
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
x_cupy = cupy.asarray(x)  # a view through __cuda_array_interface__: the same memory
for step in range(1, STEPS + 1):
    with producer:
        x_cupy[step - 1].fill(float(step))  # CuPy writes the step's row on s1
    # BUG: nothing orders torch's stream after CuPy's write
    with torch.cuda.stream(consumer):
        torch.mul(x[step - 1], 2.0, out=outs[step - 1])  # torch reads the row on s2
report(column(outs), [2.0 * s for s in range(1, STEPS + 1)])
