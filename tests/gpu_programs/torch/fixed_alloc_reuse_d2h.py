"""Fixed twin of race_alloc_reuse_d2h.py: `act.record_stream(copy_stream)` before the tensor is
dropped, so the caching allocator reuses the block only after the copy stream has passed the
point of the free (it records an event there and waits for it)."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
    act.record_stream(copy_stream)  # THE FIX: the block is not reused before s1 passed this point
    del act
    scratch = full(-1.0)  # gets another block
    del scratch
report(column(offloaded), [float(s) for s in range(1, STEPS + 1)])
