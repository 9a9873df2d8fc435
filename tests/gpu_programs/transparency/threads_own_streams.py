"""Host threads, one cupy.cuda.Stream each: every thread reads a shared input, runs elementwise
work, a scan and a cuBLAS matmul on its own non-blocking stream, synchronizes that stream and
hands a host value back; the main thread joins them all before printing. Correct: the input is
complete (device synchronize) before the threads start, each thread's arrays stay on its
stream, and join orders each thread's synchronized work before the main thread's reads."""
import threading

import cupy

WORKERS = 4


def worker(index, base, results):
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        scaled = base * (index + 1)
        running = cupy.cumsum(scaled)
        square = cupy.full((64, 64), float(index + 1), dtype=cupy.float32)
        product = square @ square
        results[index] = (float(running[-1]), float(product[0, 0]), int(scaled.max()))
    stream.synchronize()


def main():
    base = cupy.arange(1 << 16, dtype=cupy.float64) % 10
    cupy.cuda.Device().synchronize()  # the shared input is complete before any thread reads it
    results = [None] * WORKERS
    threads = [threading.Thread(target=worker, args=(i, base, results)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index, (total, corner, peak) in enumerate(results):
        print(f"worker {index}: cumsum {total:.1f} matmul corner {corner:.1f} max {peak}")


if __name__ == "__main__":
    main()
