"""FlashNorm Prop 2: the dual-stream deferred-normalization pipeline.

With the norm's gain folded into the weights (Prop 1, fold.py), RMSNorm + projection is

    out = (x / rms(x)) · W*ᵀ = r ⊙ (x · W*ᵀ),    r = 1 / sqrt(mean(x²) + eps)  (per row)

so the matmul need not wait for the reduction. `DeferredNormProjection` runs it as

    caller ──fork_a──► A: Y = x·W*ᵀ ──join_mm──┐
           └─fork_b──► B: r = 1/RMS(x) ─join_rms─┴─► post-scale: out = Y·r ──join_back──► caller

with every edge an event recorded on its source stream and waited on by its target,
present only if the SyncPlan has it (plan.py). `SyncPlan.correct()` is safe under
any schedule; `SyncPlan.implicit_join()` is the talk's bug (no join_mm): the
post-scale reads Y before stream A has written it, i.e. the previous step's Y.

Buffers Y, r and the outputs are allocated once (max_tokens rows) and reused every
step, as inference engines preallocate them; that is why a stale read returns the
previous step's value rather than garbage, and why the `war` edge exists.

Projections that share one norm (q/k/v, gate/up) share one RMS: the weights are
concatenated into one [sum(out_i), in] matrix, one GEMM per step writes Y, and the
post-scale splits Y's columns into one output buffer per projection.

FlashNorm Prop 3 (cancel.py): projections whose output a later norm re-normalises
(Qwen3 / Gemma 3 q_norm, k_norm) may skip the 1/RMS scale. `unscaled=` names them; the
post-scale hands them Y's columns as stored, and when every projection is unscaled the
RMS reduction is not launched at all.

The same code runs on both backends of the device API: numpy kernels on `sim`
(kernels_cpu.py), CUDA kernels + cuBLAS on `cupy` (kernels_cuda.py). See `Storage`
for how each backend holds bf16.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from streamcheck.device import Buffer, Device, Region, Stream
from streamcheck.core.trace import StreamKind

from . import kernels_cpu
from .plan import EDGES, SyncPlan

DTYPES = ("bfloat16", "float16", "float32")
_ALIASES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}
# Device storage tried, in order, for bf16 on the cupy backend: 16-bit bit patterns.
_CUPY_BF16_STORAGE = ("uint16", "int16", "bfloat16")


def normalize_dtype(dtype) -> str:
    """'bf16' -> 'bfloat16' etc.; ValueError for anything else."""
    key = getattr(dtype, "name", dtype)  # numpy dtypes
    key = str(key).replace("torch.", "")  # torch dtypes
    try:
        return _ALIASES[key]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)} "
                         "(aliases bf16, fp16, fp32)") from None


@dataclass(frozen=True)
class Storage:
    """How one logical dtype is held in device buffers on one backend.

    - float32 / float16: numpy dtypes of the same name, on both backends.
    - bfloat16 on `sim`: emulated. float32 buffers holding values on the bf16 grid;
      the numpy kernels round every read and write (round-to-nearest-even on the
      bits). The sim backend has no 16-bit float type other than float16.
    - bfloat16 on `cupy`: the bf16 bit patterns in a 2-byte integer buffer (uint16,
      or whichever of int16 / bfloat16 the backend accepts); the CUDA kernels convert
      with PTX cvt instructions and the GEMM runs in torch on the same stream.

    `encode` turns host values into what the device buffer holds (for uploads),
    `decode` turns downloaded buffer contents into float32.
    """

    dtype: str  # logical: bfloat16, float16 or float32
    backend: str  # sim or cupy
    alloc_dtype: np.dtype  # what Device.alloc gets

    @property
    def emulated_bf16(self) -> bool:
        return self.dtype == "bfloat16" and self.alloc_dtype == np.float32

    @property
    def bf16_bits(self) -> bool:
        return self.dtype == "bfloat16" and self.alloc_dtype.itemsize == 2

    def encode(self, values) -> np.ndarray:
        values = np.asarray(values)
        if self.bf16_bits:
            return kernels_cpu.bf16_bits(values).view(self.alloc_dtype)
        if self.emulated_bf16:
            return kernels_cpu.round_to_bf16(values)
        return np.ascontiguousarray(values, dtype=self.alloc_dtype)

    def decode(self, stored) -> np.ndarray:
        stored = np.asarray(stored)
        if self.bf16_bits:
            return kernels_cpu.bf16_from_bits(stored)
        return stored.astype(np.float32)


def storage_for(device: Device, dtype) -> Storage:
    """The Storage `device`'s backend uses for `dtype` (see Storage)."""
    dtype = normalize_dtype(dtype)
    backend = device.backend.name
    if backend not in ("sim", "cupy"):
        raise ValueError(f"device backend {backend!r} has no deferred-norm kernels; use Device('sim') or "
                         "Device('cupy')")
    if dtype != "bfloat16":
        return Storage(dtype, backend, device.backend.dtype(dtype))
    if backend == "sim":
        return Storage(dtype, backend, device.backend.dtype("float32"))
    for candidate in _CUPY_BF16_STORAGE:
        try:
            alloc = device.backend.dtype(candidate)
        except TypeError:
            continue
        if alloc.itemsize == 2:
            return Storage(dtype, backend, alloc)
    raise ValueError("dtype 'bfloat16' on the cupy backend needs a 2-byte buffer dtype; the backend accepts none of "
                     f"{', '.join(_CUPY_BF16_STORAGE)}. Use float16 or float32, or add uint16 to the backend's dtypes")


