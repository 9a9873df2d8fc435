"""What a backend of the device API provides. The front end (streamcheck/device/api.py) validates
every call, records it into the trace and feeds the checker; only then does it call the
backend, which runs the work (on the CPU, on a GPU, ...). Like trio's `Instrument`, this ABC
serves mostly as documentation: required members are abstract, optional ones have the
default that means "not supported" or "nothing to say".

Objects passed in are the device API's own (device_objects.Buffer / Region, device.Stream /
Event, core.trace.CallSite); a backend keeps its handles on them (`buffer.storage`,
`stream.handle`, ...). A new backend is one new module with a subclass of Backend, listed in
backends/__init__.py's BACKENDS or registered under the `streamcheck.backends` entry-point group.
"""
from __future__ import annotations

import abc
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

import numpy as np


class Backend(abc.ABC):
    name: str = ""  # what Device(backend=...) and --streamcheck-backend call it
    # True when freed bytes reach a new allocation only through Device.alloc(reuse=) (the sim): a
    # free is then a race only once an allocation gets its bytes too early (trace.Free). False:
    # the backend's pool may hand them to any allocation unseen, so every free keeps the strict rule.
    sees_reuse: bool = False

    # --- availability -------------------------------------------------------------------
    @classmethod
    def unavailable(cls) -> Optional[str]:
        """Why the backend cannot run here (no GPU, a missing library), saying what to do;
        None when it can."""
        return None

    # --- objects (required) -------------------------------------------------------------
    @abc.abstractmethod
    def dtype(self, dtype) -> np.dtype:
        """`dtype` as the backend stores it; TypeError listing what is supported otherwise."""

    @abc.abstractmethod
    def new_stream(self, stream) -> None:
        """A stream of `stream.kind` (legacy, per-thread, blocking, non-blocking) exists."""

    @abc.abstractmethod
    def new_event(self, event) -> None: ...

    @abc.abstractmethod
    def alloc(self, buf, fill) -> None:
        """Storage for `buf` (its shape and dtype), filled with `fill` (exactly converted) or zeros."""

    @abc.abstractmethod
    def free(self, buf, stream) -> None:
        """`buf` given back, ordered on `stream` (where the pool reuses the bytes)."""

    # --- work (required): issued in host order, run when the backend's streams get to it --
    @abc.abstractmethod
    def launch(self, stream, kernel, args, name, site) -> None:
        """Run `kernel(*arrays)` on `stream`; args are Buffers / Regions (as arrays) and scalars."""

    @abc.abstractmethod
    def copy(self, stream, dst, src, site) -> None: ...

    @abc.abstractmethod
    def upload(self, stream, dst, host_array, site) -> None:
        """Host to device, asynchronously on `stream` (host_array has dst's dtype and shape)."""

    @abc.abstractmethod
    def download(self, stream, src, site) -> np.ndarray:
        """Device to host on `stream`, then a host wait for that stream: the values."""

    @abc.abstractmethod
    def host_read(self, region) -> np.ndarray:
        """The values of `region` now, without any synchronization (the host may see stale data)."""

    @abc.abstractmethod
    def host_write(self, region, value) -> None: ...

    def host_access(self, name: str) -> None:
        """The host reads or writes buffers' storage itself, now (Device.host_access): optional,
        for a backend whose policies want to know when the host touches memory."""

    @abc.abstractmethod
    def record(self, event, stream) -> None: ...

    @abc.abstractmethod
    def wait(self, stream, event) -> None: ...

    @abc.abstractmethod
    def sync_stream(self, stream, site) -> None: ...

    @abc.abstractmethod
    def sync_event(self, event, site) -> None: ...

    @abc.abstractmethod
    def sync_device(self, site) -> None: ...

    @abc.abstractmethod
    def tick(self) -> None:
        """One host call was issued: a scheduler may run work now (the sim), or not (a GPU)."""

    # --- polling (optional) ---------------------------------------------------------------
    def query_stream(self, stream) -> bool:
        """cudaStreamQuery: has everything issued to `stream` so far executed? Never blocks."""
        raise NotImplementedError(f"the {self.name} backend does not support stream queries")

    def query_event(self, event) -> bool:
        """cudaEventQuery: has the work `event` captured executed (True if never recorded)?"""
        raise NotImplementedError(f"the {self.name} backend does not support event queries")

    # --- stream capture (optional) ------------------------------------------------------
    supports_capture: bool = False  # True: begin_capture, end_capture and launch_graph below work

    def begin_capture(self, stream, graph_id: int, mode) -> None:
        raise NotImplementedError(f"the {self.name} backend does not support stream capture")

    def end_capture(self, stream, graph):
        """The capture's graph handle, from the front end's CapturedGraph (what the capture holds)."""
        raise NotImplementedError(f"the {self.name} backend does not support stream capture")

    def abort_capture(self, stream) -> None:
        """A capture the front end refused is over: drop whatever the backend still holds open."""

    def launch_graph(self, handle, stream, site) -> None:
        raise NotImplementedError(f"the {self.name} backend does not support stream capture")

    # --- several devices (optional) -----------------------------------------------------
    # How many devices (cuda:0 .. cuda:N-1) one Device may drive; None: any number. A backend
    # with more than 1 takes `device=` on sync_device and provides collective().
    max_devices: Optional[int] = 1

    def collective(self, name: str, streams, outputs, inputs) -> None:
        """One NCCL collective (`all_reduce`, `reduce_scatter`, `all_to_all`): rank k's part runs
        on streams[k], reads inputs[k] and writes outputs[k] (Regions); the front end recorded
        one Launch per rank, in rank order, just before."""
        raise NotImplementedError(f"the {self.name} backend does not model collectives")

    # --- what a backend may report (optional; plain attributes or properties) ------------
    schedule = None  # the core.schedule.Schedule it followed (policy, seed, decisions), if any
    op_times: Mapping = MappingProxyType({})  # trace index -> (start, end) of executed work; empty: untimed
    node_times: Mapping = MappingProxyType({})  # (graph launch trace index, node) -> (start, end)
    delays: Sequence = ()  # the delays it injected: (trace index, stream name, amount)

    def warm_up(self) -> list:
        """Get implicit synchronizations (lazy loading, pool growth) out of the way before the
        program's first racy step; returns the reasons, each also noted on the device."""
        return []
