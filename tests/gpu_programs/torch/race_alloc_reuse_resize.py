"""Allocator reuse after `untyped_storage().resize_(0)` without record_stream (FSDP-style).

Rebuilds a bug of sharded data-parallel training (FSDP-like parameter sharding): each layer's
full parameters are all-gathered into a fresh buffer on an all-gather stream, the layer runs on
the compute stream, and the full parameters are freed right after by resizing their storage to
zero (the tensor object stays, only its memory goes). The block was allocated on the all-gather
stream, so the caching allocator hands it to the next layer's all-gather at once, which
overwrites it while the compute stream, still busy, has not read it: the layer computes with
the next layer's parameters.
The fix the projects shipped: `full.record_stream(torch.cuda.current_stream())` before
`resize_(0)` (fixed_alloc_reuse_resize.py).
"""
# expect: FREE
# delay: --delay-stream s1
# strikes: yes
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
        full.untyped_storage().resize_(0)  # BUG: no full.record_stream(compute): s2 may reuse the block now
report(column(outs), [2.0 * s for s in range(1, STEPS + 1)])
