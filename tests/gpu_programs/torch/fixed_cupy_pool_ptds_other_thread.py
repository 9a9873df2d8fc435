"""Fixed twin of race_cupy_pool_ptds_other_thread.py: the worker synchronizes its per-thread
default stream before its scratch array goes back to the pool, so the main thread's allocation
that gets the block is ordered after the worker's kernel read it."""
# expect: clean
# delay: --delay-kernel cupy.multiply
# strikes: no
import threading

import cupy

from _torch_common import N, STEPS, cupy_column, report

out = cupy.zeros((STEPS, N), dtype=cupy.float32)
cupy.cuda.Device().synchronize()


def worker(row):
    with cupy.cuda.Stream.ptds:  # this thread's per-thread default stream
        scratch = cupy.full(N, float(row + 1), dtype=cupy.float32)
        cupy.multiply(scratch, 2.0, out=out[row])  # reads scratch
        cupy.cuda.Stream.ptds.synchronize()  # THE FIX: the read is done before scratch goes back to the pool
    del scratch


for step in range(1, STEPS + 1):
    thread = threading.Thread(target=worker, args=(step - 1,))
    thread.start()
    thread.join()
    with cupy.cuda.Stream.ptds:  # the main thread's per-thread default stream
        padding = cupy.full(N, -1.0, dtype=cupy.float32)  # gets the worker's scratch block
    del padding
report(cupy_column(out), [2.0 * s for s in range(1, STEPS + 1)])
