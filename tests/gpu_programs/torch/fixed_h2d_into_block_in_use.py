"""Fixed twin of race_h2d_into_block_in_use.py: the load stream waits for the compute stream
(`loader.wait_stream(compute)`) before it overwrites the staging buffer, so the previous
layer's forward has read it."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import torch

from _torch_common import N, STEPS, column, report

compute = torch.cuda.Stream()  # s1: the model's stream
loader = torch.cuda.Stream()  # s2: the weight-load stream
layers = [torch.full((N,), float(k), pin_memory=True) for k in range(1, STEPS + 1)]  # host weights
staging = torch.zeros(N, device="cuda")  # the one GPU buffer the layers take turns in
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for layer in range(1, STEPS + 1):
    loader.wait_stream(compute)  # THE FIX: the previous layer has read the buffer
    with torch.cuda.stream(loader):
        staging.copy_(layers[layer - 1], non_blocking=True)  # async H2D on s2
    compute.wait_stream(loader)  # the layer waits for its weights
    with torch.cuda.stream(compute):
        torch.mul(staging, 2.0, out=outs[layer - 1])  # the layer's forward reads them on s1
report(column(outs), [2.0 * k for k in range(1, STEPS + 1)])
