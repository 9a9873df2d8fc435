"""CUDA graphs on the sim's capture: `CUDAGraph` and the `torch.cuda.graph` context."""
from __future__ import annotations

from ..core.capture import CaptureError
from ..device.objects import caller_site
from .running import ON_A_GPU, EmulationError, active, refused
from .streams import stream


class EmulatedGraph:
    """torch.cuda.CUDAGraph on the sim's capture."""

    def __init__(self, keep_graph: bool = False):
        self._emulation = active()
        self._graph = None
        self._stream = None
        self._pool = None
        # keep_graph=True keeps the captured graph apart from its executable one: instantiate() makes
        # the executable (again), and a replay instantiates it first if nothing did. The sim's graph
        # is both, so instantiating checks what torch checks and changes nothing else.
        self._keep_graph = keep_graph

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        emulation = self._emulation
        emulation.enter()
        self._stream = emulation.current_stream()
        self._pool = pool if pool is not None else emulation.new_pool()
        try:
            self._stream.device_stream.begin_capture(capture_error_mode)
        except CaptureError as exc:
            emulation.capture_errors.append(exc)
            raise
        emulation.capture_pools[self._stream.device_stream.id] = self._pool

    def capture_end(self) -> None:
        emulation = self._emulation
        emulation.enter()
        try:
            self._graph = self._stream.device_stream.end_capture()
        except CaptureError as exc:  # the program gets it, as torch raises CUDA's error; the run names it
            emulation.capture_errors.append(exc)
            raise
        finally:
            emulation.capture_pools.pop(self._stream.device_stream.id, None)

    def instantiate(self) -> None:
        if self._graph is None:
            raise RuntimeError("capture_end() must have been called before calling instantiate")
        if not self._keep_graph:
            raise RuntimeError("instantiate() is intended to be called by the user only when keep_graph=true")

    def replay(self) -> None:
        emulation = self._emulation
        emulation.enter()
        if self._graph is None:
            raise RuntimeError("CUDAGraph::replay: called before a successful capture")
        self._graph.launch(emulation.current_stream().device_stream)

    def reset(self) -> None:
        self._graph = None

    def pool(self):
        return self._pool

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, *args, **kwargs) -> None:
        raise EmulationError(f"CUDAGraph.debug_dump at {caller_site()}: the sim has no CUDA graph to dump")

    def raw_cuda_graph(self):
        raise EmulationError(f"CUDAGraph.raw_cuda_graph at {caller_site()}: the sim has no cudaGraph_t to hand to "
                             "CUDA's own API; check this program on a GPU (streamcheck run --backend gpu)")

    def raw_cuda_graph_exec(self):
        raise EmulationError(f"CUDAGraph.raw_cuda_graph_exec at {caller_site()}: the sim has no cudaGraphExec_t to "
                             "hand to CUDA's own API; check this program on a GPU (streamcheck run --backend gpu)")

    register_generator_state = staticmethod(refused(
        "CUDAGraph.register_generator_state", "registering another generator with a graph is not emulated (the "
        "sim's graphs replay the default generators' draws); " + ON_A_GPU))
    get_currently_capturing_graph = staticmethod(refused(
        "CUDAGraph.get_currently_capturing_graph", "the sim's captures are not torch graph objects; use "
        "torch.cuda.is_current_stream_capturing(), or " + ON_A_GPU))
    begin_capture_to_if_node = staticmethod(refused(
        "CUDAGraph.begin_capture_to_if_node", "conditional graph nodes are not emulated; " + ON_A_GPU))
    end_capture_to_conditional_node = staticmethod(refused(
        "CUDAGraph.end_capture_to_conditional_node", "conditional graph nodes are not emulated; " + ON_A_GPU))

    def get_graph_data(self):
        raise EmulationError(f"CUDAGraph.get_graph_data at {caller_site()}: the sim's graphs have no CUDA graph "
                             "nodes to describe; check this program on a GPU (streamcheck run --backend gpu)")


class graph:
    """torch.cuda.graph on the sim: synchronize, capture on the capture stream, end the capture."""

    default_capture_stream = None

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode: str = "global"):
        emulation = active()
        if stream is None:
            if graph.default_capture_stream is None or graph.default_capture_stream._emulation is not emulation:
                graph.default_capture_stream = emulation.new_stream()
            stream = graph.default_capture_stream
        self.cuda_graph, self.pool, self.capture_stream, self.mode = cuda_graph, pool, stream, capture_error_mode

    def __enter__(self):
        emulation = active()
        emulation.synchronize()  # torch synchronizes the device before a capture
        self._context = stream(self.capture_stream)
        self._context.__enter__()
        self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.mode)

    def __exit__(self, *exc):
        try:
            self.cuda_graph.capture_end()
        finally:
            self._context.__exit__(*exc)