def _host_weight(w, index: int, what: str) -> np.ndarray:
    """A weight as a float32 numpy matrix, refusing what is probably a mistake."""
    if hasattr(w, "detach") and hasattr(w, "is_contiguous"):  # a torch tensor (torch is not imported here)
        if not w.is_contiguous():
            raise ValueError(f"{what}: weights[{index}] is not contiguous (a transposed view?); pass the [out, in] "
                             "matrix as nn.Linear.weight stores it, or call .contiguous()")
        w = w.detach().cpu().float().numpy()
    elif not isinstance(w, np.ndarray):
        w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{what}: weights[{index}] has shape {w.shape}; each weight must be a 2-D [out, in] matrix")
    if w.dtype.kind != "f":
        raise ValueError(f"{what}: weights[{index}] has dtype {w.dtype}; pass floating-point weights")
    if not w.flags.c_contiguous:
        raise ValueError(f"{what}: weights[{index}] is not C-contiguous (a transposed view?); pass the [out, in] "
                         "matrix as nn.Linear.weight stores it, or np.ascontiguousarray it")
    if 0 in w.shape:
        raise ValueError(f"{what}: weights[{index}] has shape {w.shape}; out and in must both be at least 1")
    return w


def _check_unscaled(unscaled, count: int, what: str) -> tuple:
    """`unscaled` as a sorted tuple of distinct indices in [0, count), or a ValueError naming it."""
    if isinstance(unscaled, (str, bytes)) or not isinstance(unscaled, (list, tuple, range, set, frozenset)):
        raise ValueError(f"{what}: unscaled must be a list or tuple of projection indices (into weights), got "
                         f"{unscaled!r}")
    seen = []
    for value in unscaled:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{what}: unscaled holds {value!r}; it takes indices into weights (ints), e.g. "
                             "unscaled=(0, 1) for q and k of [q, k, v]")
        if not 0 <= value < count:
            raise ValueError(f"{what}: unscaled index {value} is out of range: weights has {count} projection"
                             f"{'s' if count != 1 else ''} (indices 0..{count - 1})")
        if int(value) in seen:
            raise ValueError(f"{what}: unscaled names projection {int(value)} twice; list each index once")
        seen.append(int(value))
    return tuple(sorted(seen))


