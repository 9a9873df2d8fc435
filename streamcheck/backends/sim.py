"""The `sim` backend: a virtual CUDA device on the CPU.

Each stream is a queue of pending operations holding real numpy data. Host calls
enqueue; after every host call the policy decides which ready operations execute
before the host goes on. An operation is ready when the one before it on its
stream has executed and its CUDA dependencies have: for a wait, the work captured
by the event *when the wait was issued*; for the legacy default stream, all work
issued earlier on blocking streams (and the reverse). A consumer that nothing
orders after its producer can therefore run first and read stale values, exactly
as on a GPU.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np

from ..schedule import HOST, Policy, Schedule, ScheduleError, make_policy
from ..trace import CallSite, StreamKind

_DTYPES = {"float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"}


class _Pending:
    __slots__ = ("seq", "deps", "run", "name", "site", "issued_at", "stream_name", "stream", "trace_index")

    def __init__(self, stream, seq, deps, run, name, site, issued_at, trace_index):
        self.trace_index = trace_index
        self.stream = stream.id
        self.stream_name = stream.name
        self.seq = seq
        self.deps = deps
        self.run = run
        self.name = name
        self.site = site
        self.issued_at = issued_at


class _SimStream:
    __slots__ = ("id", "name", "kind", "queue", "issued", "executed")

    def __init__(self, stream):
        self.id = stream.id
        self.name = stream.name
        self.kind = stream.kind
        self.queue: deque = deque()
        self.issued = 0
        self.executed = 0


class SimBackend:
    name = "sim"

    def __init__(self, device, policy="eager", seed: int = 0, **params):
        from ..device import DeviceError, KernelError

        self._DeviceError, self._KernelError = DeviceError, KernelError
        self.policy: Policy = policy if isinstance(policy, Policy) else make_policy(policy, seed, **params)
        self.schedule = Schedule(self.policy.describe(), seed)
        self.now = 0  # host calls so far: the unit of injected delay
        self._trace = device.trace
        # trace index -> (start, end) in scheduler steps: the sim's clock for timelines.
        self.op_times: dict[int, tuple] = {}
        self._step = 0
        self._streams: dict[int, _SimStream] = {}
        self._order: list[_SimStream] = []
        self._legacy: Optional[_SimStream] = None
        self._joiners: list[_SimStream] = []
        self._events: dict[int, Optional[tuple]] = {}

    # --- objects ------------------------------------------------------------------------
    def dtype(self, dtype) -> np.dtype:
        dt = np.dtype(dtype)
        if dt.name not in _DTYPES:
            raise TypeError(f"the sim backend holds numpy data and supports {sorted(_DTYPES)}")
        return dt

    def new_stream(self, stream) -> None:
        sim = _SimStream(stream)
        self._streams[stream.id] = sim
        self._order.append(sim)
        if stream.kind is StreamKind.LEGACY:
            self._legacy = sim
        elif stream.kind.joins_legacy:
            self._joiners.append(sim)

    def new_event(self, event) -> None:
        self._events[event.id] = None

    def alloc(self, buf, fill) -> None:
        if fill is not None:
            buf.storage = np.full(buf.shape, fill, dtype=buf.dtype)
        elif buf.dtype.kind == "f":
            buf.storage = np.full(buf.shape, np.nan, dtype=buf.dtype)  # uninitialised memory is garbage
        else:
            buf.storage = np.zeros(buf.shape, dtype=buf.dtype)

    def free(self, buf, stream) -> None:
        # The storage stays: work still pending on other streams may touch it (the checker
        # reports that as a FREE race); a real allocator would hand the bytes to someone else.
        pass

    # --- issuing ------------------------------------------------------------------------
    def _enqueue(self, stream, run, name: str, site: CallSite, deps=()) -> int:
        sim = self._streams[stream.id]
        deps = list(deps)
        if sim.kind is StreamKind.LEGACY:
            # Legacy stream: waits for all work issued so far on blocking streams.
            deps.extend((j.id, j.issued) for j in self._joiners if j.issued > j.executed)
        elif sim.kind.joins_legacy and self._legacy is not None and self._legacy.issued > self._legacy.executed:
            deps.append((self._legacy.id, self._legacy.issued))
        sim.issued += 1
        # The device recorded this operation just before calling us.
        sim.queue.append(_Pending(stream, sim.issued, deps, run, name, site, self.now, len(self._trace) - 1))
        return sim.issued

    def launch(self, stream, kernel, args, name, site) -> None:
        from ..device import Buffer, Region

        KernelError = self._KernelError

        def run():
            arrays = [a.array() if isinstance(a, Region) else a.region().array() if isinstance(a, Buffer) else a
                      for a in args]
            try:
                kernel(*arrays)
            except Exception as exc:
                raise KernelError(f"kernel `{name}` launched at {site} on {stream.name} raised "
                                  f"{type(exc).__name__}: {exc}") from exc

        self._enqueue(stream, run, name, site)

    def copy(self, stream, dst, src, site) -> None:
        def run():
            dst.array()[...] = src.array().reshape(dst.array().shape)

        self._enqueue(stream, run, "copy D2D", site)

    def upload(self, stream, dst, host_array, site) -> None:
        def run():
            dst.array()[...] = host_array.reshape(dst.array().shape)

        self._enqueue(stream, run, "copy H2D", site)

    def download(self, stream, src, site) -> np.ndarray:
        out = np.full(src.array().shape, np.nan if src.buffer.dtype.kind == "f" else 0, dtype=src.buffer.dtype)

        def run():
            out[...] = src.array()

        self._enqueue(stream, run, "copy D2H", site)
        return out

    def record(self, event, stream) -> None:
        seq = self._enqueue(stream, None, f"record {event.name}", None)
        self._events[event.id] = (stream.id, seq)  # replaces any earlier record

    def wait(self, stream, event) -> None:
        captured = self._events[event.id]  # the state *now*; later records do not matter
        self._enqueue(stream, None, f"wait {event.name}", None, deps=[captured] if captured else [])

    def host_read(self, region) -> np.ndarray:
        return np.array(region.array(), copy=True)

    def host_write(self, region, value) -> None:
        region.array()[...] = value

    # --- the scheduler ------------------------------------------------------------------
    def _ready(self, draining: bool) -> list[int]:
        ready = []
        streams = self._streams
        for sim in self._order:
            if not sim.queue:
                continue
            op = sim.queue[0]
            if any(streams[s].executed < seq for s, seq in op.deps):
                continue
            if not draining and self.policy.hold(op, self.now):
                continue
            ready.append(sim.id)
        return ready

    def _execute(self, stream_id: int) -> None:
        sim = self._streams[stream_id]
        op = sim.queue.popleft()
        if op.run is not None:
            op.run()
        sim.executed += 1
        self.op_times[op.trace_index] = (self._step, self._step + 1)
        self._step += 1

    def tick(self) -> None:
        """The host made a call: let the policy run device work until it picks the host."""
        self.now += 1
        decisions = self.schedule.decisions
        while True:
            choice = self.policy.choose(self._ready(False), True)
            decisions.append(choice)
            if choice == HOST:
                return
            self._execute(choice)

    def _drain(self, done, what: str, site: CallSite) -> None:
        """Block the host until `done()`; always terminates: every dependency points at
        earlier-issued work, so something is ready while anything is pending."""
        decisions = self.schedule.decisions
        while not done():
            ready = self._ready(True)
            if not ready:
                raise self._DeviceError(f"{what} at {site}: no pending work can make progress "
                                        "(simulator invariant broken; please report)")
            choice = self.policy.choose(ready, False)
            if choice == HOST:
                raise ScheduleError(f"{what} at {site}: policy let the host go on while it is blocked")
            decisions.append(choice)
            self._execute(choice)

    def sync_stream(self, stream, site) -> None:
        sim = self._streams[stream.id]
        target = sim.issued
        self._drain(lambda: sim.executed >= target, f"{stream.name}.synchronize()", site)

    def sync_event(self, event, site) -> None:
        captured = self._events[event.id]
        if captured is None:
            return  # never recorded: returns at once, as in CUDA
        sim, seq = self._streams[captured[0]], captured[1]
        self._drain(lambda: sim.executed >= seq, f"{event.name}.synchronize()", site)

    def sync_device(self, site) -> None:
        targets = [(sim, sim.issued) for sim in self._order]
        self._drain(lambda: all(s.executed >= t for s, t in targets), "device synchronize", site)

    def pending(self) -> int:
        return sum(len(s.queue) for s in self._order)
