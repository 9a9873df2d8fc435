"""The `sim` backend: a virtual CUDA device on the CPU.

Each stream is a queue of pending operations over buffers that hold real numpy
data. Host calls enqueue; after every host call the policy decides which ready
operations execute before the host goes on. An operation is ready when the one
before it on its stream has executed and its CUDA dependencies have: for a wait,
the work captured by the event *when the wait was issued*; for the legacy default
stream, all work issued earlier on blocking streams (and the reverse). A consumer
that nothing orders after its producer can therefore run first and read stale
values, exactly as on a GPU.

A kernel gets read-only views of the arguments that no declared write of its launch
overlaps: a write the launch did not declare fails at that write (UndeclaredWriteError)
instead of going unseen by the checker. A GPU cannot do this; the sim is where it shows.

Time is counted in host calls: every device call that issues work, touches memory
or synchronizes (alloc, free, launch, copies, host reads/writes, record, wait, the
synchronizes) ends with one scheduling step; creating streams and events does not.

A host synchronize blocks the host: the scheduler keeps executing until the
awaited work (and everything it depends on) has run. Injected delays do not
apply to that work, so a synchronize always completes; unrelated delayed work
stays pending, so `stream.synchronize()` does not drain other streams.

Several devices: each stream and buffer belongs to one (Device("sim", devices=N)); each
device has its own legacy default stream, which blocking streams of that device only join,
and a device synchronize drains that device's streams only. A collective (all_reduce,
reduce_scatter, all_to_all) is one part per rank on the rank's comm stream; a part is ready
only once every rank's comm stream has reached the collective (NCCL's kernels wait for each
other), the first part to run computes every rank's result from the inputs as they are then
(really summed), and each part writes its own rank's output when it runs.

Stream capture: work issued to a capturing stream (the device's CaptureTracker says
which) is held as a graph node and not executed. A graph launch on stream L is a start
marker on L, the graph's nodes on lanes (one per captured stream, scheduled like
streams, with ids from 1000 up that never clash with a live stream's), and an end marker
on L that waits for every lane: so the graph runs after earlier work on L and before
later work on L. Inside the graph a node is ready once its graph predecessors (the
capture's vector clock) and its lane's earlier nodes have executed, and the policy
chooses among ready lanes like among streams: a missing edge inside a graph can strike,
and every choice goes into the schedule, so seeds and replay strings reproduce it.
Ready lanes are offered after the streams, ordered by their next node's capture order,
so `sequential`/`eager` run a graph in capture order. Delays: a lane carries its
captured stream's name, so a delay on stream A (or on kernel k) holds A's nodes (or k's)
inside every launch too, counted from the launch; a delay on L holds the launch itself
(its start marker); the end marker is bookkeeping and never held. Times: `op_times` of a
GraphLaunch spans its start to its end marker; `node_times` maps (launch trace index,
node index) to each node's execution.
"""
from __future__ import annotations

import inspect
import os
import traceback
from collections import deque
from typing import Optional

import numpy as np

from ...core.capture import CapturedGraph
from ...core.schedule import HOST, Policy, Replay, Schedule, ScheduleError, make_policy
from ...core.trace import CallSite, StreamKind
from ..objects import Buffer, DeviceError, KernelError, Region, UndeclaredWriteError
from .protocol import Backend

_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


_UNKNOWN = object()
_LANE_BASE = 1000  # graph lanes take ids from here up, skipping ids of live streams
_BOOKKEEPING = -(1 << 62)  # issued_at of a graph's end marker: "long ago", so no delay applies


