"""CuPy's memory pool across threads on per-thread default streams: a block freed while another
thread's stream still reads it (FREE).

Rebuilds a bug of multi-threaded CuPy services (worker threads, each on its per-thread default
stream so that they overlap): the main thread allocates an array on its per-thread default
stream and hands it to a worker thread, which runs its kernel on *its own* per-thread default
stream and drops the array. CuPy's pool files a block under the stream (and, for per-thread
default streams, the thread) that allocated it and gives it to that thread's next allocation
at once; per-thread default streams do not synchronize with each other, and joining a thread
orders the host, not its GPU work. So the next array's fill overwrites bytes the worker's
kernel has not read yet.
The fix the projects shipped: the worker synchronizes its stream before it lets go of the array
(fixed_cupy_pool_across_threads.py).
"""
# expect: FREE
# delay: --delay-kernel cupy.multiply
# strikes: yes
import threading

import cupy

from _torch_common import N, STEPS, cupy_column, report

out = cupy.zeros((STEPS, N), dtype=cupy.float32)
cupy.cuda.Device().synchronize()


def worker(box, row):
    x = box.pop()  # now the only reference
    with cupy.cuda.Stream.ptds:  # this thread's per-thread default stream
        cupy.multiply(x, 2.0, out=out[row])  # reads x
    del x  # BUG: dropped while this thread's stream may still read it; no synchronize first


for step in range(1, STEPS + 1):
    with cupy.cuda.Stream.ptds:  # the main thread's per-thread default stream
        x = cupy.full(N, float(step), dtype=cupy.float32)  # from step 2 on: the block the worker dropped
        cupy.cuda.Stream.ptds.synchronize()  # x is ready before the hand-off
    box = [x]
    del x
    thread = threading.Thread(target=worker, args=(box, step - 1))
    thread.start()
    thread.join()
report(cupy_column(out), [2.0 * s for s in range(1, STEPS + 1)])
