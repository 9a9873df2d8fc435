"""torch CUDA graphs: `torch.cuda.graph(g)` / `CUDAGraph.capture_begin`, `capture_end` and
`replay`, recorded as CaptureBegin / CaptureEnd / GraphLaunch on torch's current stream (the
capture stream inside `torch.cuda.graph`). While a capture is open the operators torch issues
are captured, not run: the checker holds them as graph nodes, so a side stream forked into the
capture and never joined back is CUDA's cudaErrorStreamCaptureUnjoined, named with its stream
and last kernel. No spin is ever captured (recorder.maybe_spin asks the driver first).

CUDAGraph is a Python subclass of torch._C._CUDAGraph: its methods are wrapped in place. A
graph captured before the recording started has no recorded nodes: its replays are named in a
notice (once per graph), never silently missed.

CUDA graph trees (`torch.compile(mode="reduce-overhead")`) warm a function up eagerly with its
allocations going to the trees' private pool (`_use_cuda_memory_pool_manager`): the blocks
allocated there are filed as graph-pool blocks, as those of a capture are (torch_runtime.py
says why their frees are not frees).
"""
from __future__ import annotations

import contextlib
import threading

from .. import recorder as R
from .patching import Patch, forwarding, quiet
from .torch_runtime import current_stream_ptr, state

GRAPH_TREES = "torch._inductor.cudagraph_trees"


def _capture_begin(orig):
    def capture_begin(self, *args, **kwargs):
        if quiet():
            return orig(self, *args, **kwargs)
        rec = R.current
        mode = kwargs.get("capture_error_mode", args[1] if len(args) > 1 else "global")
        stream = current_stream_ptr(rec.gpu.torch)
        return rec.capture_begin(stream, mode, lambda: orig(self, *args, **kwargs))
    return forwarding(orig, capture_begin)


def _capture_end(orig):
    def capture_end(self):
        if quiet():
            return orig(self)
        rec = R.current
        result, gid, names, buffers = rec.capture_end(current_stream_ptr(rec.gpu.torch), lambda: orig(self))
        if gid is not None:
            self._streamcheck_graph = (rec, gid, names)
            rec.hold_for_graph(self, buffers)
        return result
    return forwarding(orig, capture_end)


def _replay(orig):
    def replay(self):
        if quiet():
            return orig(self)
        captured = getattr(self, "_streamcheck_graph", None)
        rec = R.current
        if captured is None or captured[0] is not rec:
            _unseen_replay(rec, self)
            return orig(self)
        rec, gid, names = captured
        return rec.graph_launch(gid, names, current_stream_ptr(rec.gpu.torch), lambda: orig(self))
    return forwarding(orig, replay)


def _unseen_replay(rec, graph) -> None:
    """A graph this recording did not capture (captured before it started, or by another one):
    its nodes are unknown, so its replays are unseen work. Said once per graph."""
    told = rec.state.setdefault("unseen graphs", set())
    if id(graph) in told:
        return
    told.add(id(graph))
    rec.notice(f"a torch CUDA graph captured before the recording started was replayed at {rec.site()}: its work "
               "is not seen (not recorded, not checked); capture it while the recording runs (under `streamcheck "
               "run` everything the script captures is)")


def _pool_manager(orig):
    def pool_manager(device, mem_pool, stream):
        rec = R.current
        if quiet() or "torch" not in rec.state:
            return orig(device, mem_pool, stream)
        return _allocating_to_graph_pool(rec, orig(device, mem_pool, stream))
    return forwarding(orig, pool_manager)


@contextlib.contextmanager
def _allocating_to_graph_pool(rec, manager):
    threads, ident = state(rec).graph_pool_threads, threading.get_ident()
    with manager:  # torch synchronizes the device, then this thread allocates to the pool
        rec.flush()  # the native observer's records drained by the rule of the time they were made
        threads[ident] = threads.get(ident, 0) + 1
        try:
            yield
        finally:
            rec.flush()
            threads[ident] -= 1


def install(rec, patcher) -> None:
    if "torch" not in rec.state:  # torch_runtime refused this torch (notice given)
        return
    # Graph trees are imported at the first reduce-overhead compile, maybe after the start.
    patcher.after_import(GRAPH_TREES, lambda module: patcher.apply(
        Patch(f"{GRAPH_TREES}._use_cuda_memory_pool_manager", _pool_manager)))


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        Patch("torch.cuda.graphs.CUDAGraph.capture_begin", _capture_begin),
        Patch("torch.cuda.graphs.CUDAGraph.capture_end", _capture_end),
        Patch("torch.cuda.graphs.CUDAGraph.replay", _replay),
    )
