"""Fixed twin of race_wait_on_default_stream.py: the side stream waits for the caller's current
stream (`side.wait_stream(torch.cuda.current_stream())`)."""
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


main = torch.cuda.Stream()  # s1: the caller's current stream
side = torch.cuda.Stream()  # s2: the library's side stream
x = torch.zeros(N, device="cuda")
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
with torch.cuda.stream(main):
    for step in range(1, STEPS + 1):
        fill(x, float(step))  # the caller's producer, on its current stream s1
        side.wait_stream(torch.cuda.current_stream())  # THE FIX: the stream the producer ran on
        with torch.cuda.stream(side):
            scale(x, 2.0, outs[step - 1])  # the library reads x on s2
        torch.cuda.current_stream().wait_stream(side)  # x is rewritten only after the read
report(column(outs), [2.0 * s for s in range(1, STEPS + 1)])