class _Pending:
    """One operation waiting on its stream. Policies read `stream`, `stream_name`,
    `name`, `kind` ("launch", "copy", "record", "wait", "graph", "sleep"), `site` and `issued_at`.
    `trace_index`: the trace index of its call; (graph launch's index, node index) for
    a graph node; None for a graph's end marker."""

    __slots__ = ("sim", "seq", "deps", "run", "args", "name", "kind", "issued_at", "trace_index", "release", "site")

    def __init__(self, sim, seq, deps, run, args, name, kind, issued_at, trace_index, site=None):
        self.sim = sim
        self.seq = seq
        self.deps = deps  # ((_SimStream, seq), ...): executes after those have
        self.run = run  # executing is run(*args); None for records and waits
        self.args = args
        self.name = name
        self.kind = kind
        self.issued_at = issued_at
        self.trace_index = trace_index
        self.release = _UNKNOWN  # the policy's release_at(), asked once
        self.site = site

    @property
    def stream(self) -> int:
        return self.sim.id

    @property
    def stream_name(self) -> str:
        return self.sim.name


class _HostOp:
    """What Policy.starting() gets for an access the host makes itself (host read or write,
    a free): it executes when issued, so it has no stream of its own."""

    __slots__ = ("stream", "stream_name", "name", "kind", "site", "trace_index")

    def __init__(self, op, trace_index: int, stream: int, name: str):
        self.stream = stream
        self.stream_name = "host"
        self.name = name
        self.kind = "host"
        self.site = op.site
        self.trace_index = trace_index


class _SimDevice:
    """One device's legacy default stream and the streams that synchronize with it."""

    __slots__ = ("legacy", "joiners")

    def __init__(self):
        self.legacy: Optional[_SimStream] = None
        self.joiners: list[_SimStream] = []


class _SimStream:
    __slots__ = ("id", "name", "kind", "is_legacy", "joins_legacy", "queue", "with_deps", "issued", "executed",
                 "device_index", "dev")

    def __init__(self, stream):
        self.id = stream.id
        self.device_index = stream.device_index
        self.dev: Optional[_SimDevice] = None  # set by new_stream; lanes have none (never legacy nor blocking)
        self.name = stream.name
        self.kind = stream.kind
        self.is_legacy = stream.kind is StreamKind.LEGACY
        self.joins_legacy = stream.kind.joins_legacy
        self.queue: deque = deque()
        # The pending operations that have dependencies, in order (some may have executed
        # already): a host synchronize follows these, not the whole queue.
        self.with_deps: deque = deque()
        self.issued = 0  # operations issued so far; the n-th has seq n
        self.executed = 0  # operations executed so far (always a prefix: stream order)


class _Lane:
    """What _SimStream needs to know of a graph lane: a captured stream's nodes in one launch."""

    __slots__ = ("id", "name", "kind", "device_index")

    def __init__(self, id: int, name: str):
        self.id = id
        self.device_index = 0
        self.name = name  # the captured stream's: delays aimed at it hold its nodes too
        self.kind = StreamKind.NON_BLOCKING  # the graph orders a lane; the legacy stream never does


class SimGraph:
    """The sim's executable graph: the captured nodes with what running each one means."""

    __slots__ = ("captured", "nodes", "members", "deps")

    def __init__(self, captured: CapturedGraph, nodes: tuple, names: dict):
        self.captured = captured
        self.nodes = nodes  # (CapturedNode, run, args, name, kind) in capture order
        # Captured streams that hold nodes, by first node: one lane each per launch.
        members: dict = {}
        for node in captured.nodes:
            members.setdefault(node.stream, names.get(node.stream, f"stream{node.stream}"))
        self.members = tuple(members.items())
        # Node j waits, on every other lane s, for s's first j.clock[s] nodes; its own
        # lane's earlier nodes come first by lane order.
        self.deps = tuple(tuple((s, n) for s, n in node.clock.items() if s != node.stream and n > 0)
                          for node in captured.nodes)

    @property
    def id(self) -> int:
        return self.captured.id

    def __repr__(self) -> str:
        return f"SimGraph({self.id}, {len(self.nodes)} nodes on {len(self.members)} lanes)"


