"""Streams and events: work handed between streams, and the caching allocator across them."""
import pytest
import torch

TEST_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not TEST_CUDA, reason="CUDA not available")

N = 1 << 14


def test_device_is_visible():
    assert torch.cuda.device_count() >= 1
    assert torch.cuda.get_device_name(0)
    assert torch.cuda.get_device_properties(0).total_memory > 0
    assert torch.zeros(1, device="cuda").is_cuda


def test_event_orders_a_consumer_after_a_producer(side_stream):
    x = torch.full((N,), 2.0, device="cuda")
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):
        y = x * 3
        done = torch.cuda.Event()
        done.record()
    torch.cuda.current_stream().wait_event(done)
    assert y.sum().item() == 6 * N
    assert done.query()


def test_elapsed_time_between_timed_events():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.ones(N, device="cuda").mul_(2)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_race_missing_wait_stream(side_stream):
    x = torch.full((N,), 2.0, device="cuda")
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):
        y = x * 3  # produced on the side stream
    # BUG: the current stream never waits for the side stream
    assert (y + 1).sum().item() == 7 * N


def test_fixed_missing_wait_stream(side_stream):
    x = torch.full((N,), 2.0, device="cuda")
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):
        y = x * 3  # produced on the side stream
    torch.cuda.current_stream().wait_stream(side_stream)
    assert (y + 1).sum().item() == 7 * N


def test_race_record_stream_missing(side_stream):
    x = torch.ones(N, device="cuda")  # allocated on the current stream
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):
        total = x.sum()  # read on the side stream
    # BUG: freed with no x.record_stream(side_stream): its block goes back to the current stream's pool
    del x
    reused = torch.full((N,), 5.0, device="cuda")  # may take x's block while the side stream reads it
    torch.cuda.current_stream().wait_stream(side_stream)
    assert total.item() == N
    assert reused[0].item() == 5.0


def test_fixed_record_stream_missing(side_stream):
    x = torch.ones(N, device="cuda")  # allocated on the current stream
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):
        total = x.sum()  # read on the side stream
    x.record_stream(side_stream)  # the block is reused only once the side stream passed this point
    del x
    reused = torch.full((N,), 5.0, device="cuda")
    torch.cuda.current_stream().wait_stream(side_stream)
    assert total.item() == N
    assert reused[0].item() == 5.0
