"""An H2D load into a reused block while compute still reads it (WAR).

Rebuilds a bug of weight-offloading libraries for inference and training: layers live in
pinned host memory and each one is streamed into a GPU staging buffer on a load stream just
before it is needed. One staging buffer serves every layer; the load of layer k+1 was issued
as soon as layer k's kernel had been *issued*, not when it had finished reading the buffer, so
the copy overwrites the weights layer k is still reading and layer k computes with layer
k+1's weights.
The fix the projects shipped: the load stream waits for the compute stream (an event recorded
after the layer's last use of the buffer) before it reuses it (fixed_h2d_into_block_in_use.py).
"""
# expect: WAR
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, column, report

compute = torch.cuda.Stream()  # s1: the model's stream
loader = torch.cuda.Stream()  # s2: the weight-load stream
layers = [torch.full((N,), float(k), pin_memory=True) for k in range(1, STEPS + 1)]  # host weights
staging = torch.zeros(N, device="cuda")  # the one GPU buffer the layers take turns in
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for layer in range(1, STEPS + 1):
    # BUG: no loader.wait_stream(compute): the previous layer's forward may still read `staging`
    with torch.cuda.stream(loader):
        staging.copy_(layers[layer - 1], non_blocking=True)  # async H2D on s2 into the reused buffer
    compute.wait_stream(loader)  # the layer waits for its weights
    with torch.cuda.stream(compute):
        torch.mul(staging, 2.0, out=outs[layer - 1])  # the layer's forward reads them on s1
report(column(outs), [2.0 * k for k in range(1, STEPS + 1)])
