"""torch's operators through the native observer (streamcheck/record/native/observer.cpp): the C++
callbacks write each operator as a compact record, and the drain turns them into the trace records
torch_ops' Python path would make (the reference), by its rules (the observer's C++ drain makes an
ordinary operator's Launch itself where the recorder's tables answer; this module does the rest):

- an ordinary operator: one Launch on the stream that was current on its device, reading its
  arguments' bytes and writing the written ones and its fresh outputs; its storages registered as
  the recorder's allocations (torch_ops.register_storage), in the order _record registers them;
- a special one (host copies, pinned memory, `.item()`, operators that hand the host a value,
  record_stream, custom operators) is replayed through torch_ops.Ops._record itself, with its
  inputs and outputs as torch gives them to Python, on the stream it ran on;
- torch's GPU-trace callbacks of events and of the caching allocator's blocks (the observer takes
  them while it records): torch_runtime's rules (TRACE_CALLBACKS), the C++ drain making the usual
  records itself.
Each record is recorded as its own thread at its own call site (the recorder holds them while it
turns the record into trace records), from the stack the observer read.

When: the recorder drains the buffer before it records anything else (Recorder.pending: a sync,
an event, a free, a Triton launch), before anything reads its trace or allocation table, and at the
end of each special operator (the observer calls `special_end`), so the trace stays in issue order.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import threading

from .. import gpu as _gpu
from .. import native
from ...core import trace as T
from ...core.hb import TraceError
from . import torch_ops, torch_runtime
from .patching import forwarding
from .threads import add_context
from .torch_ops import Ops, native_description, ranges_in, register_storage


class NativeRecording:
    """One recording's use of the observer: the operator table it described, the sites of its
    stacks, and the drain. `device`: "cuda" (or "cpu" for tests, whose CPU tensors stand in for
    CUDA ones); `stream_pointer(handle)`: the cudaStream_t of a record's stream (its native handle
    already, on CUDA; tests map CPU's stream id to a stand-in stream)."""

    def __init__(self, rec, torch, observer, ops=None, device: str = "cuda", stream_pointer=None):
        self.rec = rec
        self.torch = torch
        self.observer = observer
        self.ops = ops or Ops(rec, torch)
        self.device = device
        self.backend = device.upper()
        self.stream_pointer = stream_pointer or _handle_is_pointer
        self.names: list = []  # op index -> "aten.add_.Tensor"
        self.funcs: list = []  # op index -> the OpOverload
        self.flags: list = []
        self.sites: dict = {0: T.UNKNOWN_SITE}  # stack id -> CallSite
        self.resolver = rec.site
        self.settings = T.site_settings()
        self._described: dict = {}  # (name, overload) -> op index
        self.enabled_on = None  # the thread that enabled it (its callback is removed there)
        self._taken_callbacks: list = []  # (registry, torch_runtime's callback, its place in the list)

    # --- what the observer asks (under the GIL, from its callbacks) ----------------------------
    def describe(self, name: str, overload: str):
        """(index, flags, written, device argument, pin_memory argument) of operator `name` (aten::add_)
        `overload`, or None: not recorded (an internal error says why)."""
        key = (name, overload)
        found = self._described.get(key)
        if found is not None:
            return found
        try:
            namespace, _, op_name = name.partition("::")
            func = getattr(getattr(getattr(self.torch.ops, namespace), op_name), overload or "default")
            flags, written, device_arg, pin_arg = native_description(func, self.backend)
        except Exception as exc:  # never into the program: the operator goes unrecorded, and the report says so
            self.rec.errors.append(f"native recording: cannot describe operator {name}.{overload or 'default'}: "
                                   f"{type(exc).__name__}: {exc} (its calls are not recorded)")
            return None
        if namespace in ("profiler", "streamcheck_native"):
            flags |= native.IGNORED
        found = self._described[key] = (len(self.funcs), flags, written, device_arg, pin_arg)
        self.funcs.append(func)
        self.names.append(torch_ops.operator_schema(func).name)
        self.flags.append(flags)
        return found

    def classify(self, code) -> int:
        try:
            return self.resolver.code_kind(code)
        except Exception as exc:
            self.rec.errors.append(f"native recording: cannot classify {code!r}: {type(exc).__name__}: {exc}")
            return T.LIBRARY

    def special_begin(self, reading: bool, custom: bool) -> None:
        """A special operator starts. One that may wait for the device (`reading`): torch's sync callback
        inside it is part of it (torch_runtime._stream_synchronized), as _record's own `reading` says on
        the Python path. A custom operator: its implementation is one call of the program's, as R.inside
        makes it on the Python path (the adapters stay quiet; it may declare what they cannot see)."""
        if reading:
            self.rec.reading = True
        if custom:
            _gpu.thread_state.depth += 1

    def special_end(self, ok: bool, custom: bool) -> None:
        """A special operator ended: drain now (it is replayed, its values released); or it failed."""
        if custom:
            _gpu.thread_state.depth -= 1
        if not ok:
            self.rec.reading = False
            return
        try:
            self.rec.flush()
        finally:
            self.rec.reading = False

    # --- the drain (Recorder.pending) ------------------------------------------------------------
    def drain(self) -> None:
        observer = self.observer
        if not observer.waiting.value and self._sites_current():
            return  # nothing recorded since the last drain (the recorder flushes before each record it makes)
        try:
            lane = self._lane()
            if lane is not None:
                observer.drain(lane)  # it pauses this thread's observation meanwhile, as below
            else:
                observer.pause(1)  # what the drain runs is streamcheck's (is_pinned, the special values)
                try:
                    taken = observer.take()
                    if taken:
                        self._record(taken)
                finally:
                    observer.pause(-1)
            if not self._sites_current():
                self._reset_sites()
        except Exception as exc:
            self.rec.errors.append(f"native recording: {type(exc).__name__}: {exc} (operators lost)")

    def _sites_current(self) -> bool:
        """Whether the stacks were classified by the recorder's resolver under the site settings in force."""
        return self.rec.site is self.resolver and T.site_settings() is self.settings

    def _reset_sites(self) -> None:
        """Other library directories or site settings: other user frames, so other stacks."""
        self.resolver, self.settings = self.rec.site, T.site_settings()
        self.sites = {0: T.UNKNOWN_SITE}
        self.observer.reset_stacks()

    def _site(self, stack_id: int):
        found = self.observer.stack(stack_id)
        site = self.resolver.site_of(*found) if found is not None else T.UNKNOWN_SITE
        self.sites[stack_id] = site
        return site

    def _lane(self):
        """What the observer's C++ drain needs to turn an ordinary operator into its Launch as _launch
        would when the recorder already knows its thread and stream (the recorder's native_lane), the
        allocator's and events' records likewise, and the Python functions for the rest (_register: a
        storage first seen that torch did not report; _record_one: a whole record); None: every record
        through _record."""
        tables = self.rec.native_lane()
        if tables is None:
            return None
        pool_at, streams, threads, ops, feed, range_in, event_handles, name_event_handle, strict_free, table = tables
        pointer = None if self.stream_pointer is _handle_is_pointer else self.stream_pointer
        torch_state = torch_runtime.state(self.rec)
        memory = (torch_state.pending, torch_state.graph_pool_blocks, torch_state.graph_pool_threads,
                  bool(self.rec.captures), T.Free, strict_free, T.Alloc) + table + (T.Range, torch_ops.TORCH_BLOCK)
        return (pool_at, streams, threads, self.sites, self.names, self.flags, T.Launch, ops, feed,
                self._record_one, self._site, range_in, self._register, self._fed_badly, pointer, native.NO_ACCESS,
                event_handles, T.EventRecord, T.StreamWait, name_event_handle, T.EventCreate, memory)

    def _record_one(self, record) -> None:
        self._record((record,))

    def _register(self, base: int, nbytes: int, fresh: bool, pointer: int, ident: int, site):
        """register_storage for the C++ drain: a storage first seen, of an operator that `ident` issued at
        `site` on stream `pointer` (its Alloc record is that thread's, at that site)."""
        previous = self.resolver.hold(site)
        _gpu.thread_state.acting = ident
        try:
            return register_storage(self.rec, base, nbytes, "cuda", fresh, lambda: pointer)
        finally:
            _gpu.thread_state.acting = 0
            self.resolver.release(previous)

    def _fed_badly(self, op, exc) -> None:
        """Recorder.record's handling of a record the checker raised on (the C++ drain fed it)."""
        if isinstance(exc, TraceError):
            self.rec.refuse(op, exc)
        else:
            self.rec.errors.append(f"{op.name}: {type(exc).__name__}: {exc} (not recorded)")

    def _record(self, taken) -> None:
        """Each record as its own thread at its own site: what rec.tid() and rec.site() answer meanwhile."""
        rec, resolver, sites, state_ = self.rec, self.resolver, self.sites, _gpu.thread_state
        previous = resolver.hold(None)
        try:
            for op, ident, stream, device, stack, flags, slot, accesses in taken:
                site = sites.get(stack)
                if site is None:
                    site = self._site(stack)
                resolver.hold(site)
                state_.acting = ident
                try:
                    if flags & native.TRACE_RECORD:  # a GPU-trace callback: torch_runtime's rule
                        if flags & native.HAS_STREAM:  # the stream current then (an allocation's), not one torch passed
                            stream = self.stream_pointer(stream)
                        torch_runtime.TRACE_CALLBACKS[op][2](rec, slot, stream)
                    elif flags & native.SPECIAL_RECORD:
                        self._replay(op, slot, stream if flags & native.HAS_STREAM else None)
                    else:
                        self._launch(op, stream, flags, accesses)
                except Exception as exc:
                    what = torch_runtime.TRACE_CALLBACKS[op][0] if flags & native.TRACE_RECORD else self.names[op]
                    rec.errors.append(f"{what}: {type(exc).__name__}: {exc} (not recorded)")
        finally:
            state_.acting = 0
            resolver.release(previous)

    # --- torch's GPU-trace callbacks (observer.cpp's trace_hook) ----------------------------------------------
    def take_trace_callbacks(self) -> None:
        """From now on torch's event and allocator callbacks become records of the observer's buffer, in issue
        order with the operators, and its C++ drain makes their records as it makes Launch records (the rest by
        torch_runtime's rules, in Python). Each registry's `fire_callbacks` (looked up on it at every call by
        torch's C++) is the observer's meanwhile, and torch_runtime's callback leaves its list; the registry's
        other callbacks stay, and still run. An allocator callback the observer cannot defer (streamcheck's own
        work, a thread it does not observe) still reaches torch_runtime's callback, which records it at once."""
        try:
            from torch.cuda import _gpu_trace
        except ImportError:
            return
        for kind, (name, callback, _) in enumerate(torch_runtime.TRACE_CALLBACKS):
            registry = getattr(_gpu_trace, name, None)
            callbacks = getattr(registry, "callback_list", None)
            if not isinstance(callbacks, list) or callback not in callbacks or "fire_callbacks" in vars(registry):
                continue  # not registered (torch_runtime refused this torch), or another hook sits there
            place = callbacks.index(callback)
            callbacks.pop(place)
            registry.fire_callbacks = self.observer.trace_hook(kind, registry.fire_callbacks, callbacks, callback)
            self._taken_callbacks.append((registry, callback, place))

    def give_back_trace_callbacks(self) -> None:
        """torch_runtime's callbacks back in their registries (what was taken waits in the buffer, and the next
        record drains it first: the order holds)."""
        for registry, callback, place in reversed(self._taken_callbacks):
            vars(registry).pop("fire_callbacks", None)
            registry.callback_list.insert(place, callback)
        self._taken_callbacks = []

    def _launch(self, op: int, stream: int, flags: int, accesses) -> None:
        """torch_ops.Ops._record's ordinary operator, from a record: the stream (when known before the
        operator ran), the storages registered (the reads', the writes', then the fresh outputs'), the
        launch reading what it does not write."""
        rec = self.rec
        pointer = self.stream_pointer(stream)
        sid = rec.sid(pointer) if flags & native.STREAM_BEFORE else None
        site, tid = rec.site(), rec.tid()

        def current():  # the stream to file a block allocated before the recording under
            return pointer
        spans = ([], [], [])  # (allocation, lo, hi) read, written, fresh
        for role in (native.READ, native.WRITTEN, native.FRESH):
            into = spans[role]
            for lo, hi, base, nbytes, _, their_role in accesses:
                if their_role == role:
                    into.append((register_storage(rec, base, nbytes, "cuda", role == native.FRESH, current), lo, hi))
        if self.flags[op] & native.NO_ACCESS:
            return
        if sid is None:  # a factory: its output says where it ran
            sid = rec.sid(pointer)
        written, read = ranges_in(rec, spans[1] + spans[2]), ranges_in(rec, spans[0])
        rec.record(T.Launch(tid, site, stream=sid, name=self.names[op],
                            reads=tuple(r for r in read if r not in written) if written else read, writes=written))

    def _replay(self, op: int, slot: int, stream) -> None:
        """A special operator, through torch_ops' own rules, with its values as Python objects."""
        func = self.funcs[op]
        inputs, outputs = self.torch.ops.streamcheck_native.special_values(slot)
        args, kwargs = [], {}
        for argument, value in zip(func._schema.arguments, inputs):
            if argument.kwarg_only:
                kwargs[argument.name] = value
            else:
                args.append(value)
        result = outputs[0] if len(outputs) == 1 else tuple(outputs) if outputs else None
        self.ops.replay(func, tuple(args), kwargs, result, None if stream is None else self.stream_pointer(stream))


