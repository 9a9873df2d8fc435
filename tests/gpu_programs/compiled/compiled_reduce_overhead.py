"""torch.compile(mode="reduce-overhead"): the compiled step is recorded into a CUDA graph by
CUDA graph trees and replayed; each output is cloned before the next replay overwrites the
graph's output memory (what the trees' documentation asks), and read after a synchronize."""
import torch

torch.manual_seed(0)
N, STEPS = 1 << 16, 8


def step(x, w):
    return torch.relu(x * w + 1.0).sum(dim=0, keepdim=True) + x


def main():
    compiled = torch.compile(step, mode="reduce-overhead")
    x = torch.randn(4, N, device="cuda")
    w = torch.randn(4, N, device="cuda")
    kept = []
    for _ in range(STEPS):
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(x, w)
        kept.append(out.clone())
    torch.cuda.synchronize()
    print("sums", [f"{float(k.double().sum()):.2f}" for k in kept])


main()
