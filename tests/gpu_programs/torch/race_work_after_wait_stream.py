"""Work enqueued after a `wait_stream` that was meant to cover it (RAW).

Rebuilds a bug of pipeline and offload schedulers: a tensor is handed to a copy stream with
`copy.wait_stream(compute)` placed right after the kernel that produces it; a later change
added one more in-place update of the tensor (a rescale) after that wait. `wait_stream`
records the compute stream's work issued *so far*, so the copy may read the tensor before the
update: it copies the unscaled values.
The fix the projects shipped: issue the wait after the tensor's last write
(fixed_work_after_wait_stream.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
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
        copy.wait_stream(compute)  # covers the fill only
        add(x, 1000.0)  # BUG: issued after the wait, which does not cover it
        with torch.cuda.stream(copy):
            copy_into(outs[step - 1], x)  # the copy stream reads x on s2
        compute.wait_stream(copy)  # x is rewritten only after the read
report(column(outs), [1000.0 + s for s in range(1, STEPS + 1)])
