"""Two host threads writing one buffer: the first thread's kernel may still be pending when
it exits; joining a thread orders the host, not the thread's GPU work."""
import threading

import cupy

from _common import STEPS, add, buffers, fill, report, value_of

writer_stream = cupy.cuda.Stream(non_blocking=True)  # s1
adder_stream = cupy.cuda.Stream(non_blocking=True)  # s2
(x,) = buffers("x")


def writer(value):
    with writer_stream:
        fill(x, value)
    # BUG: returns without writer_stream.synchronize()


def adder():
    with adder_stream:
        add(x, 10)
    adder_stream.synchronize()


observed, expected = [], []
for step in range(1, STEPS + 1):
    t1 = threading.Thread(target=writer, args=(step,))
    t1.start()
    t1.join()
    t2 = threading.Thread(target=adder)
    t2.start()
    t2.join()
    observed.append(value_of(x))
    expected.append(float(step + 10))
report(observed, expected)
