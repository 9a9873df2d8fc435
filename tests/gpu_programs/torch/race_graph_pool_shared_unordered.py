"""Two CUDA graphs that share one memory pool are replayed on two streams without an edge (WAW, WAR).

Rebuilds a bug of serving engines that capture one graph per stage or batch size into one pool
(`torch.cuda.graph(g, pool=other.pool())`, the way vLLM and SGLang keep graph memory small) and
then overlap two replays on two streams. Sharing a pool is safe only when the graphs replay in
the order they were captured, one after the other: the later capture was handed the bytes the
earlier graph freed inside its own capture. Here graph B's output lives where graph A keeps its
temporary, so A's replay on the side stream, unordered with B's replay on the default stream,
overwrites B's output.
The fix: the default stream waits for the side stream before B's replay, so the graphs replay
in capture order (fixed_graph_pool_shared_unordered.py).
"""
# expect: WAW, WAR
# delay: --delay-stream s1
# strikes: yes
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
    # BUG: no torch.cuda.current_stream().wait_stream(side) before B: the pool's bytes are A's until A is done
    graph_b.replay()  # B on the default stream writes out_b
    torch.cuda.current_stream().wait_stream(side)  # joined before the next step
    results[i - 1].copy_(out_b)
report(column(results), [float(i) for i in range(1, STEPS + 1)])
