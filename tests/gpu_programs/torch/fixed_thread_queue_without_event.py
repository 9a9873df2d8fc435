"""Fixed twin of race_thread_queue_without_event.py: the producer records an event on its stream
after each batch and queues it with the batch; the consumer's stream waits for it before it reads."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
            ready.put((step - 1, prefetch.record_event()))  # THE FIX: an event after the batch


thread = threading.Thread(target=producer)
thread.start()
for _ in range(STEPS):
    row, written = ready.get()
    torch.cuda.current_stream().wait_event(written)  # the consumer's stream waits for the batch
    torch.mul(batches[row], 2.0, out=outs[row])  # the consumer, on the legacy default stream
thread.join()
report(column(outs, 0), [2.0 * s for s in range(1, STEPS + 1)])
