"""Allocator reuse after a side-stream D2H copy: the tensor is dropped without record_stream.

Rebuilds a bug of activation-offloading code in training frameworks (and of KV-block swapping
in inference engines): a tensor produced on the default stream is copied to pinned host memory
on a copy stream, and the host drops its last reference right after issuing the copy. torch's
caching allocator files a block under the stream it was allocated on and hands it to the next
allocation on that stream at once, so the next buffer's kernel overwrites the bytes before the
copy stream has read them: the host copy holds the next tensor's values.
The fix the projects shipped: `act.record_stream(copy_stream)` before the tensor is dropped
(fixed_alloc_reuse_d2h.py).
"""
# expect: FREE
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, column, compiled, report


# The kernels, as functions that test_compiled_programs_gpu.py compiles (`compiled`).
@compiled
def full(value):
    return torch.full((N,), value, device="cuda")


copy_stream = torch.cuda.Stream()  # s1: the offload stream
offloaded = torch.zeros(STEPS, N, pin_memory=True)  # one pinned host row per step
torch.cuda.synchronize()
for step in range(1, STEPS + 1):
    act = full(float(step))  # the step's activation, on the default stream
    copy_stream.wait_stream(torch.cuda.current_stream())  # the copy waits for its producer
    with torch.cuda.stream(copy_stream):
        offloaded[step - 1].copy_(act, non_blocking=True)  # async D2H on s1, reads act
    del act  # BUG: no act.record_stream(copy_stream): the block is the default stream's again now
    scratch = full(-1.0)  # the next buffer reuses the block at once
    del scratch
report(column(offloaded), [float(s) for s in range(1, STEPS + 1)])
