"""cuBLAS on two non-blocking streams joined by events: matmul / dot / einsum / tensordot /
batched matmul, then a combination of both results on the first stream. Small integer values
keep every float32 product exact, so the printed sums do not depend on cuBLAS's algorithm.
Correct: each stream builds its own inputs, the join is an event recorded after the producer,
and the results are read on the stream that computed them."""
import numpy

import cupy


def main():
    host = (numpy.arange(256 * 256) % 7).reshape(256, 256).astype(numpy.float32)
    left = cupy.cuda.Stream(non_blocking=True)
    right = cupy.cuda.Stream(non_blocking=True)
    with left:
        a = cupy.asarray(host)
        p = a @ a
        e = cupy.einsum("ij,jk->ik", a, a)
        batch = cupy.stack([a[:32, :32] + k for k in range(8)])
        bp = cupy.matmul(batch, batch)
        left_done = left.record()
    with right:
        b = cupy.asarray(numpy.ascontiguousarray(host.T))
        q = cupy.dot(b, b)
        t = cupy.tensordot(b, b, axes=([1], [0]))
        right_done = right.record()
    left.wait_event(right_done)
    right.wait_event(left_done)
    with left:
        diff = p - q.T  # (A A) - (A^T A^T)^T = 0
        print("matmul vs dot", int(cupy.abs(diff).max()), "einsum equal", bool(cupy.all(e == p)),
              "sum", int(p.sum(dtype=cupy.float64)))
        print("batched matmul sums", [int(v) for v in bp.sum(axis=(1, 2)).get()])
    with right:
        print("tensordot equals dot", bool(cupy.all(t == q)), "trace", int(q.trace()))
    left.synchronize()
    right.synchronize()


if __name__ == "__main__":
    main()
