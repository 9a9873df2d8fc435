"""torch's ATen operators, through a TorchDispatchMode: each operator on CUDA tensors is one
launch on torch's current stream, reading its tensor arguments and writing what its schema
marks as written (`Tensor(a!)`: in-place and `out=` arguments) plus the tensors it returns
fresh. A view is a byte range of its storage, so two slices of one bucket are two ranges.

Host memory: an operator on *pinned* CPU tensors is a host access by the calling thread, so a
CPU `copy_`/`fill_` into a pinned buffer while a `non_blocking=True` copy from it is pending is
a race. Copies between host and device (`copy_`, `.to()`, `.cuda()`, `.cpu()`):
- from or to pinned memory with non_blocking=True: an async copy on the current stream, whose
  host side the stream reads or writes when it gets there;
- otherwise (pageable memory, or blocking): the host waits for the stream (a stream sync).
`.item()`, `.tolist()` and printing read through `_local_scalar_dense`: a copy, then a sync.
Operators whose C++ hands the host a value (`equal`, `allclose`, `nonzero`, boolean masks,
`unique`, ...: hands_host_a_value, from torch's tags) are their launch, then the host's wait for
their stream.
`tensor.record_stream(s)` marks the tensor's block as used on `s` for the caching allocator.

Custom operators (`torch.library.custom_op`, `Library.define`, any namespace but `aten` and
`prims`) come here as one opaque operator: the mode is off while their implementation runs.
Their schema says what they write (`mutates_args`, `"unknown"` marks every tensor argument,
`Tensor(a!)`), with one assumption, said once per recording in a notice: an operator that
declares no written argument and returns no tensor can only have had an effect by writing, so
every tensor argument counts as written. Otherwise the schema is taken at its word: an
implementation that writes an argument its schema does not declare is not caught (under a
dispatch mode torch excludes ADInplaceOrView, so not even the version counter moves); declare
the write (`mutates_args`, `Tensor(a!)`) or use `streamcheck.declare_access`.

`pinned.numpy()` is a host view (record.host_views): the host's reads and writes through it are
host accesses of the pinned bytes.
Not seen: memory written through `.numpy()` of pageable memory or raw pointers (numpy writes are not
ATen ops: declare them with streamcheck.declare_access), kernels of extensions that bypass the
dispatcher, and tensor subclasses whose __torch_dispatch__ runs before ours.
"""
from __future__ import annotations

import os

from .. import recorder as R
from ...core import trace as T
from ...core.trace import CopyKind
from ..gpu import is_suppressed
from ..host_views import HostView
from .patching import forwarding
from .threads import add_context
from .torch_runtime import current_stream_ptr, state

# Allocate without touching the bytes (their contents are undefined): no access.
_NO_ACCESS = frozenset({"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
                        "aten.new_empty.default", "aten.new_empty_strided.default", "aten.set_.source_Storage",
                        "aten.set_.source_Storage_storage_offset", "aten.resize_.default", "aten.is_pinned.default",
                        "aten._pin_memory.default"})
# Fresh tensors shaped like an argument: they read its shape, dtype and device, never its bytes
# (autograd's implicit gradient of backward() is a ones_like of the loss).
_LAYOUT_ONLY = frozenset({"aten.ones_like.default", "aten.zeros_like.default", "aten.full_like.default",
                          "aten.rand_like.default", "aten.randn_like.default", "aten.randint_like.default",
                          "aten.randint_like.low_dtype", "aten.new_zeros.default", "aten.new_ones.default",
                          "aten.new_full.default"})
_COPIES = frozenset({"aten.copy_.default", "aten._to_copy.default", "aten._copy_from.default",
                     "aten._copy_from_and_resize.default"})
# Autograd's own bookkeeping, whose schema says "written": `detach_` changes a tensor's autograd
# metadata in its autograd kernel and dispatches no further (no kernel touches the bytes; a dispatch
# mode sees it only with autograd off). Not an operator of the trace.
_METADATA_ONLY = frozenset({"aten.detach_.default"})


