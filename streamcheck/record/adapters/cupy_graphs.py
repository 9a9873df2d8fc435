"""CuPy stream capture (CUDA graphs): Stream.begin_capture / end_capture, and launches of the
graphs end_capture returns.

CuPy's Graph is a Cython class whose `launch` cannot be patched, so end_capture hands the
program a small proxy (`RecordedGraph`) while recording; everything but `launch` is the
Graph's own. The proxy also carries the graph's lifetime: memory its nodes use stays alive
as long as the graph (CUDA rule), so a free of it while the graph lives is deferred.
"""
from __future__ import annotations

from .. import recorder as R
from .patching import Patch, forwarding, quiet


class RecordedGraph:
    """What Stream.end_capture returns while a recording runs: CuPy's Graph with `launch`
    recorded as a GraphLaunch of this graph's id. Launched while no recording, or another
    one, runs, it just launches."""

    __slots__ = ("graph", "graph_id", "kernel_names", "_recorder", "__weakref__")

    def __init__(self, graph, graph_id: int, kernel_names: tuple, buffers: frozenset, rec):
        self.graph = graph
        self.graph_id = graph_id
        self.kernel_names = kernel_names
        self._recorder = rec
        rec.hold_for_graph(self, buffers)

    def launch(self, stream=None):
        graph = self.graph
        if quiet() or R.current is not self._recorder:
            return graph.launch(stream)
        return R.current.graph_launch(self.graph_id, self.kernel_names, stream, lambda: graph.launch(stream))

    def __getattr__(self, name):
        return getattr(self.graph, name)

    def __repr__(self):
        return f"<streamcheck-recorded graph {self.graph_id}: {self.graph!r}>"


def wrap_begin_capture(orig):
    def begin_capture(self, mode=None):
        if quiet():
            return orig(self, mode)
        return R.current.capture_begin(self, mode, lambda: orig(self, mode))
    return forwarding(orig, begin_capture)


def wrap_end_capture(orig):
    def end_capture(self):
        if quiet():
            return orig(self)
        rec = R.current
        graph, gid, names, buffers = rec.capture_end(self, lambda: orig(self))
        if gid is None:  # begun before this recording: nothing to check it against
            return graph
        return RecordedGraph(graph, gid, names, buffers, rec)
    return forwarding(orig, end_capture)


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        Patch("cupy.cuda.stream._BaseStream.begin_capture", wrap_begin_capture),
        Patch("cupy.cuda.stream._BaseStream.end_capture", wrap_end_capture),
    )
