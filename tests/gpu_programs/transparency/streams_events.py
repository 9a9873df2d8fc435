"""Streams and events with correct waits: a producer/consumer pair of non-blocking streams
(record / wait_event both ways, so the producer's later in-place write is ordered after the
consumer's read), a fan-in wait on two events, Event.synchronize and Stream.done on the host,
the legacy stream's implicit wait for a blocking stream, and device-wide synchronizes."""
import time

import cupy

N = 1 << 20


def main():
    producer = cupy.cuda.Stream(non_blocking=True)
    consumer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        x = cupy.arange(N, dtype=cupy.float32) % 13
        ready = cupy.cuda.Event()
        ready.record(producer)
    consumer.wait_event(ready)
    with consumer:
        y = x * 3 + 1
    producer.wait_event(consumer.record())  # the consumer read x before the producer writes it again
    with producer:
        x += y
        print("producer/consumer sum", f"{float(x.sum(dtype=cupy.float64)):.1f}")

    a_stream, b_stream, c_stream = (cupy.cuda.Stream(non_blocking=True) for _ in range(3))
    with a_stream:
        pa = cupy.full(N, 1.0, dtype=cupy.float32)
    with b_stream:
        pb = cupy.full(N, 2.0, dtype=cupy.float32)
    c_stream.wait_event(a_stream.record())
    c_stream.wait_event(b_stream.record())
    with c_stream:
        pc = pa * pb + pa
        print("fan-in sum", f"{float(pc.sum()):.1f}")

    with consumer:
        big = cupy.ones(N, dtype=cupy.float64)
        big *= 2
        done = cupy.cuda.Event(block=True, disable_timing=True)
        done.record()
    done.synchronize()  # the host waits for the consumer's work, so a legacy-stream read is ordered
    print("after Event.synchronize", f"{float(big.sum()):.1f}")

    with producer:
        ramp = cupy.cumsum(cupy.ones(N, dtype=cupy.int64))
    while not producer.done:
        time.sleep(0.0005)
    print("after Stream.done", int(ramp[-1]))

    blocking = cupy.cuda.Stream()  # a blocking stream: the legacy stream waits for its work
    with blocking:
        w = cupy.full(1000, 7.0)
    print("legacy read after blocking stream", f"{float(w.sum()):.1f}")

    with producer:
        q = cupy.arange(10, dtype=cupy.int32) * 5
    cupy.cuda.Device().synchronize()
    print("after Device.synchronize", q.get().tolist())
    with consumer:
        r = q[::2] + 1
    cupy.cuda.runtime.deviceSynchronize()
    print("after runtime.deviceSynchronize", r.get().tolist())


if __name__ == "__main__":
    main()