# torch's own operators: their schemas are exact, and their implementations are not the program's.
_TORCH_NAMESPACES = frozenset({"aten", "prims"})


def _tensors(value, torch) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


class _Schema:
    """Per operator overload, computed once: argument names and which are written; whether
    it only makes views (every return aliases an input, none written); for a custom operator,
    whether every tensor argument is assumed written (it declares no write and returns no
    tensor)."""

    __slots__ = ("name", "arguments", "view", "all_written")

    def __init__(self, func):
        schema = func._schema
        self.name = str(func)
        arguments = [(a.name, a.kwarg_only, bool(a.alias_info is not None and a.alias_info.is_write))
                     for a in schema.arguments]
        returns = schema.returns
        self.view = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        custom = func.namespace not in _TORCH_NAMESPACES
        # `Tensor`, `Tensor?`, `Tensor[]`: the type's name says whether a return holds tensors.
        self.all_written = (custom and not any(written for _, _, written in arguments)
                            and not any("Tensor" in str(r.type) for r in returns))
        if self.all_written:
            arguments = [(arg_name, kwarg_only, True) for arg_name, kwarg_only, _ in arguments]
        self.arguments = tuple(arguments)


_schemas: dict = {}


def operator_schema(func) -> _Schema:
    """What an operator overload reads and writes by its schema (computed once per overload)."""
    found = _schemas.get(func)
    if found is None:
        found = _schemas[func] = _Schema(func)
    return found


def operator_accesses(func, args, kwargs):
    """(tensor, written) for every tensor argument of one call, by the operator's schema: the one
    access rule the recorder (on a GPU) and the emulation (on the sim) both follow."""
    import torch

    schema = operator_schema(func)
    layout_only = schema.name in _LAYOUT_ONLY
    for i, (arg_name, kwarg_only, written) in enumerate(schema.arguments):
        if layout_only and not written:
            continue
        value = kwargs.get(arg_name) if kwarg_only or i >= len(args) else args[i]
        for t in _tensors(value, torch):
            yield t, written


# Operators whose C++ hands the host a value, so the host waits for their stream inside the call
# (a free or a write on another stream issued after them is ordered after their work), from
# torch's own tags: `data_dependent_output` (the result is a host value: `_local_scalar_dense`,
# `item`, `equal`, `allclose`) and `dynamic_output_shape` (the output's size is read from the data:
# `nonzero`, `argwhere`, `masked_select`, `unique` and its variants, `bincount`, `_ctc_loss`,
# `linalg_lstsq`, and the three below). Composites (`is_nonzero`, `bool()`, `tolist` ...) reach a
# dispatch mode whole or as these. Three of the tagged read the data only for some arguments:
# `index.Tensor` with a boolean (or uint8) mask (ATen's expandTensors turns a mask into
# `nonzero()`; `index_put_` does the same, untagged), `repeat_interleave.Tensor` without
# `output_size`, `one_hot` without `num_classes`.
_MASK_INDEXED = frozenset({"aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default",
                           "aten._index_put_impl_.default"})
_HOST_VALUE_UNLESS = {  # operator -> (argument, position): it reads the data unless that argument is given
    "aten.repeat_interleave.Tensor": ("output_size", None),
    "aten.one_hot.default": ("num_classes", 1),
}
_host_value_kinds: dict = {}  # operator overload -> "always", "mask", "unless" or ""


def _host_value_kind(func) -> str:
    kind = _host_value_kinds.get(func)
    if kind is None:
        import torch

        name = str(func)
        tags = func.tags
        if name in _MASK_INDEXED:
            kind = "mask"
        elif name in _HOST_VALUE_UNLESS:
            kind = "unless"
        elif torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags:
            kind = "always"
        else:
            kind = ""
        _host_value_kinds[func] = kind
    return kind


