"""A layer's weights swapped in from pinned memory on a copy stream and used on the compute stream
without an edge (RAW).

Rebuilds a bug of CPU-offloading code that keeps each layer's weights in pinned host memory and,
before the layer runs, uploads them with `param.data = pinned.to("cuda", non_blocking=True)` on a
prefetch stream (the Parameter keeps its identity, so the module and the optimizer still hold it).
The upload's block is recorded for the compute stream (`record_stream`), but the compute stream
never waits for the prefetch stream: `x * param` may read the block before the copy wrote it.
The fix the projects shipped: `torch.cuda.current_stream().wait_stream(prefetch)` before the layer
runs (fixed_offload_param_data_unwaited.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, report

prefetch = torch.cuda.Stream()  # s1: the upload stream
weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)  # offloaded: no device copy yet
host_weights = [torch.full((N,), float(step)).pin_memory() for step in range(1, STEPS + 1)]
x = torch.ones(N, device="cuda")
torch.cuda.synchronize()
observed = []
for pinned in host_weights:
    with torch.cuda.stream(prefetch):
        weight.data = pinned.to("cuda", non_blocking=True)  # the upload, on s1
    weight.data.record_stream(torch.cuda.current_stream())  # the block is used on the compute stream too
    # BUG: no torch.cuda.current_stream().wait_stream(prefetch) here
    y = x * weight  # the layer, on the legacy stream
    observed.append(y[0].item())
report(observed, [float(step) for step in range(1, STEPS + 1)])
