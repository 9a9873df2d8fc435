"""Fixed twin of race_alloc_reuse_resize.py: the unsharded parameters are marked as used on the
compute stream (`full.record_stream(compute)`) before their storage is resized to zero, so the
next all-gather gets the block only after the compute stream has passed the free."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import torch

from _torch_common import N, STEPS, column, report

compute = torch.cuda.Stream()  # s1: the training loop's current stream
all_gather = torch.cuda.Stream()  # s2: the unshard stream
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
with torch.cuda.stream(compute):
    for layer in range(1, STEPS + 1):
        with torch.cuda.stream(all_gather):
            full = torch.empty(N, device="cuda")  # the unsharded parameters: a block of s2
            full.fill_(float(layer))  # the all-gather writes them on s2
        compute.wait_stream(all_gather)  # the layer waits for its parameters
        torch.mul(full, 2.0, out=outs[layer - 1])  # the layer's forward reads them on s1
        full.record_stream(compute)  # THE FIX: reuse waits until s1 passed this point
        full.untyped_storage().resize_(0)
report(column(outs), [2.0 * s for s in range(1, STEPS + 1)])