def hands_host_a_value(func, args, kwargs) -> bool:
    """Whether this call of operator `func` makes the host wait for its stream and read a value
    (see above): the one rule of the recorder on a GPU and of the emulation on the sim."""
    kind = _host_value_kind(func)
    if not kind:
        return False
    if kind == "always":
        return True
    if kind == "mask":
        import torch

        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices)
    argument, position = _HOST_VALUE_UNLESS[str(func)]
    value = kwargs.get(argument, args[position] if position is not None and len(args) > position else None)
    return value is None or (argument == "num_classes" and value == -1)


def register(rec, torch, t, kind: str, fresh: bool = False):
    """Make sure the storage under `t` ('cuda', or 'host': pinned) is a known allocation of
    `rec` (its caching-allocator block, filed under the stream it was allocated on). `fresh`: an
    operator's new result; a pinned one at a known block's address is that block handed out again
    by torch's CachingHostAllocator (no callback reports pinned frees)."""
    if not (fresh and kind == "host"):  # a known block is found by its start, without a storage object
        base = t.data_ptr() - t.storage_offset() * t.element_size()
        known = rec.allocation_at(base) if base > 0 else None
        if known is not None:
            return known
    storage = t.untyped_storage()
    return register_storage(rec, storage.data_ptr(), storage.nbytes(), kind, fresh,
                            lambda: current_stream_ptr(torch, t.device.index))


def ranges_in(rec, spans) -> tuple:
    """Recorder.ranges of byte spans (allocation or None, lo, hi): each a Range of the allocation
    given (its tensor's storage, no search of the table) or else of the one holding it; an empty
    span is none, and each Range comes once (the native observer's drain and Ops._record)."""
    out = []
    for alloc, lo, hi in spans:
        if lo == hi:
            continue
        rng = rec.range_in(alloc, lo, hi) if alloc is not None else rec.span_range(lo, hi)
        if all(rng is not seen for seen in out):
            out.append(rng)
    return tuple(out)


TORCH_BLOCK = "torch tensor"  # a block of torch's caching allocator in reports (its Alloc's name)


def register_storage(rec, ptr: int, nbytes: int, kind: str, fresh: bool, current_stream):
    """register's rule for a storage at `ptr` of `nbytes` (the native observer's records give
    those); `current_stream()`: the stream to file a block under that was allocated before the
    recording started (the current stream of the tensor's device when the operator ran). Returns
    the recorder's allocation of it (None for no storage)."""
    if not ptr:
        return None
    known = rec.allocation_at(ptr)
    if known is not None:
        if not (fresh and kind == "host" and known.pool == "pinned"):
            return known
        rec.host_block_reused(known)
    if kind == "cuda":
        sid = state(rec).pending.pop(ptr, None)
        if sid is None:  # allocated before the recording started: file it under the current stream
            sid = rec.sid(current_stream())
        return rec.alloc(ptr, nbytes, what=TORCH_BLOCK, pool="torch", sid=sid)
    return rec.host_alloc(ptr, nbytes)