def _handle_is_pointer(handle: int) -> int:
    return handle


class ObservedThread:
    """The context a host thread is in for the observer to see its operators (threads.add_context)."""

    def __init__(self, observer):
        self.observer = observer

    def __enter__(self):
        self.observer.observe_thread(1)
        return self

    def __exit__(self, *exc):
        self.observer.observe_thread(0)


def start(rec, torch, observer, ops=None, device: str = "cuda", stream_pointer=None) -> NativeRecording:
    """Record `rec`'s torch operators through `observer` from this thread on (stop() ends it)."""
    recording = NativeRecording(rec, torch, observer, ops, device, stream_pointer)
    torch_ops.skip_torch_wrappers(torch)
    observer.enable(device, recording.describe, recording.classify, recording.special_begin,
                    recording.special_end, T.site_settings().depth)
    rec.pending = recording.drain
    _gpu.native_pause = observer.pause
    observer.observe_thread(1)
    recording.enabled_on = threading.get_ident()
    recording.take_trace_callbacks()
    return recording


def stop(recording: NativeRecording) -> None:
    """Drain what is left, then observe no more: every thread's callback goes inert at once; this
    thread's is removed (other threads remove theirs as they leave their ObservedThread)."""
    rec, observer = recording.rec, recording.observer
    try:
        recording.give_back_trace_callbacks()  # first: a callback from now on drains what was taken before it
        rec.flush()
    finally:
        observer.disable()
        if threading.get_ident() == recording.enabled_on:
            observer.observe_thread(0)
        if _gpu.native_pause is observer.pause:
            _gpu.native_pause = None
        if rec.pending == recording.drain:
            rec.pending = None


