"""CUDA graphs: capture once, replay with new inputs, and forks inside a capture."""
import pytest
import torch

TEST_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not TEST_CUDA, reason="CUDA not available")

N = 1 << 12


def captured_affine(static_in):
    """A graph computing static_in * 2 + 1, warmed up on a side stream as torch's docs advise."""
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        for _ in range(2):
            static_in * 2 + 1
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in * 2 + 1
    return graph, static_out


def test_graph_replays_with_new_inputs():
    static_in = torch.zeros(N, device="cuda")
    graph, static_out = captured_affine(static_in)
    results = []
    for value in (1.0, 2.0, 3.0):
        static_in.fill_(value)
        graph.replay()
        results.append(static_out[0].item())
    assert results == [3.0, 5.0, 7.0]


def test_capture_is_seen_as_capturing():
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(N, device="cuda")
    assert not torch.cuda.is_current_stream_capturing()
    with torch.cuda.graph(graph):
        capturing = torch.cuda.is_current_stream_capturing()
        y = x + 1
    graph.replay()
    assert capturing
    assert y.sum().item() == 2 * N


def test_race_graph_input_staged_unwaited(side_stream):
    static_in = torch.zeros(N, device="cuda")
    graph, static_out = captured_affine(static_in)
    results = []
    for value in (1.0, 2.0, 3.0):
        side_stream.wait_stream(torch.cuda.current_stream())  # the previous replay has read static_in
        with torch.cuda.stream(side_stream):
            static_in.fill_(value)  # the next input, staged on a side stream
        # BUG: the replay never waits for the side stream
        graph.replay()
        results.append(static_out[0].item())
    assert results == [3.0, 5.0, 7.0]


def test_fixed_graph_input_staged_unwaited(side_stream):
    static_in = torch.zeros(N, device="cuda")
    graph, static_out = captured_affine(static_in)
    results = []
    for value in (1.0, 2.0, 3.0):
        side_stream.wait_stream(torch.cuda.current_stream())  # the previous replay has read static_in
        with torch.cuda.stream(side_stream):
            static_in.fill_(value)  # the next input, staged on a side stream
        torch.cuda.current_stream().wait_stream(side_stream)
        graph.replay()
        results.append(static_out[0].item())
    assert results == [3.0, 5.0, 7.0]


def test_race_graph_fork_unjoined(side_stream):
    x = torch.ones(N, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        side_stream.wait_stream(torch.cuda.current_stream())  # forks the capture onto the side stream
        with torch.cuda.stream(side_stream):
            y = x * 2
        # BUG: the capture stream never joins the side stream back: CUDA refuses to end the capture
    graph.replay()
    torch.cuda.synchronize()
    assert y.sum().item() == 2 * N


def test_fixed_graph_fork_unjoined(side_stream):
    x = torch.ones(N, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        side_stream.wait_stream(torch.cuda.current_stream())  # forks the capture onto the side stream
        with torch.cuda.stream(side_stream):
            y = x * 2
        torch.cuda.current_stream().wait_stream(side_stream)  # joins it back before the capture ends
    graph.replay()
    torch.cuda.synchronize()
    assert y.sum().item() == 2 * N
