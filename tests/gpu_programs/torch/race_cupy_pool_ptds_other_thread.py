"""CuPy's memory pool hands a block a worker thread freed on its per-thread default stream to the
main thread's per-thread default stream (FREE).

Rebuilds a bug of multi-threaded CuPy services whose workers each compute on their per-thread
default stream: a worker allocates a scratch array, launches a kernel that reads it and drops the
array at once. CuPy's pool files free blocks by stream handle, and every thread's
per-thread default stream has the same handle (cudaStreamPerThread), so the main thread's next
allocation of that size gets the worker's block, on a stream that never waited for the worker's
kernel: the main thread's fill can land before that kernel read the scratch array. Joining the
worker thread orders the host, not the worker's GPU work.
The fix the projects shipped: the worker synchronizes its stream before its scratch array goes
(fixed_cupy_pool_ptds_other_thread.py).
"""
# expect: FREE
# delay: --delay-kernel cupy.multiply
# strikes: yes
import threading

import cupy

from _torch_common import N, STEPS, cupy_column, report

out = cupy.zeros((STEPS, N), dtype=cupy.float32)
cupy.cuda.Device().synchronize()


def worker(row):
    with cupy.cuda.Stream.ptds:  # this thread's per-thread default stream
        scratch = cupy.full(N, float(row + 1), dtype=cupy.float32)
        cupy.multiply(scratch, 2.0, out=out[row])  # reads scratch
    del scratch  # BUG: back to the pool while this thread's stream may still read it


for step in range(1, STEPS + 1):
    thread = threading.Thread(target=worker, args=(step - 1,))
    thread.start()
    thread.join()
    with cupy.cuda.Stream.ptds:  # the main thread's per-thread default stream
        padding = cupy.full(N, -1.0, dtype=cupy.float32)  # gets the worker's scratch block
    del padding
report(cupy_column(out), [2.0 * s for s in range(1, STEPS + 1)])
