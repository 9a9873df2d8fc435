"""An over-synchronized torch decode loop for `streamcheck run --audit-syncs --prove`: per token,
LAYERS steps; each step updates the hidden state on the current stream and copies it into the
KV cache on a side stream (the offload), ordered by two waits, then `torch.cuda.synchronize()`
"so the copy is done", which the waits already give: the audit finds it redundant and the
proof skips it. The sampled token is read with `.item()`: that sync stays.

    python audit_decode_loop_torch.py [TOKENS]    (default 8; TOKENS x LAYERS steps)
"""
import json
import sys

import torch

N, LAYERS = 1 << 16, 4
TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 8

bias_cpu = torch.randn(LAYERS, N, generator=torch.Generator().manual_seed(0))
main = torch.cuda.current_stream()
side = torch.cuda.Stream()  # the KV offload stream
bias = bias_cpu.pin_memory().cuda(non_blocking=True)  # no host wait: nothing rewrites the pinned source
h = torch.zeros(N, device="cuda")
kv = torch.zeros(TOKENS, LAYERS, N, device="cuda")

tokens, shift = [], 0.0
for t in range(TOKENS):
    for layer in range(LAYERS):
        main.wait_stream(side)  # the last step's copy reads h: wait before overwriting it
        h.mul_(0.5).add_(bias[layer]).add_(shift)
        side.wait_stream(main)  # the copy reads this step's h
        with torch.cuda.stream(side):
            kv[t, layer].copy_(h)
        torch.cuda.synchronize()  # "so the copy is done": the waits already order it
    token = int(h.argmax().item())  # the host samples the token: needed
    shift = token / N
    tokens.append(token)
with torch.cuda.stream(side):  # the cache's checksum, on the stream that wrote it
    checksum = kv.sum().item()

# The same arithmetic on the host (elementwise float32: exact), for the expected tokens.
h_cpu, expected, shift = torch.zeros(N), [], 0.0
for t in range(TOKENS):
    for layer in range(LAYERS):
        h_cpu.mul_(0.5).add_(bias_cpu[layer]).add_(shift)
    token = int(h_cpu.argmax())
    shift = token / N
    expected.append(token)
wrong = sum(1 for o, e in zip(tokens, expected) if o != e)
print("RESULT " + json.dumps({"observed": tokens, "expected": expected, "wrong": wrong, "kv_sum": checksum}),
      flush=True)
