"""Allocators a program installs itself: cupy.cuda.set_allocator with a private MemoryPool (and
back to the default pool), the thread-local cupy.cuda.using_allocator, and a PinnedMemoryPool as
the pinned-memory allocator behind cupyx.empty_pinned. All work is on the legacy default stream;
every array of a private pool is freed before the pool is released, after the work on it ended."""
import numpy

import cupy
import cupyx


def main():
    pool = cupy.cuda.MemoryPool()
    cupy.cuda.set_allocator(pool.malloc)
    x = cupy.arange(1 << 16, dtype=cupy.float32)
    total = float((x * x).sum(dtype=cupy.float64))
    print("private pool sum", f"{total:.1f}", "pool in use", pool.used_bytes() > 0)
    del x
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    pool.free_all_blocks()
    print("private pool idle", pool.used_bytes() == 0)

    scratch = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(scratch.malloc):  # this thread only, inside the block
        ramp = cupy.linspace(0.0, 1.0, 1001)
        acc = cupy.cumsum(ramp)
        print("using_allocator cumsum", f"{float(acc[-1]):.4f}", "scratch in use", scratch.used_bytes() > 0)
        del ramp, acc
    cupy.cuda.Device().synchronize()
    scratch.free_all_blocks()
    after = cupy.ones(8)
    print("default allocator again", scratch.used_bytes() == 0, float(after.sum()))

    pinned_pool = cupy.cuda.PinnedMemoryPool()
    cupy.cuda.set_pinned_memory_allocator(pinned_pool.malloc)
    host = cupyx.empty_pinned((4096,), dtype=numpy.float64)
    host[:] = numpy.linspace(-1.0, 1.0, 4096)
    dev = cupy.asarray(host)
    back = cupy.asnumpy(cupy.abs(dev))
    print("pinned pool round trip", f"{back.sum():.4f}")
    del host  # when the pool gets it back depends on the collector and CuPy's events: not printed
    cupy.cuda.Device().synchronize()
    cupy.cuda.set_pinned_memory_allocator(None)  # back to CuPy's default pinned allocator


if __name__ == "__main__":
    main()
