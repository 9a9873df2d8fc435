"""CUDA graphs on the sim's capture: `CUDAGraph` and the `torch.cuda.graph` context."""
from __future__ import annotations

import warnings

import torch

from ..core.capture import CaptureError
from .generators import CapturedDraw
from .running import ON_A_GPU, active, refused
from .streams import stream


class EmulatedGraph:
    """torch.cuda.CUDAGraph on the sim's capture, with torch's checks and messages."""

    def __init__(self, keep_graph: bool = False):
        self._emulation = active()
        self._graph = None
        self._stream = None
        self._pool = None
        self._capturing = False
        self._draws: list = []  # CapturedDraw of each random operator captured, in capture order
        # keep_graph=True keeps the captured graph apart from its executable one: instantiate() makes
        # the executable (again), and a replay instantiates it first if nothing did. The sim's graph
        # is both, so instantiating checks what torch checks and changes nothing else.
        self._keep_graph = keep_graph

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        emulation = self._emulation
        emulation.enter()
        if self._graph is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To capture a new graph, "
                               "create a new instance.")
        stream = emulation.current_stream()
        if stream == emulation.default_stream(stream.device_index):
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, "
                               "it's ok to replay them on the default stream.)")
        self._stream = stream
        self._pool = pool if pool is not None else emulation.new_pool()
        try:
            self._stream.device_stream.begin_capture(capture_error_mode)
        except CaptureError as exc:
            emulation.capture_errors.append(exc)
            raise as_torch_error(exc) from None
        users = emulation.allocator.pool_users
        users[self._pool] = users.get(self._pool, 0) + 1  # its blocks stay reserved while this graph holds it
        self._capturing = True
        emulation.capture_pools[self._stream.device_stream.id] = self._pool
        emulation.capture_graphs[self._stream.device_stream.id] = self

    def captured_draw(self, generator) -> CapturedDraw:
        draw = CapturedDraw(generator)
        self._draws.append(draw)
        return draw

    def capture_end(self) -> None:
        emulation = self._emulation
        emulation.enter()
        if not self._capturing:
            raise RuntimeError("capture_end() called before capture_begin().")
        if emulation.current_stream() != self._stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        self._capturing = False
        try:
            self._graph = self._stream.device_stream.end_capture()
        except CaptureError as exc:  # the program gets it, as torch raises CUDA's error; the run names it
            emulation.capture_errors.append(exc)
            raise as_torch_error(exc) from None
        finally:
            emulation.capture_pools.pop(self._stream.device_stream.id, None)
            emulation.capture_graphs.pop(self._stream.device_stream.id, None)
        if not self._graph.nodes:
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be captured "
                          "on wrong device or stream.", UserWarning, stacklevel=2)

    def instantiate(self) -> None:
        if self._graph is None:
            raise RuntimeError("capture_end() must have been called before calling instantiate")
        if not self._keep_graph:
            raise RuntimeError("instantiate() is intended to be called by the user only when keep_graph=true")

    def replay(self) -> None:
        emulation = self._emulation
        emulation.enter()
        if self._graph is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        for draw in self._draws:  # the generator's state now, as a replay's philox offsets are
            draw.draw_for_replay()
        self._graph.launch(emulation.current_stream().device_stream)

    def reset(self) -> None:
        self._graph = None
        self._draws = []
        self._release_pool()

    def _release_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None and not self._capturing:
            users = self._emulation.allocator.pool_users
            if users.get(pool, 0) > 0:
                users[pool] -= 1

    def __del__(self):
        self._release_pool()

    def pool(self):
        return self._pool

    def enable_debug_mode(self) -> None:
        pass

    debug_dump = staticmethod(refused("CUDAGraph.debug_dump", "the sim has no CUDA graph to dump"))
    raw_cuda_graph = staticmethod(refused(
        "CUDAGraph.raw_cuda_graph", "the sim has no cudaGraph_t to hand to CUDA's own API; " + ON_A_GPU))
    raw_cuda_graph_exec = staticmethod(refused(
        "CUDAGraph.raw_cuda_graph_exec", "the sim has no cudaGraphExec_t to hand to CUDA's own API; " + ON_A_GPU))

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
    get_graph_data = staticmethod(refused(
        "CUDAGraph.get_graph_data", "the sim's graphs have no CUDA graph nodes to describe; " + ON_A_GPU))


def as_torch_error(error: CaptureError) -> Exception:
    """The exception torch raises for CUDA's capture error on a GPU (torch.AcceleratorError, "CUDA
    error: capturing stream has unjoined work"), with streamcheck's account of it after; `capture_error`
    keeps the CaptureError the run reports (once: core.capture)."""
    kind = getattr(torch, "AcceleratorError", RuntimeError)  # torch >= 2.8; a RuntimeError before
    raised = kind(f"{error.cuda_text()} ({error})")
    raised.capture_error = error
    return raised


class graph:
    """torch.cuda.graph on the sim: synchronize, capture on the capture stream, end the capture."""

    default_capture_stream = None

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode: str = "global"):
        emulation = active()
        if stream is None:
            if graph.default_capture_stream is None or graph.default_capture_stream._emulation is not emulation:
                # torch's own capture stream, not one of the program's: named as such, numbering none of theirs
                graph.default_capture_stream = emulation.new_stream(name="torch.cuda.graph's capture stream")
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