def _byte_view(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array (regions are contiguous rows), as a writable view."""
    return array.reshape(-1).view(np.uint8)


def _copy_bytes(dst, src) -> None:
    # cudaMemcpyAsync copies bytes, whatever the element types.
    _byte_view(dst.array())[...] = _byte_view(src.array())


def _copy_from_host(dst, host_array) -> None:
    dst.array()[...] = host_array.reshape(dst.array().shape)


def _copy_to_host(out, src) -> None:
    out[...] = src.array()


def _collective_results(name: str, inputs) -> list:
    """Every rank's output of collective `name`, from the ranks' inputs as they are now."""
    values = [np.array(region.array(), copy=True) for region in inputs]
    ranks = len(values)
    if name == "all_reduce":
        total = np.sum(values, axis=0, dtype=values[0].dtype)
        return [total.copy() for _ in range(ranks)]
    chunks = [np.split(v, ranks) for v in values]  # rows in `ranks` equal chunks (checked by the device)
    if name == "reduce_scatter":
        return [np.sum([chunks[j][k] for j in range(ranks)], axis=0, dtype=values[0].dtype) for k in range(ranks)]
    return [np.concatenate([chunks[j][k] for j in range(ranks)]) for k in range(ranks)]  # all_to_all


def _run_collective(name: str, state: dict, rank: int, outputs, inputs) -> None:
    if "results" not in state:
        state["results"] = _collective_results(name, inputs)
    outputs[rank].array()[...] = state["results"][rank]


class SimBackend(Backend):
    """Device-API backend on the CPU. See the module docstring."""

    name = "sim"
    supports_capture = True
    max_devices = None  # any number, on the CPU

    def __init__(self, device, policy="eager", seed: int = 0, **params):
        if isinstance(policy, Policy):
            if params:
                raise ScheduleError(f"policy parameters {sorted(params)} given with an already built policy "
                                    f"{policy.describe()}; pass the policy by name instead")
            self.policy = policy
        else:
            self.policy = make_policy(policy, seed, **params)
        self.schedule = Schedule(self.policy.describe(), self.policy.seed, name=self.policy.name,
                                 params=self.policy.params())
        # A policy that never holds anything needs no hold check (the common, fast case);
        # one with release_at() is asked once per operation rather than at every decision.
        self._hold = self.policy.hold if type(self.policy).hold is not Policy.hold else None
        self._release_at = getattr(self.policy, "release_at", None)
        # Told before each operation executes, only if the policy wants to know (Confirm).
        self._starting = self.policy.starting if type(self.policy).starting is not Policy.starting else None
        # With nothing ready the host goes on; only a replay must be asked (it consumes the `h`).
        self._ask_when_idle = isinstance(self.policy, Replay)
        self.now = 0  # host calls so far: the unit of injected delay
        self._trace = device.trace
        # trace index -> (start, end) in scheduler steps: the sim's clock for timelines.
        self.op_times: dict[int, tuple] = {}
        self._step = 0
        self._pending = 0
        self._sleeping = 0  # sleep operations pending (Device.sleep): only then does _ready look for them
        self._streams: dict[int, _SimStream] = {}
        self._order: list[_SimStream] = []
        self._devices: dict[int, _SimDevice] = {}
        self._events: dict[int, Optional[tuple]] = {}  # event id -> (_SimStream, seq) of its last record
        self._tracker = device.capture_tracker  # what a capture holds: shared with the device
        self._held: dict = {}  # graph id being captured -> [(run, args, name, kind), ...] in issue order
        self._lanes: list = []  # lanes of graph launches that started and have not ended
        # (graph launch trace index, node index) -> (start, end) in scheduler steps.
        self.node_times: dict = {}

    # --- objects ------------------------------------------------------------------------
    def dtype(self, dtype) -> np.dtype:
        supported = f"the sim backend holds numpy data and supports {', '.join(sorted(_DTYPES))}"
        try:
            dt = np.dtype(dtype)
        except TypeError:  # not a numpy dtype at all (bfloat16, a typo): say what would do
            raise TypeError(supported) from None
        if dt.name not in _DTYPES:
            raise TypeError(supported)
        return dt

    def new_stream(self, stream) -> None:
        if stream.id in self._streams:
            raise DeviceError(f"sim: stream id {stream.id} is taken by a lane of a running graph; "
                              f"create fewer than {_LANE_BASE} streams, or synchronize graphs first")
        sim = _SimStream(stream)
        dev = sim.dev = self._devices.setdefault(sim.device_index, _SimDevice())
        self._streams[stream.id] = sim
        self._order.append(sim)
        if stream.kind is StreamKind.LEGACY:
            dev.legacy = sim
        elif stream.kind.joins_legacy:
            dev.joiners.append(sim)

    def new_event(self, event) -> None:
        self._events[event.id] = None

    def alloc(self, buf, fill) -> None:
        if fill is not None and np.ndim(fill) == 0 and fill == 0:
            buf.storage = np.zeros(buf.shape, dtype=buf.dtype)  # pages the program never writes cost no memory
        elif fill is not None:
            buf.storage = np.full(buf.shape, fill, dtype=buf.dtype)
        elif buf.dtype.kind == "f":
            buf.storage = np.full(buf.shape, np.nan, dtype=buf.dtype)  # uninitialised memory is garbage
        else:
            buf.storage = np.zeros(buf.shape, dtype=buf.dtype)

    def free(self, buf, stream) -> None:
        # The storage stays: work still pending on other streams may touch it (the checker
        # reports that as a FREE race); a real allocator would hand the bytes to someone else.
        self._host_starting("free", HOST if stream is None else stream.id)

    def _host_starting(self, name: str, stream: int = HOST) -> None:
        """Tell the policy (if it asks) that the call the device just recorded executes now."""
        if self._starting is not None:
            index = len(self._trace.ops) - 1
            self._starting(_HostOp(self._trace.ops[index], index, stream, name))

    # --- issuing ------------------------------------------------------------------------
    def _enqueue(self, stream, run, args: tuple, name: str, kind: str, deps: tuple = (), back: int = 1) -> tuple:
        sim = self._streams[stream.id]
        if sim.is_legacy:
            # Legacy stream: waits for all work issued so far on its device's blocking streams.
            deps = deps + tuple([(j, j.issued) for j in sim.dev.joiners if j.issued > j.executed])
        elif sim.joins_legacy:
            legacy = sim.dev.legacy
            if legacy is not None and legacy.issued > legacy.executed:
                # ... and later work on blocking streams waits for their device's legacy stream.
                deps = deps + ((legacy, legacy.issued),)
        seq = sim.issued = sim.issued + 1
        # The device recorded this operation `back` operations ago (1: just before calling us);
        # it is issued at the coming host step (tick() advances `now` after the call).
        index = len(self._trace.ops) - back
        op = _Pending(sim, seq, deps, run, args, name, kind, self.now + 1, index, self._trace.ops[index].site)
        sim.queue.append(op)
        if deps:
            sim.with_deps.append(op)
        self._pending += 1
        return sim, seq

    # Operations are (bound method, arguments) rather than closures: a launch is the hot path.
    def launch(self, stream, kernel, args, name, site) -> None:
        # An argument that no declared write overlaps is passed read-only, so a kernel that writes
        # what it declared only in reads= fails at that write instead of racing unseen.
        writes = self._trace.ops[-1].writes  # of the Launch the device recorded just before
        read_only = []
        for i, arg in enumerate(args):
            kind = type(arg)
            if kind is Buffer:
                arg = arg.region()
            elif kind is not Region:
                continue
            rng = arg.byte_range()
            for w in writes:  # Range.overlaps, inlined: this runs per argument of every launch
                if w.buffer == rng.buffer and w.start < rng.stop and rng.start < w.stop:
                    break
            else:
                read_only.append(i)
        self._issue_work(stream, self._run_kernel, (kernel, args, tuple(read_only), name, site, stream), name,
                         "launch")

    def sleep(self, stream, steps: int, name: str) -> None:
        """A spin kernel: held until `steps` more host calls were issued after it (a host
        synchronize that waits for it releases it, as delays are released)."""
        if self._capturing(stream) is not None:
            self._held.setdefault(self._capturing(stream), []).append((None, (), name, "launch"))
            return
        if self.policy.name == "sequential":
            steps = 0  # every operation completes when issued (CUDA_LAUNCH_BLOCKING=1): the spin too
        sim, _ = self._enqueue(stream, None, (), name, "sleep")
        sim.queue[-1].release = self.now + 1 + steps
        self._sleeping += 1

    def _capturing(self, stream) -> Optional[int]:
        """The graph `stream` captures into, or None (one attribute test while nothing captures)."""
        return self._tracker.capturing(stream.id) if self._tracker.active else None

    def _issue_work(self, stream, run, args: tuple, name: str, kind: str) -> None:
        """Enqueue a kernel or copy; on a capturing stream, hold it as a graph node instead."""
        graph = self._tracker.capturing(stream.id) if self._tracker.active else None
        if graph is None:
            self._enqueue(stream, run, args, name, kind)
        else:
            self._held.setdefault(graph, []).append((run, args, name, kind))

    def _run_kernel(self, kernel, args, read_only, name, site, stream) -> None:
        # Buffers/Regions become arrays when the kernel runs, not when it is issued.

        values = [a.array() if type(a) is Region else a.region().array() if type(a) is Buffer else a for a in args]
        for i in read_only:
            view = values[i] = values[i].view()  # a view: the buffer's own array stays writable
            view.flags.writeable = False
        try:
            kernel(*values)
        except Exception as exc:
            host = self._trace.ops[-1]  # the host call during which the scheduler ran it
            during = f"it executed during {type(host).__name__} at {host.site}"
            if read_only and isinstance(exc, ValueError) and "read-only" in str(exc):
                err = self._undeclared_write(kernel, args, read_only, name, site, stream, exc, during)
            else:
                err = KernelError(f"kernel `{name}` launched at {site} on {stream.name} raised "
                                  f"{type(exc).__name__}: {exc} ({during}; fix the kernel or its "
                                  "arguments at the launch site)")
            err.kernel, err.launch_site, err.stream = name, site, stream.name
            raise err from exc

    def _undeclared_write(self, kernel, args, read_only, name, site, stream, exc, during):
        """The error for a kernel that wrote a read-only argument: numpy does not say which array
        it was, so it names every read-only one (by the kernel's parameter names where it has them)
        and the kernel's line that wrote."""
        try:
            params = [p.name for p in inspect.signature(kernel).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):  # a builtin or a callable without a signature
            params = []
        named = [params[i] if i < len(params) else f"argument {i}" for i in read_only]
        shown = ", ".join(f"`{param}` ({(args[i].region() if type(args[i]) is Buffer else args[i])!r})"
                          for param, i in zip(named, read_only))
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
        which = f"its argument {shown}" if len(read_only) == 1 else f"one of its arguments {shown}"
        err = UndeclaredWriteError(
            f"kernel `{name}` launched at {site} on {stream.name} wrote {which}, which the launch declares only in "
            f"reads= (numpy: {exc}, at {where}); add what it writes to writes= at the launch site, or stop writing "
            f"it ({during})")
        err.arguments = tuple(named)
        return err

    def copy(self, stream, dst, src, site) -> None:
        # "copy D2D", or "copy P2P" between two devices: the Copy the device recorded just before.
        self._issue_work(stream, _copy_bytes, (dst, src), self._trace.ops[-1].name, "copy")

    def upload(self, stream, dst, host_array, site) -> None:
        # The host memory is read when the copy executes (it must stay unchanged until then);
        # captured, at every launch of the graph.
        self._issue_work(stream, _copy_from_host, (dst, host_array), "copy H2D", "copy")

    def download(self, stream, src, site) -> np.ndarray:
        # Never on a capturing stream: the device API refuses that before it gets here.
        out = np.full(src.array().shape, np.nan if src.buffer.dtype.kind == "f" else 0, dtype=src.buffer.dtype)
        self._enqueue(stream, _copy_to_host, (out, src), "copy D2H", "copy")
        return out

    def record(self, event, stream) -> None:
        if self._capturing(stream) is not None:
            # A point in a graph (the tracker keeps it); on the device it records nothing,
            # so an ordinary wait on it later waits for nothing.
            self._events[event.id] = None
            return
        # Captures the work issued to `stream` so far; replaces any earlier record.
        self._events[event.id] = self._enqueue(stream, None, (), f"record {event.name}", "record")

    def wait(self, stream, event) -> None:
        if self._capturing(stream) is not None:
            return  # a fork into or a join within the graph: an edge the tracker's clocks hold
        captured = self._events[event.id]  # the state *now*; later records do not matter
        deps = (captured,) if captured is not None else ()  # never recorded: a no-op
        self._enqueue(stream, None, (), f"wait {event.name}", "wait", deps)

    # --- stream capture -----------------------------------------------------------------
    def begin_capture(self, stream, graph_id: int, mode) -> None:
        self._held[graph_id] = []

    def abort_capture(self, stream) -> None:
        """The device refused an end_capture that ended the capture anyway (unjoined fork,
        invalidated capture): forget what it held, which no graph will ever run."""
        self._held = {g: nodes for g, nodes in self._held.items() if self._tracker.is_active(g)}

    def end_capture(self, stream, graph: CapturedGraph) -> SimGraph:
        held = self._held.pop(graph.id, [])
        if len(held) != len(graph.nodes):
            raise DeviceError(f"end_capture of graph {graph.id} at {graph.end_site}: the sim held "
                              f"{len(held)} operations for {len(graph.nodes)} captured nodes "
                              "(simulator invariant broken; please report)")
        names = {sid: sim.name for sid, sim in self._streams.items()}
        return SimGraph(graph, tuple((node,) + entry for node, entry in zip(graph.nodes, held)), names)

    def _new_lane(self, name: str) -> _SimStream:
        id = _LANE_BASE
        while id in self._streams:
            id += 1
        lane = _SimStream(_Lane(id, name))
        self._streams[id] = lane
        return lane

    def launch_graph(self, handle: SimGraph, stream, site) -> None:
        index = len(self._trace.ops) - 1  # the GraphLaunch the device recorded just before
        gid = handle.id
        lanes = {sid: self._new_lane(name) for sid, name in handle.members}
        start = self._enqueue(stream, self._graph_start, (tuple(lanes.values()),), f"graph {gid} start", "graph")
        issued_at = self.now + 1
        for (node, run, args, name, kind), deps in zip(handle.nodes, handle.deps):
            lane = lanes[node.stream]
            seq = lane.issued = lane.issued + 1
            deps = tuple([(lanes[s], n) for s, n in deps])
            if seq == 1:
                deps += (start,)  # after everything issued to the launch stream before the launch
            op = _Pending(lane, seq, deps, run, args, name, kind, issued_at, (index, node.index), node.op.site)
            lane.queue.append(op)
            if deps:
                lane.with_deps.append(op)
            self._pending += 1
        # Later work on the launch stream follows the end marker, which waits for every node.
        done = tuple([(lane, lane.issued) for lane in lanes.values()])
        sim, _ = self._enqueue(stream, self._graph_done, (index, tuple(lanes.values())), f"graph {gid} end",
                               "graph", done)
        end = sim.queue[-1]
        end.trace_index = None
        end.site = None
        end.issued_at = _BOOKKEEPING

    def _graph_start(self, lanes: tuple) -> None:
        # Only now may its nodes be ready: the scheduler looks at the lanes of started launches
        # only, so launches queued behind each other cost nothing per decision.
        self._lanes.extend(lanes)

    def _graph_done(self, index: int, lanes: tuple) -> None:
        """The end marker executes: the launch spans from its start marker to now; lanes retire."""
        started = self.op_times.get(index, (self._step, 0))[0]
        self.op_times[index] = (started, self._step + 1)
        for lane in lanes:
            del self._streams[lane.id]
            self._lanes.remove(lane)

    def _streams_and_lanes(self) -> list:
        # Lanes after the streams, by the capture order of their next node (then the older
        # launch first): an eager choice then runs a graph in capture order.
        lanes = sorted([lane for lane in self._lanes if lane.queue], key=lambda lane: lane.queue[0].trace_index)
        return self._order + lanes

    def host_read(self, region) -> np.ndarray:
        self._host_starting("host read")
        return np.array(region.array(), copy=True)

    def host_write(self, region, value) -> None:
        self._host_starting("host write")
        region.array()[...] = value

    def host_access(self, name: str) -> None:
        self._host_starting(name)

    # --- the scheduler ------------------------------------------------------------------
    def _ready(self, need: Optional[dict] = None) -> list:
        """Ids of streams whose next operation may execute now. During a host
        synchronize `need` maps each stream to the last seq the host waits for
        (directly or through dependencies); delays do not hold those."""
        ready = []
        if not self._pending:
            return ready
        hold, release_at = self._hold, self._release_at
        now = self.now
        for sim in self._order if not self._lanes else self._streams_and_lanes():
            queue = sim.queue
            if not queue:
                continue
            op = queue[0]
            blocked = False
            for dep, seq in op.deps:
                if dep.executed < seq:
                    blocked = True
                    break
            if blocked:
                continue
            if self._sleeping and op.kind == "sleep" and now < op.release and (need is None or
                                                                            op.seq > need.get(sim, 0)):
                continue
            if hold is not None:
                if release_at is not None:
                    release = op.release
                    if release is _UNKNOWN:
                        release = op.release = release_at(op, now)
                    held = release is not None and now < release
                else:
                    held = hold(op, now)
                if held and (need is None or op.seq > need.get(sim, 0)):
                    continue
            ready.append(sim.id)
        return ready

    def _execute(self, stream_id: int) -> None:
        sim = self._streams[stream_id]
        op = sim.queue.popleft()
        self._pending -= 1
        run = op.run
        if op.kind == "sleep":
            self._sleeping -= 1
        if self._starting is not None:
            self._starting(op)
        try:
            if run is not None:
                run(*op.args)
        finally:
            # Even a kernel that raised has finished: later work must not wait on it forever.
            sim.executed += 1
            step = self._step
            index = op.trace_index
            if type(index) is int:
                self.op_times[index] = (step, step + 1)
            elif index is not None:
                self.node_times[index] = (step, step + 1)
            self._step = step + 1

    def _choose(self, ready: list, host_may_continue: bool) -> int:
        choice = self.policy.choose(ready, host_may_continue)
        if choice == HOST:
            if not host_may_continue:
                raise ScheduleError(f"policy {self.policy.describe()} let the host go on while it is blocked "
                                    "in a synchronize; a policy must pick one of the ready streams there")
        elif choice not in ready:
            raise ScheduleError(f"policy {self.policy.describe()} chose stream {choice!r}, which has no ready "
                                f"operation (ready: {ready}); a policy must pick a ready stream or HOST")
        self.schedule.decisions.append(choice)
        return choice

    def tick(self) -> None:
        """The host made a call: let the policy run device work until it picks the host."""
        self.now += 1
        decisions = self.schedule.decisions
        ask_when_idle = self._ask_when_idle
        while True:
            ready = self._ready() if self._pending else []
            if not ready and not ask_when_idle:
                decisions.append(HOST)  # forced: recorded all the same, so a replay stays aligned
                return
            choice = self._choose(ready, True)
            if choice == HOST:
                return
            self._execute(choice)

    def _needed(self, targets) -> dict:
        """Close `targets` ((_SimStream, seq) pairs) under stream order and dependencies:
        stream -> the last seq that must execute before the host may return from a synchronize."""
        need: dict = {}
        work = []
        for sim, seq in targets:
            if sim.executed < seq and need.get(sim, 0) < seq:
                need[sim] = seq
                work.append(sim)
        scanned: dict = {}  # stream -> seq up to which its dependencies were followed
        while work:
            sim = work.pop()
            upto = need[sim]
            start = scanned.get(sim, 0)
            if upto <= start:
                continue
            with_deps = sim.with_deps
            while with_deps and with_deps[0].seq <= sim.executed:
                with_deps.popleft()  # executed: nothing left to follow
            for op in with_deps:
                if op.seq <= start:
                    continue
                if op.seq > upto:
                    break
                for dep, seq in op.deps:
                    if dep.executed < seq and need.get(dep, 0) < seq:
                        need[dep] = seq
                        work.append(dep)
            scanned[sim] = upto
        return need

    def _drain(self, targets, what: str, site: CallSite) -> None:
        """Block the host until every (stream, seq) in `targets` executed. Always
        terminates: dependencies point at earlier-issued work, so the earliest pending
        needed operation is ready and not held, and nothing new is issued meanwhile."""
        need = self._needed(targets)
        while any(sim.executed < seq for sim, seq in targets):
            ready = self._ready(need)
            if not ready:
                raise DeviceError(f"{what} at {site}: no pending work can make progress "
                                  "(simulator invariant broken; please report with the schedule string)")
            self._execute(self._choose(ready, False))

    def sync_stream(self, stream, site) -> None:
        sim = self._streams[stream.id]
        targets = [(sim, sim.issued)]
        if sim.is_legacy:  # waits for its device's blocking streams too (measured: docs/cuda-rules.md)
            targets += [(other, other.issued) for other in sim.dev.joiners]
        self._drain(targets, f"{stream.name}.synchronize()", site)

    def sync_event(self, event, site) -> None:
        captured = self._events[event.id]
        if captured is None:
            return  # never recorded: returns at once, as in CUDA
        self._drain([captured], f"{event.name}.synchronize()", site)

    def query_stream(self, stream) -> bool:
        sim = self._streams[stream.id]
        return self._poll(lambda: sim.executed >= sim.issued)

    def query_event(self, event) -> bool:
        captured = self._events[event.id]
        return self._poll(lambda: captured is None or captured[0].executed >= captured[1])

    def _poll(self, done) -> bool:
        """A query: True if done. A host that polls is waiting for the device, so a not-done
        answer lets the device take one step first (the policy picks which ready stream; delays
        still count host calls): a busy loop on query() always ends, as on a GPU."""
        if done():
            return True
        ready = self._ready() if self._pending else []
        if ready:
            self._execute(self._choose(ready, False))
        return False

    def sync_device(self, site, device: Optional[int] = None) -> None:
        """cudaDeviceSynchronize: drain `device`'s streams (every stream when None)."""
        what = "device synchronize" if device is None else f"device synchronize of cuda:{device}"
        self._drain([(sim, sim.issued) for sim in self._order if device is None or sim.device_index == device],
                    what, site)

    # --- collectives --------------------------------------------------------------------
    def collective(self, name: str, streams, outputs, inputs) -> None:
        # NCCL's kernels of one collective wait for each other: a rank's part is ready only when
        # every other rank's comm stream has executed what was issued to it before the collective.
        reached = [(self._streams[s.id], self._streams[s.id].issued) for s in streams]
        state = {}  # the result of every rank, computed by whichever part runs first
        ranks = len(streams)
        for k, stream in enumerate(streams):
            deps = tuple([pair for j, pair in enumerate(reached) if j != k and pair[1] > 0])
            self._enqueue(stream, _run_collective, (name, state, k, outputs, inputs), name, "launch", deps,
                          back=ranks - k)

    def pending(self) -> int:
        """Operations issued but not executed yet."""
        return self._pending
