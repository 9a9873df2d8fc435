"""Sorting (Thrust and CUB): sort, ndarray.sort in place, argsort, unique with counts,
searchsorted, lexsort, partition, and a sort on a non-blocking stream. Correct: one stream at a
time, and values read on the stream that produced them."""
import numpy

import cupy


def main():
    rng = numpy.random.default_rng(11)
    data = cupy.asarray(rng.integers(0, 1000, size=200_000))
    ordered = cupy.sort(data)
    print("sorted", bool(cupy.all(ordered[1:] >= ordered[:-1])), "min", int(ordered[0]), "max", int(ordered[-1]))

    perm = cupy.asarray(rng.permutation(50_000))
    inverse = cupy.argsort(perm)
    print("argsort inverts a permutation", bool(cupy.all(perm[inverse] == cupy.arange(50_000))))

    values, counts = cupy.unique(data, return_counts=True)
    print("unique", int(values.size), "counts of 0..4", counts[:5].get().tolist(), "total", int(counts.sum()))
    where = cupy.searchsorted(ordered, cupy.asarray([0, 250, 500, 999, 1000]))
    print("searchsorted", where.get().tolist())

    keys = cupy.asarray([[3, 1, 2, 1, 3, 2], [0, 1, 0, 0, 1, 1]])
    print("lexsort", cupy.lexsort(keys).get().tolist())
    floats = cupy.asarray(rng.standard_normal(4096).astype(numpy.float32))
    part = cupy.partition(floats, 100)
    print("partition kth", f"{float(part[100]):.5f}", "equals sorted", bool(part[100] == cupy.sort(floats)[100]))

    rows = cupy.asarray(rng.standard_normal((64, 128)).astype(numpy.float32))
    rows.sort(axis=1)
    print("rows sorted in place", bool(cupy.all(rows[:, 1:] >= rows[:, :-1])),
          "median column sum", f"{float(rows[:, 64].sum()):.4f}")

    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        mine = cupy.arange(100_000, 0, -1, dtype=cupy.int32)
        top = cupy.sort(mine)[-3:]
        print("side stream sort", top.get(stream=side).tolist())
    side.synchronize()


if __name__ == "__main__":
    main()
