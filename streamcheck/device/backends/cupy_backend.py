"""The `cupy` backend: the device API on a real GPU through CuPy.

Streams, events and kernels are CUDA's own; nothing is simulated. What the
backend adds is *pressure*: a bounded spin kernel (cuda/spin_delay.cu) enqueued
on chosen streams before chosen launches, so that a missing edge strikes and a
consumer really reads a stale value, plus randomized stream priorities and
launch-order jitter.

Launch contract (the FlashNorm pipeline relies on it): `launch` calls
`kernel(*arrays)` on the host immediately, with Buffer/Region arguments turned
into CuPy array views, while the launch's stream is CuPy's current stream
(`with stream.handle:`). CuPy operations and RawKernel launches inside the
callable therefore go to that stream.

Policies
- sequential: synchronize the device after every operation (like
  CUDA_LAUNCH_BLOCKING=1): the reference run.
- eager: no injected delay.
- delay: spin `delay_us` on the chosen streams (`streams=` by name; seed-chosen
  if none are named) before every launch/copy, or only before the kernels named
  in `kernels=`.
- random / pct: randomized stream priorities, and seeded random spins before
  launches (every launch may get one under random; only at `depth - 1` seeded
  change points under pct).

Stream capture (CUDA graphs): begin_capture / end_capture / launch_graph map to
CuPy's Stream.begin_capture(mode) / end_capture() and Graph.launch(stream); CUDA
captures the launches, copies, records and waits on capturing streams itself. No
delay is injected while a stream captures: a spin issued then would not delay
anything now (captured work does not run) but would be baked into the graph and
replayed at every launch, long after this policy decided on it. The delay policy
is consulted at launch_graph instead, and spins on the launch stream before the
graph, which makes races between the graph and work outside it strike. A race
*inside* a graph can only strike if the program captures its own delay.

Implicit synchronization (first cuBLAS call, lazy module loading, memory-pool
growth) often makes a race *not* strike in a single-shot program. `warm_up()`
gets these out of the way and records each as `device.note_implicit_sync(...)`,
which the checker deliberately does not treat as an edge.
"""
from __future__ import annotations

import random
from typing import Optional

import numpy as np

from ...record.gpu import (  # noqa: F401 (capture_mode_value: re-exported, its home is gpu.py)
    MAX_DELAY_US,
    SpinDelay,
    capture_mode_of,
    capture_mode_value,
    external_stream,
    suppressed as _suppressed,
    warm_up as _warm_up,
)
from ...core.schedule import (  # noqa: F401 (GRAPH_LAUNCH_NAME: re-exported, its home is schedule.py)
    GRAPH_LAUNCH_NAME,
    Schedule,
    ScheduleError,
    check_strike_pattern,
    describe_delay,
    graph_delay_name,
    seed_delays,
    strikes,
)
from ...core.trace import StreamKind
from ..objects import Buffer, DeviceError, KernelError, Region
from .protocol import Backend

POLICIES = ("sequential", "eager", "delay", "random", "pct")
_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
           "uint64", "bool"}
_CONTEXT_PARAMS = ("steps", "horizon")  # the sim's units; accepted so one test runs on both backends


