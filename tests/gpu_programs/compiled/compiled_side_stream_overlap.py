"""Compute/copy overlap with compiled kernels: a compiled producer on a compute stream, its
result handed to a copy stream through an event, copied to pinned host memory there while the
next step computes, each host buffer read only after its copy's event completed."""
import torch

torch.manual_seed(0)
N, STEPS = 1 << 18, 6


def produce(x, scale):
    return torch.tanh(x * scale) + x.sin()


def main():
    compiled = torch.compile(produce)
    compute, copy = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.randn(N, device="cuda")
    hosts = [torch.empty(N, pin_memory=True) for _ in range(STEPS)]
    done = []
    torch.cuda.synchronize()
    for i in range(STEPS):
        with torch.cuda.stream(compute):
            y = compiled(x, 0.5 + i)
            ready = torch.cuda.Event()
            ready.record(compute)
        copy.wait_event(ready)
        with torch.cuda.stream(copy):
            hosts[i].copy_(y, non_blocking=True)
            y.record_stream(copy)  # y is freed on compute's pool while the copy may still read it
            finished = torch.cuda.Event()
            finished.record(copy)
        done.append(finished)
    for i, finished in enumerate(done):
        finished.synchronize()
        print("step", i, f"{float(hosts[i].double().sum()):.3f}")


main()
