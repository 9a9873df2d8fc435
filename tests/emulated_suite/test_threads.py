"""Host threads: a producer thread makes CUDA tensors on its own stream and hands them to the
test's thread through a queue."""
import queue
import threading

import pytest
import torch

TEST_CUDA = torch.cuda.is_available()
N = 1 << 14
STEPS = 4


def produce(out: queue.Queue, stream: torch.cuda.Stream, with_events: bool) -> None:
    """STEPS tensors made on `stream` (in this thread), each put in `out` with the event recorded
    after it (or None), then None to say it is done."""
    try:
        with torch.cuda.stream(stream):
            for step in range(STEPS):
                t = torch.full((N,), float(step), device="cuda")
                t.mul_(2)
                ready = None
                if with_events:
                    ready = torch.cuda.Event()
                    ready.record()
                out.put((t, ready))
    finally:
        out.put(None)


@pytest.mark.skipif(not TEST_CUDA, reason="CUDA not available")
def test_worker_thread_has_its_own_current_stream(side_stream):
    seen = {}

    def worker():
        seen["before"] = torch.cuda.current_stream()
        with torch.cuda.stream(side_stream):
            seen["inside"] = torch.cuda.current_stream()

    with torch.cuda.stream(side_stream):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert seen["before"] == torch.cuda.default_stream()  # a new thread starts on the default stream
    assert seen["inside"] == side_stream


@pytest.mark.skipif(not TEST_CUDA, reason="CUDA not available")
def test_race_queue_handoff_without_event(side_stream):
    handoff = queue.Queue()
    producer = threading.Thread(target=produce, args=(handoff, side_stream, False))
    producer.start()
    sums = []
    while (item := handoff.get()) is not None:
        t, _ = item
        # BUG: the consumer's stream never waits for the producer's stream
        sums.append(t.sum().item())
    producer.join()
    assert sums == [2.0 * step * N for step in range(STEPS)]


@pytest.mark.skipif(not TEST_CUDA, reason="CUDA not available")
def test_fixed_queue_handoff_without_event(side_stream):
    handoff = queue.Queue()
    producer = threading.Thread(target=produce, args=(handoff, side_stream, True))
    producer.start()
    sums = []
    while (item := handoff.get()) is not None:
        t, ready = item
        torch.cuda.current_stream().wait_event(ready)  # the producer's work on `t` is done first
        t.record_stream(torch.cuda.current_stream())  # and its block outlives this stream's use of it
        sums.append(t.sum().item())
    producer.join()
    assert sums == [2.0 * step * N for step in range(STEPS)]
