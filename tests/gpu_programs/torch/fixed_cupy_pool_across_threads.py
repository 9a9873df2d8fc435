"""Fixed twin of race_cupy_pool_across_threads.py: the worker synchronizes its per-thread default
stream before it drops the array, so the block goes back to the pool only after its kernel read
it."""
# expect: clean
# delay: --delay-kernel cupy.multiply
# strikes: no
import threading

import cupy

from _torch_common import N, STEPS, cupy_column, report

out = cupy.zeros((STEPS, N), dtype=cupy.float32)
cupy.cuda.Device().synchronize()


def worker(box, row):
    x = box.pop()  # now the only reference
    with cupy.cuda.Stream.ptds:  # this thread's per-thread default stream
        cupy.multiply(x, 2.0, out=out[row])  # reads x
    cupy.cuda.Stream.ptds.synchronize()  # THE FIX: the read is done before x goes back to the pool
    del x


for step in range(1, STEPS + 1):
    with cupy.cuda.Stream.ptds:  # the main thread's per-thread default stream
        x = cupy.full(N, float(step), dtype=cupy.float32)
        cupy.cuda.Stream.ptds.synchronize()  # x is ready before the hand-off
    box = [x]
    del x
    thread = threading.Thread(target=worker, args=(box, step - 1))
    thread.start()
    thread.join()
report(cupy_column(out), [2.0 * s for s in range(1, STEPS + 1)])
