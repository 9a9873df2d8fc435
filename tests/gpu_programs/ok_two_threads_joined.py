"""Correct twin of race_two_threads.py: the writer thread synchronizes its stream before it
exits, and the join hands that over to the main thread and on to the second thread."""
import threading

import cupy

from _common import STEPS, add, buffers, fill, report, value_of

writer_stream = cupy.cuda.Stream(non_blocking=True)  # s1
adder_stream = cupy.cuda.Stream(non_blocking=True)  # s2
(x,) = buffers("x")


def writer(value):
    with writer_stream:
        fill(x, value)
    writer_stream.synchronize()


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
