# transparency-env: CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1
"""Run with CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: CuPy's default stream is then each host
thread's per-thread default stream, and threads that never name a stream still run
concurrently. CuPy reads the variable once, when it is imported, so the program sets it before
importing CuPy; `streamcheck run` imports CuPy before the script starts, so the first line tells
the transparency test to set it in the environment of both runs. Correct: the main thread
synchronizes its stream before the threads read its input, each thread synchronizes its own
stream before it ends, and join hands that over to the main thread."""
import os

os.environ["CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"] = "1"

import threading  # noqa: E402

import cupy  # noqa: E402

WORKERS = 3


def worker(index, base, results):
    own = cupy.cuda.get_current_stream() == cupy.cuda.Stream.ptds
    values = cupy.sqrt(base + index)
    total = values.sum()
    matrix = cupy.full((32, 32), float(index + 1), dtype=cupy.float32)
    trace = (matrix @ matrix).trace()
    cupy.cuda.get_current_stream().synchronize()
    results[index] = (own, float(total), float(trace))


def main():
    print("main thread on its per-thread default stream", cupy.cuda.get_current_stream() == cupy.cuda.Stream.ptds)
    base = cupy.arange(1 << 16, dtype=cupy.float32)
    cupy.cuda.get_current_stream().synchronize()  # the input is complete before the threads read it
    results = [None] * WORKERS
    threads = [threading.Thread(target=worker, args=(i, base, results)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index, (own, total, trace) in enumerate(results):
        print(f"worker {index}: per-thread stream {own} sqrt sum {total:.2f} trace {trace:.1f}")


if __name__ == "__main__":
    main()