class Ops:
    """Turns one operator call into trace records for `rec`."""

    def __init__(self, rec, torch):
        self.rec = rec
        self.torch = torch
        self._pinned: dict = {}  # storage address -> pinned (is_pinned is a driver query)
        self.recorded_stream = None  # replay: the stream the operator ran on (its device's current one then)

    def _current_stream(self, device) -> int:
        """cudaStream_t of torch's current stream on `device`, as the operator being recorded found it."""
        if self.recorded_stream is not None:
            return self.recorded_stream
        return current_stream_ptr(self.torch, device)

    # --- tensors --------------------------------------------------------------------------
    def _kind(self, t) -> str:
        """'cuda', 'host' (pinned CPU memory) or '' (pageable CPU, meta, ...: not recorded)."""
        if t.is_cuda:
            return "cuda"
        if t.device.type != "cpu" or t.numel() == 0:
            return ""
        ptr = t.untyped_storage().data_ptr()
        pinned = self._pinned.get(ptr)
        if pinned is None:  # our own query: not an operator of the program's
            pinned = self._pinned[ptr] = bool(R.inside(t.is_pinned))
        return "host" if pinned else ""

    def register(self, t, kind: str, fresh: bool = False):
        """register(): the allocation of `t`'s storage (None for none)."""
        return register(self.rec, self.torch, t, kind, fresh)

    def _ranges(self, tensors, allocs: dict) -> tuple:
        """Recorder.ranges of the tensors of (tensor, kind) pairs, each in the allocation its
        registration found (allocs: id(tensor) -> it) rather than by a search of the table."""
        spans = []
        for t, _ in tensors:
            span = self.rec.gpu.array_span(t)
            if span is None:  # an empty tensor spans no bytes
                continue
            alloc = allocs.get(id(t))
            if alloc is not None and not (alloc.start <= span[0] and span[1] <= alloc.stop):
                alloc = None
            spans.append((alloc, span[0], span[1]))
        return ranges_in(self.rec, spans)

    # --- one operator ---------------------------------------------------------------------
    def call(self, func, args, kwargs):
        """Run the operator once, recorded. Our own bookkeeping never breaks the program: if it
        fails, the operator still runs (or its result is kept) and the recording notes an
        internal error; the operator's own exception reaches the program unchanged."""
        started, ran = [], []

        def run():
            started.append(True)
            result = R.inside(func, *args, **kwargs)
            ran.append(result)
            return result
        try:
            return self._record(func, args, kwargs, run)
        except Exception as exc:
            if started and not ran:
                raise  # the operator's own error: the program's
            self.rec.errors.append(f"{operator_schema(func).name}: {type(exc).__name__}: {exc} (not recorded)")
            return ran[0] if ran else func(*args, **kwargs)

    def replay(self, func, args, kwargs, result, stream) -> None:
        """Record a call of operator `func` that already ran and returned `result`, on `stream`
        (its device's current stream then; None: ask now): the native observer's special operators,
        through the same rules as call (the recorder holds the call's thread and site meanwhile)."""
        self.recorded_stream = stream
        try:
            self._record(func, args, kwargs, lambda: result)
        except Exception as exc:
            self.rec.errors.append(f"{operator_schema(func).name}: {type(exc).__name__}: {exc} (not recorded)")
        finally:
            self.recorded_stream = None

    def _record(self, func, args, kwargs, run):
        schema = operator_schema(func)
        if schema.view or schema.name in _METADATA_ONLY:  # no kernel: a view is bytes of its base, seen when used
            return run()
        name = schema.name
        if name == "aten.record_stream.default":
            return self._record_stream(run, args, kwargs)
        torch, rec = self.torch, self.rec
        reads, writes = [], []
        for t, written in operator_accesses(func, args, kwargs):
            kind = self._kind(t)
            if kind:
                (writes if written else reads).append((t, kind))
        if name == "aten._local_scalar_dense.default" and reads and reads[0][1] == "cuda":
            return self._host_read(run, reads[0][0])
        cuda = [t for t, k in reads + writes if k == "cuda"]
        stream = sid = None
        # Where it runs: its CUDA arguments' device, or the one `device=` names (an upload to a fresh
        # tensor, `pinned.to("cuda", non_blocking=True)`, has no CUDA argument but runs on that
        # device's current stream, where a delay must hold it too).
        target = cuda[0].device.index if cuda else _cuda_target(torch, kwargs)
        if (cuda or target is not None) and name not in _NO_ACCESS:
            stream = self._current_stream(target)
            sid = rec.sid(stream)
            if rec.intercepts:
                rec.before_issue(stream, sid, name)  # before the operator is issued
        site, tid = rec.site(), rec.tid()
        # The host's wait inside such a call comes after its work: recorded below, after the access
        # (torch's callback would report it first, before the operator is recorded).
        host_value = sid is not None and hands_host_a_value(func, args, kwargs)
        if host_value or name in _COPIES:
            rec.reading = True
            try:
                result = run()
            finally:
                rec.reading = False
        else:
            result = run()
        if schema.all_written and writes:
            rec.notice(f"custom operator `{name}` declares no written argument and returns no tensor, so its only "
                       "effect can be a write: every tensor argument is assumed written (declare the written ones "
                       "with `mutates_args=` or `Tensor(a!)` in its schema)")
        fresh = []
        for t in _tensors(result, torch):
            if all(t is not w for w, _ in writes):  # in-place ops return their written argument
                kind = self._kind(t)
                if kind:
                    fresh.append((t, kind))
        allocs = {}  # id(tensor) -> its storage's allocation (the tensors live through this call)
        for t, kind in reads + writes:
            allocs[id(t)] = self.register(t, kind)
        for t, kind in fresh:
            allocs[id(t)] = self.register(t, kind, fresh=True)
        if name in _NO_ACCESS:
            return result
        writes += fresh
        kinds = {k for _, k in reads + writes}
        if not kinds:
            return result
        if name in _COPIES and ("host" in kinds or self._pageable_side(args, kwargs, result)):
            self._copy(name, args, kwargs, reads, writes, site, tid)
        elif kinds == {"host"}:
            rec.record(T.HostAccess(tid, site, reads=rec.ranges(t for t, _ in reads),
                                    writes=rec.ranges(t for t, _ in writes), name=name))
        else:
            if stream is None:  # a factory: its output says where it ran
                stream = self._current_stream(next(t for t, k in writes if k == "cuda").device.index)
                sid = rec.sid(stream)
            written = self._ranges(writes, allocs)
            rec.record(T.Launch(tid, site, stream=sid, name=name,
                                reads=tuple(r for r in self._ranges(reads, allocs) if r not in written),
                                writes=written))
            if host_value:
                rec.record(T.StreamSync(tid, site, stream=sid, cause=name))
        return result

    def _pageable_side(self, args, kwargs, result=None) -> bool:
        """A copy between a CUDA tensor and pageable CPU memory (an argument, or the fresh result
        of `.cpu()`, `.tolist()`'s copy): synchronous for the host."""
        tensors = _tensors(list(args) + list(kwargs.values()), self.torch) + _tensors(result, self.torch)
        kinds = [self._kind(t) for t in tensors]
        return "cuda" in kinds and any(t.device.type == "cpu" and not k for t, k in zip(tensors, kinds))

    def _copy(self, name, args, kwargs, reads, writes, site, tid) -> None:
        """Host <-> device, already issued: async on the current stream from/to pinned memory
        with non_blocking, else followed by a host wait for the stream (pageable memory goes
        through a staging buffer the host waits for; non_blocking=False waits anyway)."""
        rec = self.rec
        non_blocking = bool(kwargs.get("non_blocking", args[2] if name == "aten.copy_.default" and len(args) > 2
                                       else False))
        src = [t for t, _ in reads]
        dst = [t for t, _ in writes]
        device_side = [t for t in src + dst if self._kind(t) == "cuda"]
        if not device_side:  # between two host tensors: the host copies
            rec.record(T.HostAccess(tid, site, reads=rec.ranges(src), writes=rec.ranges(dst), name=name))
            return
        sid = rec.sid(self._current_stream(device_side[0].device.index))
        kind = CopyKind.H2D if any(self._kind(t) == "cuda" for t in dst) else CopyKind.D2H
        rec.record(T.Copy(tid, site, stream=sid, kind=kind, src=next(iter(rec.ranges(src)), None),
                          dst=next(iter(rec.ranges(dst)), None)))
        host = [t for t in src + dst if self._kind(t) != "cuda"]
        if not (non_blocking and host and all(self._kind(t) == "host" for t in host)):
            rec.record(T.StreamSync(tid, site, stream=sid))
            return
        for t in host:  # pending: torch's CachingHostAllocator holds the pinned block until the copy ran
            alloc = rec.allocation_of(t)
            if alloc is not None and alloc.pool == "pinned":
                rec.host_block_used(alloc, sid)

    def _host_read(self, run, tensor):
        """`.item()` & co.: a copy to the host on the current stream, then a wait for it."""
        rec = self.rec
        self.register(tensor, "cuda")
        stream = self._current_stream(tensor.device.index)
        return rec.host_read("aten._local_scalar_dense", tensor, stream, True, run)

    def _record_stream(self, run, args, kwargs):
        rec, torch = self.rec, self.torch
        tensor, stream = args[0], args[1] if len(args) > 1 else kwargs["s"]
        result = run()
        if self._kind(tensor) == "cuda":
            self.register(tensor, "cuda")
            alloc = rec.allocation_of(tensor)
            if alloc is not None:
                cuda_stream = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                                device_type=stream.device_type)
                rec.record_stream(alloc, cuda_stream.cuda_stream)
        return result


