"""Fixed twin of race_offload_param_data_unwaited.py: the compute stream waits for the prefetch
stream (`wait_stream`) before the layer reads the uploaded weights."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
    torch.cuda.current_stream().wait_stream(prefetch)  # THE FIX: the upload is done before the layer reads it
    y = x * weight  # the layer, on the legacy stream
    observed.append(y[0].item())
report(observed, [float(step) for step in range(1, STEPS + 1)])
