"""Fixed twin of race_pool_row_rewritten.py: the default stream waits for the forward stream
(`torch.cuda.current_stream().wait_stream(forward)`) before the scheduler rewrites a row."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import torch

from _torch_common import N, STEPS, column, compiled, report


# The kernels, as functions that test_compiled_programs_gpu.py compiles (`compiled`).
@compiled
def fill(t, value):
    t.fill_(value)


@compiled
def scale(t, factor, out):
    torch.mul(t, factor, out=out)


ROWS = 2  # rows in the input pool, reused round-robin

forward = torch.cuda.Stream()  # s1: the model's forward stream
pool = torch.zeros(ROWS, N, device="cuda")  # persistent input rows
outs = torch.zeros(STEPS, N, device="cuda")
# Each step's input value as a 0-d CUDA tensor: compiled, a Python float here is a guarded
# constant (a recompile per step, and each first launch's autotune synchronizes the device).
values = [torch.full((), float(s), device="cuda") for s in range(1, STEPS + 1)]
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    row = pool[step % ROWS]
    torch.cuda.current_stream().wait_stream(forward)  # THE FIX: earlier forwards have read the row
    fill(row, values[step - 1])  # the scheduler writes the batch's inputs on the default stream
    forward.wait_stream(torch.cuda.current_stream())  # the forward waits for its inputs
    with torch.cuda.stream(forward):
        scale(row, 2.0, outs[step - 1])  # the forward reads the row on s1
report(column(outs), [2.0 * s for s in range(1, STEPS + 1)])
