"""Fixed twin of race_work_after_wait_stream.py: the wait is issued after the tensor's last
write, so it covers the in-place update too."""
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
def add(t, value):
    t.add_(value)


@compiled
def copy_into(dst, src):
    dst.copy_(src)


compute = torch.cuda.Stream()  # s1: the producer's stream
copy = torch.cuda.Stream()  # s2: the hand-off stream
x = torch.zeros(N, device="cuda")
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
with torch.cuda.stream(compute):
    for step in range(1, STEPS + 1):
        fill(x, float(step))  # the main producer on s1
        add(x, 1000.0)
        copy.wait_stream(compute)  # THE FIX: after the last write of x
        with torch.cuda.stream(copy):
            copy_into(outs[step - 1], x)  # the copy stream reads x on s2
        compute.wait_stream(copy)  # x is rewritten only after the read
report(column(outs), [1000.0 + s for s in range(1, STEPS + 1)])
