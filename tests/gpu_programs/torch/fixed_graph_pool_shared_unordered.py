"""The fixed twin of race_graph_pool_shared_unordered.py: the graphs replay in capture order.

The default stream waits for the side stream before graph B's replay, so B writes the bytes of
the shared pool only after graph A is done with them.
"""
# expect: clean
# delay: --delay-stream s1
# strikes: no
import torch

from _torch_common import N, STEPS, column, report

side = torch.cuda.Stream()  # s1: graph A's stream
x = torch.ones(N, device="cuda")
k = torch.zeros((), device="cuda")  # the step's value, a graph input
temporaries = []  # where graph A's temporary lives


def stage_a():
    t = x + k  # a temporary: freed inside the capture, its block returns to the pool
    temporaries.append(t.data_ptr())
    return t * 2.0


stage_a(), x * k  # warm up eagerly (torch's advice: nothing lazy inside a capture)
temporaries.clear()
torch.cuda.synchronize()
graph_a, graph_b = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
with torch.cuda.graph(graph_a):
    out_a = stage_a()
with torch.cuda.graph(graph_b, pool=graph_a.pool()):  # B shares A's pool
    out_b = x * k  # handed the block A's temporary freed
if out_b.data_ptr() != temporaries[0]:
    raise SystemExit("graph B's output did not get graph A's temporary block: this program shows nothing here")

results = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
for i in range(1, STEPS + 1):
    k.fill_(float(i))
    side.wait_stream(torch.cuda.current_stream())  # A reads k
    with torch.cuda.stream(side):
        graph_a.replay()  # A on s1 writes its temporary: out_b's bytes
    torch.cuda.current_stream().wait_stream(side)  # THE FIX: B replays after A, in capture order
    graph_b.replay()  # B on the default stream writes out_b
    results[i - 1].copy_(out_b)
report(column(results), [float(i) for i in range(1, STEPS + 1)])