class _Policy:
    """What the backend does around each launch. Built from the policy name and params."""

    def __init__(self, name: str, seed: int, params: dict):
        self.name = name
        self.seed = seed
        self.rng = random.Random(seed)
        params = dict(params)
        for key in _CONTEXT_PARAMS:
            params.pop(key, None)
        self.delay_us = params.pop("delay_us", 200.0 if name in ("delay", "pct") else 50.0)
        self.streams = frozenset(params.pop("streams", ()) or ())
        self.kernels = frozenset(params.pop("kernels", ()) or ())
        self.depth = params.pop("depth", 2)
        # Which targeted launches strike, as the sim's delay policy: the after-th and every every-th after.
        self.after, self.every = check_strike_pattern(params.pop("after", 0), params.pop("every", 1))
        self.targeted = 0
        self.launches = 0
        self.change_points: frozenset = frozenset()
        if params:
            raise ScheduleError(f"cupy backend, policy {name!r}: unknown parameters {sorted(params)}; "
                                "accepted: delay_us, streams, kernels, after, every (delay), depth (pct), timing, caller")
        if not isinstance(self.delay_us, (int, float)) or not 0 <= self.delay_us <= MAX_DELAY_US:
            raise ScheduleError(f"cupy backend: delay_us must be a number in [0, {MAX_DELAY_US}] µs "
                                f"(the spin kernel's cap), got {self.delay_us!r}")
        if name == "pct":
            if not isinstance(self.depth, int) or self.depth < 1:
                raise ScheduleError(f"pct: depth must be an integer >= 1, got {self.depth!r}")
            horizon = 200
            self.change_points = frozenset(self.rng.sample(range(1, horizon + 1), min(self.depth - 1, horizon)))

    def describe(self) -> str:
        if self.name == "delay":
            return describe_delay(f"delay_us={self.delay_us:g}", self.streams, self.kernels, self.after, self.every)
        if self.name == "random":
            return f"random(seed={self.seed}, jitter_us={self.delay_us:g})"
        if self.name == "pct":
            return f"pct(seed={self.seed}, depth={self.depth}, delay_us={self.delay_us:g})"
        return self.name

    def targets(self, stream_name: str) -> bool:
        if self.streams:
            return stream_name in self.streams
        return seed_delays(self.seed, stream_name)  # no stream named: the sim's rule

    def spin_before(self, stream_name: str, op_name: str) -> float:
        """Microseconds to spin on the stream before this launch/copy (0: none)."""
        self.launches += 1
        if self.name == "delay":
            if self.kernels and op_name not in self.kernels:
                return 0.0
            # kernels named, no streams: delay those kernels wherever
            if not (self.kernels and not self.streams) and not self.targets(stream_name):
                return 0.0
            k, self.targeted = self.targeted, self.targeted + 1
            return float(self.delay_us) if strikes(k, self.after, self.every) else 0.0
        if self.name == "random":
            return self.rng.uniform(0.0, float(self.delay_us)) if self.rng.random() < 0.5 else 0.0
        if self.name == "pct":
            return float(self.delay_us) if self.launches in self.change_points else 0.0
        return 0.0

    def priority(self, requested: int, least: int, greatest: int) -> int:
        """CUDA priorities: lower numbers run first; the range is [greatest, least]."""
        if self.name in ("random", "pct"):
            return self.rng.randint(greatest, least)
        return max(greatest, min(least, requested))