class DeferredNormProjection:
    """RMSNorm (gain folded into `weights`) + one or more projections, dual-stream.

    DeferredNormProjection(device, weights, eps=1e-6, plan=SyncPlan.correct(), dtype="float32",
                           max_tokens=64, name="norm_proj", unscaled=())

    - weights: list of folded [out_i, in] matrices (numpy or torch), cast to `dtype`.
    - plan: which edges to issue, where post-scale runs, stream kinds (plan.py).
    - max_tokens: rows of the persistent Y / r / output buffers; a step takes 1..max_tokens rows.
    - unscaled: indices into `weights` of projections whose outputs skip the 1/RMS scale
      (FlashNorm Prop 3: a later norm re-normalises them, cancel.cancellable_projections
      says which). Their outputs are Y's columns as stored, bit for bit: the post-scale
      gives them a persistent buffer of ones as their scale (`module.ones`), so the CUDA
      path reuses its one post-scale kernel and the checker still sees the post-scale
      read Y. If *every* projection is unscaled (full cancellation), the RMS kernel is not
      launched at all: saving that reduction, and stream B's share of every step, is the
      point of Prop 3. Stream B then carries only the plan's events (fork_b, join_rms,
      war), so the plan's edges and the races a missing one causes stay as they are.

    `module(x, caller)` issues one step for the M rows of `x` (a device Region/Buffer
    [M, in] of `module.storage.alloc_dtype`, e.g. from `module.alloc_input`) from the
    caller's stream and returns one Region per projection: rows [0, M) of the
    persistent output buffers, valid once the caller's stream reaches this point.
    """

    def __init__(self, device: Device, weights: Sequence, eps: float = 1e-6, plan: Optional[SyncPlan] = None,
                 dtype: str = "float32", max_tokens: int = 64, name: str = "norm_proj", unscaled: Sequence = ()):
        what = f"DeferredNormProjection({name!r})"
        if not isinstance(device, Device):
            raise ValueError(f"{what}: device must be a streamcheck Device, got {type(device).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"DeferredNormProjection: name must be a non-empty string, got {name!r}")
        plan = SyncPlan.correct() if plan is None else plan
        if not isinstance(plan, SyncPlan):
            raise ValueError(f"{what}: plan must be a SyncPlan (e.g. SyncPlan.correct()), got {type(plan).__name__}")
        if isinstance(weights, np.ndarray) or hasattr(weights, "detach") or not isinstance(weights, (list, tuple)):
            raise ValueError(f"{what}: weights must be a list of [out, in] matrices (one per projection that shares "
                             "this norm); wrap a single matrix in a list")
        if not weights:
            raise ValueError(f"{what}: weights is empty; pass at least one [out, in] matrix")
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not np.isfinite(eps) or eps < 0:
            raise ValueError(f"{what}: eps must be a finite number >= 0 (the model config's rms_norm_eps), got {eps!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
            raise ValueError(f"{what}: max_tokens must be an integer >= 1 (the most rows one step takes), "
                             f"got {max_tokens!r}")
        host = [_host_weight(w, i, what) for i, w in enumerate(weights)]
        ins = {w.shape[1] for w in host}
        if len(ins) != 1:
            shapes = ", ".join(f"weights[{i}]: {w.shape}" for i, w in enumerate(host))
            raise ValueError(f"{what}: the weights disagree on the input size ({shapes}); projections sharing one "
                             "norm all take the norm's hidden size as `in`")

        unscaled = _check_unscaled(unscaled, len(host), what)

        self.device = device
        self.name = name
        self.unscaled = unscaled  # sorted tuple of indices into weights / outputs
        self.plan = plan
        self.eps = float(eps)
        self.max_tokens = int(max_tokens)
        self.dtype = normalize_dtype(dtype)
        self.storage = storage_for(device, self.dtype)
        self.in_features = ins.pop()
        self.out_features = tuple(w.shape[0] for w in host)
        offsets = np.cumsum((0,) + self.out_features)
        self.columns = tuple((int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:]))

        side = plan.side_kind
        self.stream_a = device.stream(f"{name}.A", kind=side)
        self.stream_b = device.stream(f"{name}.B", kind=side)
        # In EDGES order, not the frozenset's (string hashing varies per process): same trace every run.
        self._events = {edge: device.event(f"{name}.{edge}") for edge in EDGES if edge in plan.edges}
        self._war_stream: Optional[Stream] = None  # where `war` was last recorded (None: never)

        alloc = self.storage.alloc_dtype
        self.weight = device.alloc((offsets[-1], self.in_features), alloc, name=f"{name}.W")
        self.y = device.alloc((self.max_tokens, offsets[-1]), alloc, name=f"{name}.Y")
        self.r = device.alloc((self.max_tokens,), "float32", name=f"{name}.r")
        self.outputs = [device.alloc((self.max_tokens, n), alloc, name=f"{name}.out{i}")
                        for i, n in enumerate(self.out_features)]
        # The scale of unscaled outputs. Filled at allocation (synchronously, before any stream
        # can touch it) and never written again, so it needs no edge.
        self.ones = (device.alloc((self.max_tokens,), "float32", name=f"{name}.ones", fill=1.0)
                     if unscaled else None)
        # Kept alive: the upload is asynchronous and reads this host array when it runs.
        self._host_weight = self.storage.encode(np.concatenate(host, axis=0).astype(np.float32))
        device.upload(self.weight, self._host_weight, stream=self.stream_a)  # stream order: before every matmul

        self._matmul, self._rms, self._postscale = self._kernels()

    # --- kernels --------------------------------------------------------------------------
    def _kernels(self):
        if self.storage.backend == "sim":
            kernels, kw = kernels_cpu, {"bf16": self.storage.emulated_bf16}
        else:
            from . import kernels_cuda  # cupy is imported only when a cupy device is used

            kernels, kw = kernels_cuda, {"dtype": self.dtype}
        if self.unscaled:
            post = functools.partial(kernels.postscale_mixed, columns=self.columns, unscaled=self.unscaled, **kw)
        else:
            post = functools.partial(kernels.postscale, columns=self.columns, **kw)
        return (functools.partial(kernels.matmul, **kw), functools.partial(kernels.rms, eps=self.eps, **kw), post)

    @property
    def computes_rms(self) -> bool:
        """False under full cancellation (every output unscaled): no step launches the RMS."""
        return len(self.unscaled) < len(self.out_features)

    # --- helpers for callers --------------------------------------------------------------
    def alloc_input(self, rows: Optional[int] = None, name: str = "") -> Buffer:
        """A device buffer [rows, in] (default max_tokens rows) in this module's storage dtype."""
        rows = self.max_tokens if rows is None else rows
        return self.device.alloc((rows, self.in_features), self.storage.alloc_dtype, name=name or f"{self.name}.x")

    def encode(self, values) -> np.ndarray:
        """Host values -> what an input buffer holds (upload this)."""
        return self.storage.encode(values)

    def decode(self, stored) -> np.ndarray:
        """Downloaded buffer contents -> float32 values."""
        return self.storage.decode(stored)

    def read(self, outputs: Sequence[Region], stream: Stream) -> list:
        """Synchronize `stream`, then read and decode `outputs` (as CuPy's .get() does)."""
        stream.synchronize()
        return [self.decode(self.device.host_read(out)) for out in outputs]

    def forget_previous_step(self) -> None:
        """Issue no `war` wait in the next step. Only right once the previous step's
        post-scale has completed (a device or caller synchronize). Needed around a CUDA
        graph capture: inside one, waiting on an event recorded outside it crosses the
        capture boundary (cudaErrorStreamCaptureIsolation), and after one, waiting on an
        event last recorded inside it is refused (cudaErrorInvalidValue, measured on an H200)."""
        self._war_stream = None

    # --- one step -------------------------------------------------------------------------
    def _check_input(self, x, what: str) -> Region:
        if isinstance(x, Buffer):
            x = x.region()
        if not isinstance(x, Region):
            raise ValueError(f"{what}: x must be a device Region or Buffer [M, {self.in_features}] (e.g. from "
                             f"module.alloc_input), got {type(x).__name__}; upload host data first")
        buf = x.buffer
        if buf.device is not self.device:
            raise ValueError(f"{what}: x (`{buf.name}`) belongs to another Device; allocate it on this module's device")
        if buf.freed:
            raise ValueError(f"{what}: x (`{buf.name}`) was freed; allocate a new input buffer")
        if len(buf.shape) != 2 or buf.shape[1] != self.in_features:
            raise ValueError(f"{what}: x (`{buf.name}`) has shape {buf.shape}; expected [M, {self.in_features}] "
                             f"(the weights' input size)")
        if buf.dtype != self.storage.alloc_dtype:
            raise ValueError(f"{what}: x (`{buf.name}`) has dtype {buf.dtype}; this module computes in {self.dtype}, "
                             f"stored as {self.storage.alloc_dtype} on {self.storage.backend}: allocate x with "
                             "module.alloc_input() and upload module.encode(values)")
        storage = buf.storage
        flags = getattr(storage, "flags", None)
        if flags is not None and not flags.c_contiguous:
            raise ValueError(f"{what}: x (`{buf.name}`) is not C-contiguous; kernels read rows of {self.in_features} "
                             "consecutive elements. Copy it into a buffer from module.alloc_input()")
        rows = x.stop - x.start
        if rows == 0:
            raise ValueError(f"{what}: x (`{x!r}`) has no rows (M = 0); skip the call when there are no tokens")
        if rows > self.max_tokens:
            raise ValueError(f"{what}: x (`{x!r}`) has M = {rows} rows but max_tokens = {self.max_tokens}; split the "
                             f"step into chunks of at most {self.max_tokens} rows or build the module with a larger "
                             "max_tokens")
        return x

    def _check_caller(self, caller, what: str) -> Stream:
        want = self.plan.caller_kind
        if caller is None:
            if want != "legacy":
                raise ValueError(f"{what}: the plan runs from a {want} caller stream; pass caller=<that stream>")
            return self.device.legacy
        if not isinstance(caller, Stream) or caller.device is not self.device:
            raise ValueError(f"{what}: caller must be a stream of this module's device, got {caller!r}")
        if caller is self.stream_a or caller is self.stream_b:
            raise ValueError(f"{what}: caller {caller.name!r} is one of the module's own side streams; call from "
                             "another stream")
        if caller.kind is not StreamKind.parse(want):
            hint = "device.legacy" if want == "legacy" else f"a stream created with kind={want!r}"
            raise ValueError(f"{what}: the plan's caller_kind is {want!r} but caller {caller.name!r} is "
                             f"{caller.kind.value}; pass {hint} or build the plan with caller_kind="
                             f"{caller.kind.value!r}")
        return caller

    def _edge(self, edge: str, src: Stream, dst: Stream) -> None:
        # An edge inside one stream is already given by stream order.
        if edge in self.plan.edges and src is not dst:
            event = self._events[edge]
            event.record(src)
            dst.wait_event(event)

    def __call__(self, x, caller: Optional[Stream] = None) -> list:
        what = f"DeferredNormProjection({self.name!r})"
        x = self._check_input(x, what)
        caller = self._check_caller(caller, what)
        plan, dev = self.plan, self.device
        a, b = self.stream_a, self.stream_b
        post = {"caller": caller, "A": a, "B": b}[plan.post_stream]
        m = x.stop - x.start
        y, r = self.y[:m], self.r[:m]
        outs = [o[:m] for o in self.outputs]

        # war: this step's writes to the persistent Y and r wait until the previous
        # post-scale has read them (skipped on the first step: nothing recorded yet).
        if "war" in plan.edges and self._war_stream is not None:
            for side in (a, b):
                if side is not self._war_stream:
                    side.wait_event(self._events["war"])
        self._edge("fork_a", caller, a)
        self._edge("fork_b", caller, b)
        dev.launch(self._matmul, (x, self.weight, y), stream=a, reads=[x, self.weight], writes=[y], name="matmul")
        if self.computes_rms:
            dev.launch(self._rms, (x, r), stream=b, reads=[x], writes=[r], name="rms")
        self._edge("join_mm", a, post)
        self._edge("join_rms", b, post)
        if not self.unscaled:
            dev.launch(self._postscale, (y, r, *outs), stream=post, reads=[y, r], writes=outs, name="postscale")
        elif self.computes_rms:
            ones = self.ones[:m]
            dev.launch(self._postscale, (y, r, ones, *outs), stream=post, reads=[y, r, ones], writes=outs,
                       name="postscale")
        else:  # full cancellation: r was never computed, and is neither passed nor read
            ones = self.ones[:m]
            dev.launch(self._postscale, (y, None, ones, *outs), stream=post, reads=[y, ones], writes=outs,
                       name="postscale")
        self._edge("join_back", post, caller)
        if "war" in plan.edges:
            self._events["war"].record(post)
            self._war_stream = post
        return outs

    def __repr__(self) -> str:
        unscaled = f", unscaled={list(self.unscaled)}" if self.unscaled else ""
        return (f"DeferredNormProjection({self.name!r}, in={self.in_features}, out={list(self.out_features)}, "
                f"{self.dtype} on {self.storage.backend}, max_tokens={self.max_tokens}{unscaled}, "
                f"{self.plan.describe()})")


def reference_norm_proj(x, weights: Sequence, eps: float) -> list:
    """RMSNorm without gain + projections, in float64 numpy: [(x / rms(x)) · W_iᵀ for W_i in weights].
    `weights` are the folded [out, in] matrices; torch tensors are accepted."""
    x64 = np.asarray(x, dtype=np.float64)
    if x64.ndim != 2:
        raise ValueError(f"reference_norm_proj: x has shape {x64.shape}; pass [M, in]")
    mats = []
    for i, w in enumerate(weights):
        if hasattr(w, "detach"):
            w = w.detach().cpu().double().numpy()
        w = np.asarray(w, dtype=np.float64)
        if w.ndim != 2 or w.shape[1] != x64.shape[1]:
            raise ValueError(f"reference_norm_proj: weights[{i}] has shape {w.shape}; expected [out, {x64.shape[1]}]")
        mats.append(w)
    r = 1.0 / np.sqrt(np.mean(x64 * x64, axis=1) + eps)
    normed = x64 * r[:, None]
    return [normed @ w.T for w in mats]
