"""Pinned host memory and asynchronous copies: cupyx.empty_pinned and
cupy.cuda.alloc_pinned_memory buffers, ndarray.set / ndarray.get(blocking=False) on
non-blocking streams, and a two-stream chunked pipeline. Correct: the host touches a pinned
buffer only after synchronizing the stream that copies it, and each stream reuses only its own
device buffer."""
import numpy

import cupy
import cupyx

N = 1 << 20


def main():
    src = cupyx.empty_pinned((N,), dtype=numpy.float32)
    src[:] = numpy.arange(N, dtype=numpy.float32) % 251
    raw = cupy.cuda.alloc_pinned_memory(N * 4)
    dst = numpy.frombuffer(raw, dtype=numpy.float32, count=N)

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        dev = cupy.empty(N, dtype=cupy.float32)
        dev.set(src, stream=stream)
        dev *= 2
        dev += 1
        dev.get(stream=stream, out=dst, blocking=False)
    stream.synchronize()
    print("round trip sum", f"{dst.astype(numpy.float64).sum():.1f}", "head", dst[:4].tolist())

    chunks, size = 8, N // 8
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    buffers = []
    for s in streams:
        with s:
            buffers.append(cupy.empty(size, dtype=cupy.float32))
    result = cupyx.empty_pinned((N,), dtype=numpy.float32)
    for c in range(chunks):
        s, buf = streams[c % 2], buffers[c % 2]
        part = slice(c * size, (c + 1) * size)
        with s:
            buf.set(src[part], stream=s)
            cupy.sqrt(buf, out=buf)
            buf.get(stream=s, out=result[part], blocking=False)
    for s in streams:
        s.synchronize()
    print("pipeline sum", f"{result.astype(numpy.float64).sum():.3f}", "last", f"{float(result[-1]):.5f}")


if __name__ == "__main__":
    main()
