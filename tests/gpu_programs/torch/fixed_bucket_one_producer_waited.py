"""Fixed twin of race_bucket_one_producer_waited.py: the reduction waits for both streams that
wrote into the bucket."""
# expect: clean
# delay: --delay-stream s2
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


HALF = N // 2

grads_a = torch.cuda.Stream()  # s1: writes bucket[:HALF]
grads_b = torch.cuda.Stream()  # s2: writes bucket[HALF:]
allreduce = torch.cuda.Stream()  # s3: the reduction ("all-reduce" of a world of two: the average)
bucket = torch.zeros(N, device="cuda")
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    grads_a.wait_stream(allreduce)  # the previous reduction has read the bucket
    grads_b.wait_stream(allreduce)
    with torch.cuda.stream(grads_a):
        fill(bucket[:HALF], float(step))  # first half on s1
    with torch.cuda.stream(grads_b):
        fill(bucket[HALF:], float(100 + step))  # second half on s2
    allreduce.wait_stream(grads_a)
    allreduce.wait_stream(grads_b)  # THE FIX: every producer of the bucket
    with torch.cuda.stream(allreduce):
        scale(bucket, 0.5, outs[step - 1])  # reads the whole bucket on s3
observed = [v for pair in zip(column(outs, 0), column(outs, HALF)) for v in pair]
report(observed, [v for s in range(1, STEPS + 1) for v in (0.5 * s, 0.5 * (100 + s))])
