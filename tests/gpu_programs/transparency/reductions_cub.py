"""Reductions and scans on large arrays (CuPy routes them to CUB, its default accelerator on
CUDA): sum, cumsum, argmax/argmin, min/max, mean/var, histogram, count_nonzero, axis sums, and
a sum on a non-blocking stream that first waits for the legacy stream's work on its input.
Integer data makes most results exact."""
import cupy


def main():
    n = 1 << 24
    ints = cupy.arange(n, dtype=cupy.int64) % 1000
    print("sum", int(ints.sum()), "cumsum last", int(cupy.cumsum(ints)[-1]), "cumsum[12345]",
          int(ints.cumsum()[12345]))
    fractions = (cupy.arange(n, dtype=cupy.float32) % 97) / 97
    print("float64 sum", f"{float(fractions.sum(dtype=cupy.float64)):.3f}", "mean", f"{float(fractions.mean()):.5f}",
          "var", f"{float(fractions.var()):.5f}")
    wave = cupy.sin(cupy.arange(n, dtype=cupy.float64) * 1e-3)
    print("argmax", int(cupy.argmax(wave)), "argmin", int(wave.argmin()), "max", f"{float(wave.max()):.6f}",
          "min", f"{float(cupy.min(wave)):.6f}")
    hist, edges = cupy.histogram(fractions, bins=16, range=(0.0, 1.0))
    print("histogram", hist.get().tolist(), "edges", f"{float(edges[1]):.4f}")
    print("count_nonzero", int(cupy.count_nonzero(ints)), "any > 998", bool((ints > 998).any()),
          "all < 1000", bool((ints < 1000).all()))
    grid = ints.reshape(4096, 4096)
    print("row sums", grid.sum(axis=1)[:3].get().tolist(), "column max", grid.max(axis=0)[:3].get().tolist())

    side = cupy.cuda.Stream(non_blocking=True)
    side.wait_event(cupy.cuda.Stream.null.record())  # `ints` was written on the legacy stream
    with side:
        total = ints.sum()
        prefix = cupy.cumsum(ints[:1000])
        print("side stream sum", int(total), "prefix", int(prefix[-1]))
    side.synchronize()  # before `ints` goes back to the legacy stream's pool


if __name__ == "__main__":
    main()
