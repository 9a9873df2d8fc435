"""Streams CuPy did not create, and the per-thread default stream by name: a raw CUDA stream
wrapped as cupy.cuda.ExternalStream (deprecated in CuPy 14) and as
cupy.cuda.Stream.from_external (its replacement), and cupy.cuda.Stream.ptds used explicitly on
the main thread and on two worker threads. Correct: the external stream waits on an event for
the legacy stream's input, is synchronized before its arrays are dropped and before the raw
stream is destroyed; each thread synchronizes its per-thread stream before it ends."""
import threading
import warnings

import cupy


class RawStream:
    """A foreign stream handle offered through the CUDA stream protocol."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def on_ptds(index, results):
    ptds = cupy.cuda.Stream.ptds
    with ptds:
        m = cupy.full((64, 64), float(index + 2), dtype=cupy.float32)
        results[index] = float((m @ m).trace())
    ptds.synchronize()


def main():
    rt = cupy.cuda.runtime
    raw = rt.streamCreateWithFlags(rt.streamNonBlocking)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        external = cupy.cuda.ExternalStream(raw)
    if hasattr(cupy.cuda.Stream, "from_external"):
        same = cupy.cuda.Stream.from_external(RawStream(raw))
    else:  # CuPy < 14
        same = external

    x = cupy.arange(1 << 16, dtype=cupy.float32) % 17  # on the legacy stream
    ready = cupy.cuda.Event(disable_timing=True)
    ready.record(cupy.cuda.Stream.null)
    external.wait_event(ready)
    with external:
        y = x * 2
    with same:  # the same CUDA stream: ordered after `y` by issue order
        z = y + 1
        print("external stream sum", f"{float(z.sum()):.1f}", "head", z[:3].get().tolist())
    external.synchronize()
    del y, z
    rt.streamDestroy(raw)

    ptds = cupy.cuda.Stream.ptds
    with ptds:
        a = cupy.full((64, 64), 1.0, dtype=cupy.float32)
        print("ptds matmul trace", f"{float((a @ a).trace()):.1f}")
    ptds.synchronize()
    results = [None, None]
    threads = [threading.Thread(target=on_ptds, args=(i, results)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("ptds threads", [f"{r:.1f}" for r in results])


if __name__ == "__main__":
    main()
