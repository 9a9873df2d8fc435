"""A producer thread's batches read by the consumer without waiting for the producer's stream (RAW).

Rebuilds a bug of input pipelines and serving engines that prepare batches on the GPU in a
background thread: the thread runs its kernels on a stream of its own (so that they overlap with
the model's) and hands each batch to the main thread through a queue.Queue. `get()` orders the
host only: the consumer's kernel on its own stream can run before the producer's kernel has
written the batch.
The fix the projects shipped: the producer records an event after each batch and queues it with
the batch; the consumer's stream waits for it (fixed_thread_queue_without_event.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import queue
import threading

import torch

from _torch_common import N, STEPS, column, report

prefetch = torch.cuda.Stream()  # s1: the producer thread's stream
batches = torch.zeros(STEPS, N, device="cuda")  # the producer's output, one row a batch
outs = torch.zeros(STEPS, N, device="cuda")
torch.cuda.synchronize()
ready = queue.Queue()


def producer():
    with torch.cuda.stream(prefetch):  # this thread's current stream
        for step in range(1, STEPS + 1):
            batches[step - 1].fill_(float(step))  # the batch, on s1
            ready.put(step - 1)  # BUG: nothing the consumer's stream can wait for


thread = threading.Thread(target=producer)
thread.start()
for _ in range(STEPS):
    row = ready.get()
    torch.mul(batches[row], 2.0, out=outs[row])  # the consumer, on the legacy default stream
thread.join()
report(column(outs, 0), [2.0 * s for s in range(1, STEPS + 1)])
