"""A compiled decode loop: one attention layer's step per token (torch.compile, default mode),
with the KV cache written in place (index_copy_ on a preallocated cache, a mutated graph input)
and the next token chosen greedily on the device; the host reads the tokens once at the end.
Also the loop the overhead benchmark times (benchmarks/bench_compiled_overhead.py)."""

import torch

torch.manual_seed(0)
D, VOCAB, MAX_LEN = 256, 512, 128
STEPS = 32


def step(token, position, embed, wq, wk, wv, wo, k_cache, v_cache, mask_base):
    x = embed[token]  # [1, D]
    q, k, v = x @ wq, x @ wk, x @ wv
    k_cache.index_copy_(0, position, k)
    v_cache.index_copy_(0, position, v)
    scores = (q @ k_cache.T) / D ** 0.5 + torch.where(mask_base <= position, 0.0, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v_cache
    logits = (out @ wo) @ embed.T
    return logits.argmax(dim=-1)


def main():
    embed = torch.randn(VOCAB, D, device="cuda")
    wq, wk, wv, wo = (torch.randn(D, D, device="cuda") / D ** 0.5 for _ in range(4))
    k_cache = torch.zeros(MAX_LEN, D, device="cuda")
    v_cache = torch.zeros(MAX_LEN, D, device="cuda")
    mask_base = torch.arange(MAX_LEN, device="cuda")
    compiled = torch.compile(step)
    token = torch.tensor([1], device="cuda")
    tokens = []
    for i in range(STEPS):
        token = compiled(token, torch.tensor([i], device="cuda"), embed, wq, wk, wv, wo, k_cache, v_cache,
                         mask_base)
        tokens.append(token)
    print("tokens", torch.cat(tokens).tolist())


main()