def is_math_kernel(func, backend: str) -> bool:
    """Whether operator overload `func` runs as its CompositeImplicitAutograd kernel on `backend`
    ("CUDA"; "CPU" on the stand-ins of tests): torch's rule for the autograd key, a math kernel
    unless the backend or a CompositeExplicitAutograd kernel is registered for it. Such an
    operator (linear, matmul, reshape, contiguous, to) is the operators it calls: with autograd on,
    they are all a dispatch mode sees; with it off (inference_mode) the mode sees the operator
    itself, and decomposes it (make_mode), since its schema can say "alias" of what may be a copy
    (`to`, `reshape`). The native observer makes the same call (native_description)."""
    kind = _math_kernels.get((func, backend))
    if kind is None:
        import torch

        name, has = func.name(), torch._C._dispatch_has_kernel_for_dispatch_key
        kind = _math_kernels[(func, backend)] = (
            has(name, "CompositeImplicitAutograd")
            and not any(has(name, key) for key in (backend, f"Autograd{backend}", "CompositeExplicitAutograd",
                                                   "CompositeExplicitAutogradNonFunctional")))
    return kind


_math_kernels: dict = {}  # (operator overload, backend) -> is_math_kernel


def native_description(func, backend: str) -> tuple:
    """What the native observer (record/native/observer.cpp) needs to know of operator overload
    `func`, from this module's rules: (flags, written per schema argument, index of the `device`
    argument, of the `pin_memory` argument; -1 where it has none). Flags as record/native names them."""
    from ..native import (AUTOCAST, COPY, CUSTOM, HOST_OUTPUT, IGNORED, LAYOUT_ONLY, MATH, NO_ACCESS, READING,
                          SPECIAL, VIEW)
    import torch

    schema = operator_schema(func)
    name = schema.name
    flags = 0
    if schema.view:
        flags |= VIEW
    if is_math_kernel(func, backend):
        flags |= MATH
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), f"Autocast{backend}"):
        flags |= AUTOCAST
    if name in _NO_ACCESS:
        flags |= NO_ACCESS
    if name in _LAYOUT_ONLY:
        flags |= LAYOUT_ONLY
    host_value = bool(_host_value_kind(func))
    if name in _COPIES:
        flags |= COPY | READING
    custom = func.namespace not in _TORCH_NAMESPACES
    if custom:
        flags |= CUSTOM
    if custom or host_value or name in _SPECIAL:
        flags |= SPECIAL  # _record's own rules: custom operators, host reads and waits, record_stream
    if host_value or name == "aten._local_scalar_dense.default":
        flags |= READING
    if name in _METADATA_ONLY:
        flags |= IGNORED
    names = [a.name for a in func._schema.arguments]
    if "pin_memory" in names or name == "aten._pin_memory.default":
        flags |= HOST_OUTPUT
    written = tuple(written for _, _, written in schema.arguments)
    return (flags, written, names.index("device") if "device" in names else -1,
            names.index("pin_memory") if "pin_memory" in names else -1)


