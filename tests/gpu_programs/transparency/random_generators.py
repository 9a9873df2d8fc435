"""cupy.random, seeded: the Generator API (default_rng: random, standard_normal, integers) and the
legacy API (seed, normal, permutation, RandomState, shuffle, choice), then a generator that
lives on a non-blocking stream. Correct: each generator's state is used on one stream only, and
each value is read on the stream that produced it."""
import cupy


def main():
    rng = cupy.random.default_rng(2024)
    u = rng.random(1 << 16)
    z = rng.standard_normal(1 << 16, dtype=cupy.float32)
    k = rng.integers(0, 10, size=1 << 16)
    print("default_rng random mean", f"{float(u.mean()):.6f}", "first", f"{float(u[0]):.6f}")
    print("standard_normal", z.dtype, "mean", f"{float(z.mean()):.5f}", "std", f"{float(z.std()):.5f}")
    print("integers counts", cupy.bincount(k, minlength=10).get().tolist())

    cupy.random.seed(7)
    normal = cupy.random.normal(loc=1.0, scale=2.0, size=(1000,))
    print("legacy normal mean", f"{float(normal.mean()):.5f}", "first", f"{float(normal[0]):.5f}")
    print("legacy permutation", cupy.random.permutation(20).get().tolist())
    state = cupy.random.RandomState(99)
    print("RandomState uniform", [f"{v:.6f}" for v in state.uniform(size=4).get()])
    deck = cupy.arange(12)
    state.shuffle(deck)
    print("shuffle", deck.get().tolist())
    print("choice", state.choice(100, size=5, replace=False).get().tolist())

    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        local = cupy.random.default_rng(5)  # its state is allocated and initialized on `side`
        draws = local.standard_normal(1000)
        print("side stream sum", f"{float(draws.sum()):.5f}")
    side.synchronize()


if __name__ == "__main__":
    main()
