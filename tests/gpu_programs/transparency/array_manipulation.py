"""ndarray operations that streamcheck intercepts one by one: arithmetic, comparisons, indexing
(basic, fancy, boolean), __setitem__, astype, reshape/ravel/transpose, concatenate/stack/where,
take/put/repeat/tile/roll/flip/clip/round, copyto, printing and item(); then two halves of one
array written on two streams and read on the legacy stream after it waited on both events."""
import cupy


def main():
    a = cupy.arange(24, dtype=cupy.float64).reshape(4, 6)
    print(a[1:3, ::2])
    print("arith", float((a * 2 - 1).sum()), float((a / 4).max()), int((a // 5).sum()), float((a % 5).sum()),
          float((a ** 2).mean()), float((-a).min()), float(abs(-a).sum()))
    print("compare", int((a > 10).sum()), int((a == 3).sum()), bool((a >= 0).all()), bool((a < 0).any()))
    print("fancy", a[[0, 2, 3], [1, 4, 5]].get().tolist(), "mask", a[a % 7 == 0].get().tolist())
    b = a.copy()
    b[0] = -1
    b[:, 5] = cupy.arange(4) * 100
    b[b > 20] = 0
    print("setitem", b.get().astype(int).tolist())
    ints = a.astype(cupy.int32).ravel()
    print("astype/ravel", ints.dtype, ints[-3:].tolist(), "transpose", a.T.copy().shape, a.T.flatten()[:4].tolist())
    cat = cupy.concatenate([a[0], a[3]])
    stk = cupy.stack([a[0], a[1]], axis=1)
    whr = cupy.where(a > 11, a, -a)
    print("concat", cat.get().tolist(), "stack", stk.shape, "where", float(whr.sum()))
    print("take", cupy.take(a, cupy.asarray([5, 7, 11])).get().tolist(),
          "repeat", cupy.repeat(cupy.arange(3), 2).get().tolist(), "tile", cupy.tile(cupy.arange(2), 3).get().tolist())
    print("roll", cupy.roll(cupy.arange(5), 2).get().tolist(), "flip", cupy.flip(cupy.arange(4)).get().tolist(),
          "clip", a.clip(3, 8)[0].get().tolist(), "round", cupy.asarray([1.26, 2.51]).round(1).get().tolist())
    target = cupy.zeros(5)
    target.put(cupy.asarray([0, 2]), cupy.asarray([7.0, 9.0]))
    cupy.copyto(target[3:], cupy.asarray([1.5, 2.5]))
    print("put/copyto", target.get().tolist(), "item", a[2, 3].item(), "asnumpy", cupy.asnumpy(a[3])[:2].tolist())
    print(repr(cupy.arange(3, dtype=cupy.int8)))

    whole = cupy.zeros(1 << 20, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()  # the zeroing (legacy stream) is done before other streams write
    half = whole.size // 2
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with s1:
        whole[:half] = 1.0
        first = s1.record()
    with s2:
        whole[half:] = 2.0
        second = s2.record()
    cupy.cuda.Stream.null.wait_event(first)
    cupy.cuda.Stream.null.wait_event(second)
    print("halves on two streams", float(whole.sum()), float(whole[half - 1]), float(whole[half]))


if __name__ == "__main__":
    main()