# Operators _record handles apart, whatever their tensors (the native observer replays them through it).
_SPECIAL = frozenset({"aten.record_stream.default", "aten._local_scalar_dense.default"})


def make_mode(rec, torch, ops=None, backend: str = "CUDA"):
    """The TorchDispatchMode that records operators for `rec` (built when torch is loaded);
    `backend`: the dispatch key of the device it records (is_math_kernel)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = ops or Ops(rec, torch)
    skip_torch_wrappers(torch)

    class RecordingMode(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # torch.compile then compiles under the recording instead of falling back to eager
            # (Dynamo skips frames while a mode that returns False is on the stack), keeps the mode
            # off while it traces, and on while the compiled code runs: the wrapper's extern calls
            # (extern_kernels.mm, fallback ops) come here, its Triton kernels to torch_inductor.
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if R.current is not rec or is_suppressed() or R.depth():
                return func(*args, **kwargs)
            if is_math_kernel(func, backend):  # with autograd off: the operators its C++ kernel calls, as with it on
                with self:
                    return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
            return ops.call(func, args, kwargs)

    return RecordingMode()


def skip_torch_wrappers(torch) -> None:
    """torch wraps every dispatch mode's __torch_dispatch__ in torch._disable_dynamo
    (TorchDispatchMode.__init_subclass__): torch/_compile.py's `inner` calls torch._dynamo.disable's
    `_fn` (eval_frame.py, which wraps each torch.compile'd function too). Those frames only forward
    a call: a report names the user's line, not `through torch/_dynamo/eval_frame.py`. So do the
    frames through which torch dispatches in Python: an operator's `decompose` (make_mode's), a custom
    operator's autograd and ADInplaceOrView kernels and their `redispatch` (a dispatch mode is called
    from inside them, the native observer where the program called the operator); and the GPU-trace
    registries' `fire_callbacks`, through which torch's C++ calls torch_runtime (and which the native
    observer stands in for while it records: both paths name the same frames)."""
    root = os.path.dirname(torch.__file__)
    T.skip_wrapper_frames(os.path.join(root, "_compile.py"), "inner")
    T.skip_wrapper_frames(os.path.join(root, "_dynamo", "eval_frame.py"), "_fn")
    T.skip_wrapper_frames(os.path.join(root, "_ops.py"), "decompose", "redispatch")
    T.skip_wrapper_frames(os.path.join(root, "_library", "custom_ops.py"), "adinplaceorview_impl")
    T.skip_wrapper_frames(os.path.join(root, "_library", "autograd.py"), "autograd_impl", "forward_no_grad")
    T.skip_wrapper_frames(os.path.join(root, "_utils.py"), "fire_callbacks")


def install(rec, patcher) -> None:
    """Record torch's operators for `rec` through the dispatch mode (the reference), unless the
    native observer records them (torch_native.install, which runs first)."""
    torch = rec.gpu.torch
    if "torch" not in rec.state:  # torch_runtime refused this torch (notice given)
        return
    if "torch_native" in rec.state:
        return
    mode = make_mode(rec, torch)
    mode.__enter__()
    add_context(rec, lambda: make_mode(rec, torch), patcher)  # modes are per thread: running ones too

    def leave():
        try:
            mode.__exit__(None, None, None)
        except Exception:  # left on another thread's stack already: nothing to undo
            pass
    patcher.on_undo(leave)


def _numpy(orig):
    # `pinned.numpy()` shares the tensor's bytes: the host's reads and writes through the array are
    # host accesses of pinned memory (record.host_views), which no dispatch mode sees.
    def numpy(self, *args, **kwargs):
        array = orig(self, *args, **kwargs)
        rec = R.current
        if rec is None or is_suppressed() or R.depth() or "torch" not in rec.state or self.device.type != "cpu" \
                or self.numel() == 0 or not R.inside(self.is_pinned):
            return array
        register(rec, rec.gpu.torch, self, "host")
        return HostView.of(array, rec.host_view_access)
    return forwarding(orig, numpy)


def patches() -> tuple:
    """The numpy view of a pinned tensor, whose accesses the dispatch mode never sees."""
    from .patching import Patch

    return (Patch("torch.Tensor.numpy", _numpy),)


def _cuda_target(torch, kwargs):
    """The CUDA device index an operator's `device=` names (the current device for "cuda"), else None."""
    device = kwargs.get("device")
    if device is None:
        return None
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()