def install(rec, patcher) -> None:
    """Record `rec`'s torch operators through the native observer where it can be had and nothing
    must run before each operator is issued (a delay, a race-confirmation probe: the dispatch mode
    runs those); else the dispatch mode records them (torch_ops.install), and a notice says why.
    Opt-in (STREAMCHECK_NATIVE_RECORD=1) until the whole GPU suite passes through it (its first run found
    two bugs, fixed since; docs/gpu-results.md), so a GPU user's default stays the path that suite checks."""
    if "torch" not in rec.state or rec.intercepts:  # torch_runtime refused this torch (notice given)
        return
    if os.environ.get(native.SWITCH) != "1":
        return
    observer = native.load()
    if observer is None:
        if os.environ.get(native.SWITCH) != "0":
            rec.notice(f"torch operators are recorded through Python, about 7 µs each (the native observer is "
                       f"unavailable: {native.unavailable_reason()})")
        return
    try:
        recording = start(rec, rec.gpu.torch, observer)
    except RuntimeError as exc:  # c10's error: this torch has no CUDA device guard at all (a CPU build)
        rec.notice("torch operators are recorded through Python, about 7 µs each (the native observer is "
                   f"unavailable: {str(exc).splitlines()[0]})")
        return
    if not observer.stream_handles():  # streams would be c10's ids, not the cudaStream_t the recorder names
        stop(recording)
        rec.notice("torch operators are recorded through Python, about 7 µs each (the native observer is "
                   f"unavailable: torch {rec.gpu.torch.__version__}'s CUDA guard gives no stream handles)")
        return
    rec.state["torch_native"] = recording
    add_context(rec, lambda: ObservedThread(observer), patcher)
    _pause_while_modes_are_off(observer, patcher)

    def undo():
        stop(recording)
        rec.state.pop("torch_native", None)
    patcher.on_undo(undo)


def _pause_while_modes_are_off(observer, patcher) -> None:
    """torch turns the dispatch modes off around work of its own: Dynamo compiles under
    `_disable_current_modes` (Inductor's autotuning runs kernels on inputs it clones), and the
    dispatch mode sees none of it. The observer pauses there too. torch._dynamo.convert_frame holds
    its own reference to the function: rebound when it is imported (at the first compile)."""
    name = "_disable_current_modes"

    def wrap(original):
        @contextlib.contextmanager
        def disable_current_modes(*args, **kwargs):
            observer.pause(1)
            try:
                with original(*args, **kwargs) as modes:
                    yield modes
            finally:
                observer.pause(-1)
        return forwarding(original, disable_current_modes)

    replacements: dict = {}  # original -> its replacement (the same for every module that holds it)

    def rebind(module) -> None:
        original = getattr(module, name, None)
        if original is None:
            return
        if original not in replacements:
            replacements[original] = wrap(original)
        patcher.set(module, name, replacements[original], f"{module.__name__}.{name}")
    rebind(importlib.import_module("torch.utils._python_dispatch"))
    patcher.after_import("torch._dynamo.convert_frame", rebind)


def patches() -> tuple:
    return ()
