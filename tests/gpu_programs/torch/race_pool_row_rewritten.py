"""A pool row rewritten on the default stream while a forward stream still reads it (WAR).

Rebuilds a bug of serving engines that overlap scheduling with the forward pass: persistent
input buffers (a small pool of rows holding token ids, positions or block tables, reused
round-robin) are filled by the scheduler on the default stream while the model runs on its own
forward stream. The scheduler refilled a row for a later batch without waiting for the forward
that still read it, so a forward that runs late sees the later batch's inputs.
The fix the projects shipped: before rewriting a row the default stream waits for the forward
stream (`torch.cuda.current_stream().wait_stream(forward)`, or an event recorded after the
forward) (fixed_pool_row_rewritten.py).
"""
# expect: WAR
# delay: --delay-stream s1
# strikes: yes
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
    # BUG: no torch.cuda.current_stream().wait_stream(forward): the forward of step - ROWS may still read the row
    fill(row, values[step - 1])  # the scheduler writes the batch's inputs on the default stream
    forward.wait_stream(torch.cuda.current_stream())  # the forward waits for its inputs
    with torch.cuda.stream(forward):
        scale(row, 2.0, outs[step - 1])  # the forward reads the row on s1
report(column(outs), [2.0 * s for s in range(1, STEPS + 1)])