class CupyBackend(Backend):
    """Device-API backend on a CUDA GPU through CuPy. See the module docstring."""

    name = "cupy"
    supports_capture = True

    @classmethod
    def unavailable(cls):
        from . import gpu_available  # read where tests and users may replace it

        if not gpu_available():
            return ("backend 'cupy' needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]'); none found here. "
                    "Use backend='sim' to run on the CPU.")
        return None

    def __init__(self, device, policy="eager", seed: int = 0, *, timing: bool = False, caller: str = "cupy",
                 confirm_probe=None, **params):
        import cupy

        if not isinstance(policy, str):
            raise ScheduleError(f"cupy backend: policy must be a name ({', '.join(POLICIES)}), got {policy!r}")
        if policy.startswith("replay:"):
            raise ScheduleError("cupy backend: replay strings replay the sim's decisions and cannot drive a GPU; "
                                "rerun with the same policy and seed instead")
        if policy not in POLICIES:
            raise ScheduleError(f"cupy backend: unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
        if caller not in ("cupy", "torch"):
            raise ScheduleError(f"cupy backend: caller must be 'cupy' or 'torch', got {caller!r}")
        self._cupy = cupy
        self._device = device
        self.policy = _Policy(policy, seed, params)
        self.schedule = Schedule(self.policy.describe(), seed)
        self.delays: list = []  # (trace index, stream name, µs) of every injected spin
        self.timing = bool(timing)
        self.caller = caller
        self._pending_times: dict = {}  # trace index -> (start event, end event)
        self._op_times: dict = {}
        self._spin: Optional[SpinDelay] = None
        self._host_stream = None  # private stream for host_read/host_write (see there)
        self._captures = 0  # captures begun here and not yet ended
        self._graph_names: dict = {}  # graph id -> names of its captured kernels (delay targeting)
        self.probe = None  # confirm_gpu.DeviceProbe: this run confirms one race (confirm_device_races)
        if confirm_probe is not None:
            from ...proofs.confirm_gpu import DeviceProbe, ProbeSpec

            try:
                spec = confirm_probe if isinstance(confirm_probe, ProbeSpec) else ProbeSpec.from_json(confirm_probe)
            except ValueError as exc:
                raise ScheduleError(f"cupy backend: confirm_probe: {exc}") from None
            self.probe = DeviceProbe(spec)
        try:
            self._least, self._greatest = cupy.cuda.runtime.deviceGetStreamPriorityRange()
        except Exception:  # not exposed by this CuPy build; CUDA clamps out-of-range values anyway
            self._least, self._greatest = 0, -5
        self._t0 = None
        if self.timing:
            with _suppressed():
                self._t0 = cupy.cuda.Event()
                self._t0.record(cupy.cuda.Stream.null)

    # --- objects ------------------------------------------------------------------------
    def dtype(self, dtype) -> np.dtype:
        if str(dtype) == "bfloat16":
            try:
                import ml_dtypes  # CuPy 14 holds bfloat16 through ml_dtypes

                dt = np.dtype(ml_dtypes.bfloat16)
                self._cupy.empty(0, dtype=dt)
                return dt
            except Exception as exc:
                raise TypeError(f"bfloat16 needs ml_dtypes and CuPy >= 14 ({exc}); store the bits in uint16") from None
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is None or dt.name not in _DTYPES:
            raise TypeError(f"dtype {dtype!r}: the cupy backend supports {', '.join(sorted(_DTYPES))} "
                            "(and bfloat16 with ml_dtypes)")
        return dt

    def new_stream(self, stream) -> None:
        cupy = self._cupy
        with _suppressed():
            if stream.kind is StreamKind.LEGACY:
                stream.handle = cupy.cuda.Stream.null
            elif stream.kind is StreamKind.PER_THREAD:
                stream.handle = cupy.cuda.Stream.ptds
            else:
                prio = self.policy.priority(stream.priority, self._least, self._greatest)
                stream.priority = prio
                stream.handle = cupy.cuda.Stream(non_blocking=stream.kind is StreamKind.NON_BLOCKING, priority=prio)

    def new_event(self, event) -> None:
        with _suppressed():
            event.handle = self._cupy.cuda.Event(disable_timing=True)

    def alloc(self, buf, fill) -> None:
        if self._captures:
            # The fill runs on the legacy stream and the host waits for it, and pool growth is a
            # cudaMalloc: both are illegal or unsafe while a capture is open.
            raise DeviceError(f"alloc `{buf.name}` at {buf.site} while a graph is being captured: the cupy backend "
                              "allocates (and fills on the legacy stream) synchronously. Allocate every buffer "
                              "the graph uses before begin_capture; a graph replays fixed addresses anyway")
        cupy = self._cupy
        pool = cupy.get_default_memory_pool()
        before = pool.total_bytes()
        with _suppressed():
            storage = cupy.empty(buf.shape, dtype=buf.dtype)
            # Like the sim: floats start as NaN (garbage made visible), others as 0. The fill runs on
            # the legacy stream and the host waits for it, so it can race with nothing.
            with cupy.cuda.Stream.null:
                if fill is not None:
                    storage.fill(fill)
                elif buf.dtype.kind == "f" and buf.dtype.name in ("float16", "float32", "float64"):
                    storage.fill(np.nan)
                elif storage.nbytes:
                    storage.data.memset_async(0, storage.nbytes)
            cupy.cuda.Stream.null.synchronize()
        buf.storage = storage
        grown = pool.total_bytes() - before
        if grown > 0:
            self._device.note_implicit_sync(f"memory pool growth by {grown} bytes (cudaMalloc) for `{buf.name}`")

    def free(self, buf, stream) -> None:
        # CuPy's pool hands the bytes to later allocations on the stream that allocated them;
        # the checker reports work still pending elsewhere as a FREE race.
        buf.storage = None
        self._host_side_done()

    # --- issuing ------------------------------------------------------------------------
    def _handle(self, stream):
        if stream.kind is StreamKind.LEGACY and self.caller == "torch":
            return self._torch_stream()
        return stream.handle

    def _torch_stream(self):
        """torch's current stream as a CuPy stream: the caller's stream of a module inside a torch model."""
        import torch

        return external_stream(self._cupy, torch.cuda.current_stream().cuda_stream)

    def _trace_index(self) -> int:
        return len(self._device.trace) - 1  # the device recorded this operation just before calling us

    def _capturing(self, handle) -> bool:
        """Whether CUDA captures work issued to `handle` now (the origin of a capture, or a
        stream forked into one). Asked only while a capture begun here is open, so the
        ordinary path costs one integer test."""
        if not self._captures:
            return False
        try:
            return bool(handle.is_capturing())
        except Exception:  # an invalidated capture, or the legacy stream next to a blocking capture
            return True

    def _before(self, stream, name: str):
        """Spin (per the policy) and open a timing window; return what _after needs.
        Nothing for work that is being captured (see the module docstring)."""
        index = self._trace_index()
        handle = self._handle(stream)
        if self._captures and self._capturing(handle):
            return index, handle, None
        us = self.policy.spin_before(stream.name, name)
        if us > 0:
            self._spin_on(handle, us)
            self.delays.append((index, stream.name, us))
            self.schedule.decisions.append(stream.id)
        if self.probe is not None:
            self.probe.before_op(self._device.trace.ops[index], handle.ptr, lambda us: self._spin_on(handle, us))
        start = None
        if self.timing:
            with _suppressed():
                start = self._cupy.cuda.Event()
                start.record(handle)
        return index, handle, start

    def _host_side_done(self) -> None:
        """A host-side operation (the device recorded it just before calling us) is done: a
        confirmation probe times it as the host's own."""
        if self.probe is not None:
            self.probe.after_op(self._device.trace.ops[-1])

    def _spin_on(self, handle, us: float) -> None:
        if self._spin is None:
            self._spin = SpinDelay.get()
        self._spin.enqueue(handle, us)

    def _after(self, token) -> None:
        index, handle, start = token
        if self.probe is not None:
            self.probe.after_op(self._device.trace.ops[index])
        if start is not None:
            with _suppressed():
                end = self._cupy.cuda.Event()
                end.record(handle)
            self._pending_times[index] = (start, end)

    def _arrays(self, args):
        return [a.array() if isinstance(a, Region) else a.region().array() if isinstance(a, Buffer) else a
                for a in args]

    def launch(self, stream, kernel, args, name, site) -> None:
        arrays = self._arrays(args)
        token = self._before(stream, name)
        try:
            # The Device checks its own work; keep it out of an instrument() session.
            with _suppressed(), token[1]:
                kernel(*arrays)
        except Exception as exc:
            raise KernelError(f"kernel `{name}` launched at {site} on {stream.name} raised "
                              f"{type(exc).__name__}: {exc}") from exc
        self._after(token)

    def copy(self, stream, dst, src, site) -> None:
        token = self._before(stream, "copy D2D")
        with _suppressed(), token[1]:
            out = dst.array()
            out[...] = src.array().reshape(out.shape)
        self._after(token)

    def upload(self, stream, dst, host_array, site) -> None:
        if self._captures and self._capturing(self._handle(stream)):
            # A captured H2D copy reads the host array again at every replay, and CuPy copies
            # from pageable memory, which CUDA cannot capture.
            raise DeviceError(f"upload to {dst} at {site} on {stream.name}, which is capturing a graph: the cupy "
                              "backend cannot capture a host-to-device copy. Upload into a device buffer before "
                              "begin_capture and copy from it inside the capture")
        token = self._before(stream, "copy H2D")
        out = dst.array()
        with _suppressed():
            out.set(np.ascontiguousarray(host_array.reshape(out.shape), dtype=out.dtype), stream=token[1])
        self._after(token)

    def download(self, stream, src, site) -> np.ndarray:
        import cupyx

        token = self._before(stream, "copy D2H")
        array = src.array()
        # Pinned memory: a D2H copy into pageable memory would block the host until the
        # stream reaches it, an implicit sync that hides exactly the races we look for.
        out = cupyx.empty_pinned(array.shape, dtype=array.dtype)
        out[...] = np.nan if array.dtype.kind == "f" else 0
        with _suppressed():
            array.get(stream=token[1], out=out, blocking=False)
        self._after(token)
        return out

    def record(self, event, stream) -> None:
        with _suppressed():
            event.handle.record(self._handle(stream))

    def wait(self, stream, event) -> None:
        with _suppressed():
            self._handle(stream).wait_event(event.handle)

    def _private_stream(self):
        # A non-blocking stream of our own: its copy runs *now*, synchronizing with none of the
        # program's streams, which is what a host access without synchronization means.
        if self._host_stream is None:
            self._host_stream = self._cupy.cuda.Stream(non_blocking=True)
        return self._host_stream

    def host_read(self, region) -> np.ndarray:
        with _suppressed():
            stream = self._private_stream()
            value = region.array().get(stream=stream, blocking=True)
        self._host_side_done()
        return value

    def host_write(self, region, value) -> None:
        with _suppressed():
            stream = self._private_stream()
            target = region.array()
            host = np.ascontiguousarray(np.broadcast_to(np.asarray(value, dtype=target.dtype), target.shape))
            target.set(host, stream=stream)
            stream.synchronize()
        self._host_side_done()

    def sync_stream(self, stream, site) -> None:
        with _suppressed():
            self._handle(stream).synchronize()

    def sync_event(self, event, site) -> None:
        with _suppressed():
            event.handle.synchronize()

    def query_stream(self, stream) -> bool:
        with _suppressed():
            return bool(self._handle(stream).done)

    def query_event(self, event) -> bool:
        with _suppressed():
            return bool(event.handle.done)

    def sync_device(self, site) -> None:
        with _suppressed():
            self._cupy.cuda.runtime.deviceSynchronize()

    # --- stream capture ---------------------------------------------------------------
    def begin_capture(self, stream, graph_id: int, mode) -> None:
        """cudaStreamBeginCapture through CuPy, with CaptureMode mapped to CuPy's
        runtime.streamCaptureMode* value (CuPy's own default would be relaxed)."""
        handle = self._handle(stream)
        with _suppressed():
            handle.begin_capture(mode=capture_mode_value(mode, self._cupy.cuda.runtime))
        self._captures += 1

    def end_capture(self, stream, graph):
        """cudaStreamEndCapture + instantiate: returns CuPy's Graph (the handle launch_graph takes)."""
        handle = self._handle(stream)
        try:
            with _suppressed():
                cupy_graph = handle.end_capture()
        except Exception as exc:
            raise DeviceError(
                f"end_capture on {stream.name} at {graph.end_site}: CUDA refused graph {graph.id} ({exc}) although "
                "streamcheck's capture model accepted it. Most often an unsafe call during a global or "
                "thread-local capture invalidated it, such as cudaMalloc when CuPy's pool grows for a temporary "
                "array inside a captured kernel: allocate before begin_capture, write through out= arguments, "
                "or begin with mode='relaxed'") from exc
        finally:
            self._captures -= 1  # CUDA ends the capture whether or not it produced a graph
        self._graph_names[graph.id] = tuple(dict.fromkeys(getattr(n.op, "name", "") for n in graph.nodes))
        return cupy_graph

    def abort_capture(self, stream) -> None:
        """End a capture that CUDA still holds open after streamcheck refused its end_capture
        (an unjoined fork, a capture invalidated by an op the device refused and never issued):
        without this the stream would go on capturing everything issued to it. Whatever CUDA
        says about that capture is discarded; streamcheck has already raised its own error."""
        if not self._captures:
            return
        handle = self._handle(stream)
        try:
            capturing = bool(handle.is_capturing())
        except Exception:  # invalidated: still to be ended
            capturing = True
        if not capturing:
            return
        try:
            with _suppressed():
                handle.end_capture()
        except Exception:  # CUDA's own refusal of the same capture (e.g. cudaErrorStreamCaptureUnjoined)
            pass
        finally:
            self._captures -= 1

    def launch_graph(self, handle, stream, site) -> None:
        """cudaGraphLaunch on `stream`; the policy may spin on that stream first."""
        op = self._device.trace.ops[-1]  # the GraphLaunch the device recorded just before calling us
        names = self._graph_names.get(getattr(op, "graph", None), ())
        token = self._before(stream, graph_delay_name(names, self.policy.kernels))
        with _suppressed():
            handle.launch(stream=token[1])
        self._after(token)

    def tick(self) -> None:
        # While a capture is open a device synchronize is illegal (and would invalidate it);
        # captured work does not run until the graph is launched anyway.
        if self.policy.name == "sequential" and not self._captures:
            with _suppressed():
                self._cupy.cuda.runtime.deviceSynchronize()

    # --- warm-up and timing -------------------------------------------------------------
    def warm_up(self, pool_bytes: int = 64 << 20) -> list:
        """Get implicit synchronizations out of the way before the program's first racy step
        (gpu.warm_up) and record each as an implicit sync. Returns the reasons recorded."""
        reasons = _warm_up(cupy=self._cupy, spin=True, pool_bytes=pool_bytes)
        self._spin = SpinDelay.get()
        for reason in reasons:
            self._device.note_implicit_sync(reason)
        return reasons

    @property
    def op_times(self) -> dict:
        """trace index -> (start_us, end_us) from CUDA events, relative to the backend's creation.
        Empty unless built with timing=True (two events per operation cost host time).
        Reading it synchronizes the device."""
        if not self._pending_times:
            return dict(self._op_times)
        cupy = self._cupy
        with _suppressed():
            cupy.cuda.runtime.deviceSynchronize()
            for index, (start, end) in self._pending_times.items():
                self._op_times[index] = (cupy.cuda.get_elapsed_time(self._t0, start) * 1000.0,
                                         cupy.cuda.get_elapsed_time(self._t0, end) * 1000.0)
        self._pending_times.clear()
        return dict(self._op_times)
