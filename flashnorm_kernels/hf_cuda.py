"""FlashNorm on a real torch CUDA model: `hf.attach(model, "cuda", plan)` (this module's groups),
greedy decoding, and the decode step as one CUDA graph.

Each norm → projection group of the model (fold.norm_groups) becomes a `CudaNormProjection`
working on the model's own CUDA tensors, in the model's dtype (bf16, fp16, fp32):

    torch's current stream ──fork_a──► A: Y = x·W*ᵀ (torch.mm, cuBLAS) ──join_mm──┐
                           └─fork_b──► B: r = 1/RMS(x) (the RMS kernel) ─join_rms─┴─► post-scale ──join_back──► caller

W* = W·g is folded once at attach (fp64, cast to the model's dtype); the model's parameters are
not touched. The plan (plan.SyncPlan) decides which edges exist, exactly as
pipeline.DeferredNormProjection does; SyncPlan.implicit_join() is the talk's bug. The caller is
whatever stream torch issues on (the default stream, a user stream, a graph-capture stream), so
torch's later ops (attention) are ordered after the post-scale by join_back. plan.caller_kind
is not used here: the caller's kind is the kind of torch's current stream.

Kernel paths (attach(..., kernels=)): the RMS and the post-scale are either
- "cupy": the CUDA C kernels of kernels_cuda (cuda/deferred_norm.cu) through CuPy, streams A
  and B CuPy streams (blocking or not, as plan.side_kind says) seen by torch as
  torch.cuda.ExternalStream; hold_matmul spins with streamcheck's SpinDelay;
- "torch": torch operators (square, mean, add_, sqrt_, reciprocal_ into r; one mul per
  output), streams A and B torch.cuda.Stream() from torch's pool; hold_matmul is
  torch.cuda._sleep on A. No CuPy, so it also runs on streamcheck's emulated CUDA device (the
  sim, on the CPU). Same numerics as far as torch allows: fp32 accumulation, one rounding
  into the model's dtype; the reduction order (so r's last bit) may differ. torch's pool
  streams are all non-blocking, so a plan with side_kind="blocking" is refused
  (check_torch_plan), never run on non-blocking streams;
- "auto" (the default): CuPy where `import cupy` succeeds, else torch.
Both paths issue the same matmul, events and waits, in the same order, for every plan.

Buffers and copies. Y [rows, Σ out] and r [rows] are allocated once and reused every step, as
inference engines preallocate them (so a post-scale that reads Y too early reads the previous
step's projection, the one-step lag); the `war` edge keeps the next step's matmul from
overwriting Y while this step's post-scale still reads it. The post-scale writes each output
into a fresh torch tensor allocated on the caller's stream: no device copy at all, and nothing
handed to torch is ever overwritten by a later step (transformers' caches may keep v_proj's
output itself, not a copy). On the CuPy path activations cross to CuPy as views of the same
bytes (kernels_cuda.cupy_view); nothing goes through host memory.

Prefill. A step of M >= `prefill_rows` rows (default PREFILL_ROWS = 256) does not take the
dual-stream path: the post-scale pass over the n-wide output costs more than the overlap saves.
On the H200 (bf16, d = 4096, n = 12288; docs/benchmarks.md, paths sampled in shuffled order) the
dual-stream path wins up to M = 256 (46.4 vs 49.4 µs for the pre-scaled kernels), ties at 512
and loses from 1024 on (180.8 vs 165.6; 671 vs 631 µs at 4096 rows). The default switches at 256,
not 512, because the dual-stream buffers Y and r hold prefill_rows - 1 rows per group (512 doubles
them); pass prefill_rows=512 to trade that memory for about 10 % at M = 256-511. It runs the pre-scaled
path on torch's current stream, F.rms_norm(x, None, eps) then F.linear with W* (the `folded`
baseline of benchmarks/bench_norm_proj.py). Every step, prefill or decode, takes at most
`max_tokens` rows (batch × tokens of that step), else a ValueError names max_tokens.

Inference only (the matmul writes Y through `out=`): run under torch.no_grad() or
torch.inference_mode(). CuPy is imported when a CuPy group is built, never at import.

torch.compile. Dynamo cannot trace a step (CuPy kernels, events, the held input), so while it
compiles (torch.compiler.is_compiling()) each projection is the custom operator
`flashnorm::norm_projection(hidden, group, index)`: one node of the graph whose implementation
is the group's step (`outputs(hidden)[index]`, so q/k/v still share one), the group found by
an int id in a registry that forgets it at close() (detach). Its schema writes no argument
(Y and r are the group's own, the output is fresh); its fake gives the output's shape, dtype
and device. A compiled model thus keeps every group in its graph (`fullgraph=True` works)
and runs the same kernels as in eager; eager calls the group directly (no dispatcher on the
decode path). A recording (`streamcheck run`) sees a custom operator as one opaque call, so
the step then declares its kernels on streams A, B and the post-scale's stream
(streamcheck.declare_access), between the events it records: the compiled model is checked
as the eager one, the talk's missing join included.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import weakref
from dataclasses import dataclass
from itertools import accumulate, count
from typing import Optional

import torch
import torch.nn.functional as F

from streamcheck.core.schedule import check_strike_pattern, strikes
from streamcheck.record.gpu import MAX_DELAY_US, SpinDelay

from .fold import FlashNormError, norm_gain
from .groups import RoutedProjection, StepPerInput
from .plan import EDGES, SyncPlan

PREFILL_ROWS = 256  # rows from which a step takes the pre-scaled single-stream path (module docstring: why 256)
KERNEL_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
KERNEL_PATHS = ("auto", "cupy", "torch")  # attach(kernels=): module docstring, "Kernel paths"
_FOLD_ROWS = 8192  # rows folded at a time: bounds the fp64 temporary of a vocab × hidden lm_head


class GraphCaptureError(RuntimeError):
    """CUDA refused to capture the decode step; the message names the plan's missing join."""


def import_cupy():
    """CuPy, or an ImportError that says how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError("flashnorm attach(model, 'cuda'): the CUDA path launches its kernels through CuPy, "
                          "which is not installed here: pip install 'streamcheck[gpu]'") from exc
    return cupy


def kernel_path(kernels: str) -> str:
    """"cupy" or "torch": which kernels run the RMS and the post-scale (module docstring,
    "Kernel paths"). "auto" is CuPy where it imports, else torch's operators. Only "cupy"
    imports CuPy (or says how to install it)."""
    if kernels not in KERNEL_PATHS:
        raise ValueError(f"flashnorm attach(model, 'cuda'): kernels must be one of "
                         f"{', '.join(repr(k) for k in KERNEL_PATHS)}, got {kernels!r}")
    if kernels == "cupy":
        import_cupy()
        return "cupy"
    if kernels == "torch":
        return "torch"
    try:
        import cupy  # noqa: F401
    except ImportError:  # not installed, or refused (streamcheck's emulated CUDA device)
        return "torch"
    return "cupy"


def check_torch_plan(plan: SyncPlan, requested: str = "torch") -> None:
    """Refuse a plan the torch kernel path cannot run as written (never a silently different
    one). `requested`: the kernels= the caller passed ("auto" that took the torch path)."""
    if plan.side_kind == "blocking":
        # torch.cuda.Stream() takes its streams from a pool created cudaStreamNonBlocking and
        # has no flag for a blocking one: the legacy stream's implicit joins cannot be had.
        took = " took the torch path (CuPy does not import here) and" if requested == "auto" else ""
        raise FlashNormError(f"flashnorm attach(model, 'cuda', kernels={requested!r}){took}: the plan has blocking "
                             "side streams (side_kind='blocking'), which torch cannot make (torch.cuda.Stream() "
                             "streams are non-blocking); use kernels='cupy' (on a GPU with CuPy) or "
                             "side_kind='non_blocking'")


def sleep_cycles(us: float, device) -> int:
    """torch.cuda._sleep's cycles for `us` µs at the device's rated SM clock (kHz), at least
    `us` µs of spinning (an unknown clock is taken as 2 GHz, as SpinDelay does)."""
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or 2_000_000
    return max(1, int(us * khz / 1000))


def compute_dtype(linears, requested=None) -> torch.dtype:
    """The dtype the groups compute in: their projections' (all alike, one the kernels have)."""
    dtypes = {lin.weight.dtype for lin in linears}
    if len(dtypes) != 1:
        raise FlashNormError(f"flashnorm attach(model, 'cuda'): the projections mix dtypes "
                             f"({', '.join(sorted(str(d) for d in dtypes))}); cast the model to one of bfloat16, "
                             "float16, float32 first")
    dtype = dtypes.pop()
    if dtype not in KERNEL_DTYPES:
        raise FlashNormError(f"flashnorm attach(model, 'cuda'): the model is {dtype}, which the CUDA kernels do not "
                             "support; use bfloat16, float16 or float32, e.g. model.to(torch.bfloat16)")
    if requested is not None and str(requested).replace("torch.", "") not in (str(dtype).replace("torch.", ""),
                                                                              KERNEL_DTYPES[dtype]):
        raise FlashNormError(f"flashnorm attach(model, 'cuda'): dtype={requested!r} but the model is {dtype}; the "
                             "CUDA path computes in the model's dtype: cast the model, or leave dtype out")
    return dtype


def cuda_device(model, devices) -> torch.device:
    """The one CUDA device all of the model's parameters are on (and `devices` names)."""
    wanted = torch.device(devices)
    found = {p.device for p in model.parameters()}
    off = sorted(str(d) for d in found if d.type != "cuda")
    if off:
        raise FlashNormError(f"flashnorm attach(model, {str(devices)!r}): the model's parameters are on "
                             f"{', '.join(off)}, not CUDA; move it first (model.to('cuda')), or attach to a "
                             "streamcheck Device to run the norm → projection groups on the device API")
    if len(found) != 1:
        raise FlashNormError(f"flashnorm attach(model, 'cuda'): the model's parameters are spread over "
                             f"{', '.join(sorted(str(d) for d in found))}; the CUDA path needs them on one GPU")
    device = found.pop()
    if wanted.index is not None and wanted.index != device.index:
        raise FlashNormError(f"flashnorm attach(model, {str(devices)!r}): the model is on {device}; pass "
                             f"{str(device)!r}")
    return device


@dataclass(frozen=True)
class MatmulHold:
    """A bounded spin (SpinDelay, or torch.cuda._sleep on the torch path) on stream A before the
    matmul of the `after`-th step and every `every`-th after it (the one strike rule,
    core.schedule.strikes)."""

    us: float
    after: int = 0
    every: int = 1


class CudaNormProjection(StepPerInput):
    """One norm and the projections it feeds, run on the model's CUDA tensors (see the module
    docstring). `outputs(hidden)` runs one step per new input (q/k/v, gate/up are called one
    after another on the same tensor: one step serves all)."""

    def __init__(self, name: str, norm, linears, gain_style: str, *, eps: float, plan: SyncPlan, max_tokens: int,
                 prefill_rows: int = PREFILL_ROWS, kernels: str = "cupy"):
        if kernels not in ("cupy", "torch"):
            raise ValueError(f"CudaNormProjection: kernels must be 'cupy' or 'torch' (attach resolves 'auto'), got "
                             f"{kernels!r}")
        if kernels == "torch":
            check_torch_plan(plan)
        self.kernels = kernels
        self.name = name
        self.plan = plan
        self.eps = float(eps)
        self.max_tokens = int(max_tokens)
        self.prefill_rows = int(prefill_rows)
        first = linears[0].weight
        self.device, self.dtype = first.device, first.dtype
        self.kernel_dtype = KERNEL_DTYPES[self.dtype]
        self.in_features = first.shape[1]
        self.out_features = tuple(lin.weight.shape[0] for lin in linears)
        stops = list(accumulate(self.out_features))
        self.columns = tuple(zip([0] + stops[:-1], stops))
        self.biases = [lin.bias.detach() if lin.bias is not None else None for lin in linears]
        with torch.no_grad():  # W* = W·g, as flashify folds it, without touching the model
            gain = norm_gain(norm, gain_style).to(self.device, torch.float64)
            self.weight = torch.empty((stops[-1], self.in_features), dtype=self.dtype, device=self.device)
            for (start, _), lin in zip(self.columns, linears):
                w = lin.weight.detach()
                for lo in range(0, w.shape[0], _FOLD_ROWS):
                    rows = w[lo:lo + _FOLD_ROWS]
                    self.weight[start + lo:start + lo + rows.shape[0]].copy_((rows.double() * gain).to(self.dtype))
        # The dual-stream path takes fewer than prefill_rows rows (and at most max_tokens).
        self.rows = max(0, min(self.max_tokens, self.prefill_rows - 1))
        self.y = torch.empty((self.rows, stops[-1]), dtype=self.dtype, device=self.device)
        self.r = torch.empty((self.rows,), dtype=torch.float32, device=self.device)
        if kernels == "cupy":
            cupy = import_cupy()
            from . import kernels_cuda

            self._kernels = kernels_cuda
            self._y = kernels_cuda.cupy_view(self.y) if self.rows else None  # CuPy views of the same bytes
            self._r = kernels_cuda.cupy_view(self.r) if self.rows else None
            self._cupy_device = cupy.cuda.Device(self.device.index)
            with self._cupy_device:
                non_blocking = plan.side_kind == "non_blocking"
                self._side = {"A": cupy.cuda.Stream(non_blocking=non_blocking),
                              "B": cupy.cuda.Stream(non_blocking=non_blocking)}
            self.stream_a = torch.cuda.ExternalStream(self._side["A"].ptr, device=self.device)
            self.stream_b = torch.cuda.ExternalStream(self._side["B"].ptr, device=self.device)
        else:
            # torch's own (non-blocking) pool streams, A created first.
            self._kernels = self._y = self._r = self._side = None
            self._cupy_device = contextlib.nullcontext()
            self.stream_a = torch.cuda.Stream(self.device)
            self.stream_b = torch.cuda.Stream(self.device)
        # In EDGES order, as the pipeline: the same events, recorded and waited in the same order.
        self._events = {edge: torch.cuda.Event() for edge in EDGES if plan.has(edge)}
        self._war_stream: Optional[int] = None  # handle of the stream `war` was last recorded on
        self.steps = 0  # forwards run: step 0 is the prompt's
        self.hold: Optional[MatmulHold] = None
        self.declare = None  # streamcheck.declare_access while a recording cannot see inside the step
        self.op_id = register_group(self)  # flashnorm::norm_projection's `group` argument

    @property
    def module(self) -> "CudaNormProjection":
        return self  # Attachment.modules lists what runs each group

    # --- controls -------------------------------------------------------------------------
    def hold_matmul(self, us: float, *, after: int = 0, every: int = 1) -> None:
        """Spin `us` µs (bounded by streamcheck.record.gpu.MAX_DELAY_US) on stream A before the matmul of
        step `after` and every `every`-th step after it, so that a post-scale that does not wait
        for the matmul reads the previous step's Y. `us=0` removes the hold. The CuPy path
        spins with streamcheck's SpinDelay, the torch path with torch.cuda._sleep (cycles at
        the rated clock: at least `us` µs; streamcheck's emulated device holds A for host steps
        instead, one per million cycles, at least one)."""
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not 0 <= us <= MAX_DELAY_US:
            raise ValueError(f"hold_matmul: us must be in [0, {MAX_DELAY_US}] µs (the spin kernel's cap), got {us!r}")
        after, every = check_strike_pattern(after, every)
        self.hold = MatmulHold(float(us), after, every) if us else None
        if us and self.kernels == "cupy":
            SpinDelay.get()  # NVRTC and the module load now, not inside the step it strikes

    def forget_previous_step(self) -> None:
        """Issue no `war` wait in the next step. Only right once the previous step's post-scale
        has completed (a synchronize). Needed around a CUDA graph capture: inside one, waiting on
        an event recorded outside it is refused (cudaErrorStreamCaptureIsolation), and after one,
        waiting on an event last recorded inside it is refused (cudaErrorInvalidValue)."""
        self._war_stream = None

    def close(self) -> None:
        """Release the buffers and streams once no work on them can be in flight."""
        torch.cuda.synchronize(self.device)
        release_group(self.op_id)
        self._outputs = self._last_hidden = None
        self.y = self.r = self._y = self._r = None

    def compiled_output(self, hidden: torch.Tensor, index: int) -> torch.Tensor:
        """Projection `index` as torch.compile traces it: the custom operator, one graph node."""
        return torch.ops.flashnorm.norm_projection(hidden, self.op_id, index)

    # --- one step (StepPerInput.outputs calls it once per new input) --------------------------
    def _step(self, hidden: torch.Tensor) -> list:
        what = f"flashnorm attach: {self.name}"
        if hidden.device != self.device or hidden.dtype != self.dtype:
            raise ValueError(f"{what} computes in {self.dtype} on {self.device} (the model's weights) but got a "
                             f"{hidden.dtype} input on {hidden.device} (autocast?); run the model in its own dtype")
        if hidden.requires_grad:
            raise RuntimeError(f"{what}: the CUDA path is for inference (its matmul writes a persistent buffer); "
                               "run the model under torch.no_grad() or torch.inference_mode()")
        x = hidden.reshape(-1, self.in_features)
        if not x.is_contiguous():
            x = x.contiguous()  # the kernels read rows of in_features consecutive elements
        m = x.shape[0]
        if m > self.max_tokens:
            raise ValueError(f"{what} got {m} rows (batch × tokens of one step) but max_tokens={self.max_tokens}; "
                             f"pass max_tokens >= {m} to attach()")
        if m == 0:
            outs = [x.new_empty((0, n)) for n in self.out_features]
        elif m >= self.prefill_rows:
            outs = self._prescaled(x)
        else:
            outs = self._deferred(x, m)
        self.steps += 1
        return [out.view(*hidden.shape[:-1], out.shape[-1]) for out in outs]

    def _prescaled(self, x) -> list:
        # Prefill: one stream, no post-scale pass (the norm's gain is folded into W*).
        h = F.rms_norm(x, (self.in_features,), None, self.eps)
        return [F.linear(h, self.weight[start:stop], bias) for (start, stop), bias in zip(self.columns, self.biases)]

    def _edge(self, edge: str, src, dst) -> None:
        # Each edge is an event recorded on its source and waited on by its target; an edge
        # inside one stream is already given by stream order.
        event = self._events.get(edge)
        if event is not None and src.cuda_stream != dst.cuda_stream:
            event.record(src)
            dst.wait_event(event)

    def _deferred(self, x, m: int) -> list:
        kernel_dtype = self.kernel_dtype
        caller = torch.cuda.current_stream(self.device)
        a, b = self.stream_a, self.stream_b
        where = self.plan.post_stream
        post = {"caller": caller, "A": a, "B": b}[where]
        declare = self.declare
        # Fresh outputs, allocated on the caller's stream (the caching allocator ties them to it).
        outs = [torch.empty((m, n), dtype=self.dtype, device=self.device) for n in self.out_features]

        # war: this step's writes to the persistent Y and r wait until the previous post-scale
        # has read them (skipped on the first step: nothing recorded yet).
        war = self._events.get("war")
        if war is not None and self._war_stream is not None:
            for side in (a, b):
                if side.cuda_stream != self._war_stream:
                    side.wait_event(war)
        self._edge("fork_a", caller, a)
        self._edge("fork_b", caller, b)
        with self._cupy_device:
            if self.hold is not None and strikes(self.steps, self.hold.after, self.hold.every):
                self._hold_a(a)  # before the matmul, on A
            with torch.cuda.stream(a):
                torch.mm(x, self.weight.t(), out=self.y[:m])
            if declare:  # named as the recorder names them in eager
                declare(reads=(x, self.weight), writes=(self.y[:m],), stream=a, name="aten.mm.out")
            self._rms(x, m, b)
            if declare:
                declare(reads=(x,), writes=(self.r[:m],), stream=b, name=f"rms_{kernel_dtype}")
            self._edge("join_mm", a, post)
            self._edge("join_rms", b, post)
            self._postscale(m, outs, post)
            if declare:
                declare(reads=(self.y[:m], self.r[:m]), writes=outs, stream=post, name=f"postscale_{kernel_dtype}")
        self._edge("join_back", post, caller)
        if war is not None:
            war.record(post)
            self._war_stream = post.cuda_stream
        for out, bias in zip(outs, self.biases):
            if bias is not None:
                out.add_(bias)  # W·(x/rms) + b: the bias is outside the deferred scale
        return outs

    # --- the kernels of one path (self.kernels) -----------------------------------------------
    def _hold_a(self, a) -> None:
        if self.kernels == "cupy":
            SpinDelay.get().enqueue(self._side["A"], self.hold.us)
        else:
            with torch.cuda.stream(a):
                torch.cuda._sleep(sleep_cycles(self.hold.us, self.device))

    def _rms(self, x, m: int, b) -> None:
        """r[:m] = 1/RMS(x) on stream B."""
        if self.kernels == "cupy":
            kernels = self._kernels
            with self._side["B"]:
                kernels.rms(kernels.cupy_view(x), self._r[:m], eps=self.eps, dtype=self.kernel_dtype)
            return
        r = self.r[:m]
        with torch.cuda.stream(b):  # its temporaries come from B's pool and die there: no cross-stream reuse
            # As rms_<t>: the squares summed in fp32, eps inside the sqrt, an IEEE sqrt and a
            # division (not rsqrt's approximation). torch's reduction order differs from the
            # kernel's warp shuffles, so r may differ from the CuPy path's in the last bit.
            torch.mean(torch.square(x.float()), dim=1, out=r)
            r.add_(self.eps).sqrt_().reciprocal_()

    def _postscale(self, m: int, outs, post) -> None:
        """outs[i] = Y[:m, columns[i]] · r[:m] on the plan's post-scale stream."""
        if self.kernels == "cupy":
            kernels = self._kernels
            where = self.plan.post_stream
            post_cupy = kernels.cupy_stream(post.cuda_stream) if where == "caller" else self._side[where]
            with post_cupy:
                kernels.postscale(self._y[:m], self._r[:m], *[kernels.cupy_view(o) for o in outs],
                                  columns=self.columns, dtype=self.kernel_dtype)
            return
        scale = self.r[:m, None]
        with torch.cuda.stream(post):
            for out, (start, stop) in zip(outs, self.columns):
                # Y (model dtype) times r (fp32) computes in fp32 and is rounded once into out's
                # dtype, as postscale_<t>.
                torch.mul(self.y[:m, start:stop], scale, out=out)

    def __repr__(self) -> str:
        return (f"CudaNormProjection({self.name!r}, in={self.in_features}, out={list(self.out_features)}, "
                f"{self.kernel_dtype} on {self.device}, {self.kernels} kernels, max_tokens={self.max_tokens}, "
                f"prefill_rows={self.prefill_rows}, {self.plan.describe()})")


# --- torch.compile: the step as a custom operator -------------------------------------------

# op id -> group. Weak, and emptied by close(): a compiled graph names its groups by id, and
# must not keep a detached model's buffers (Y can be vocab-wide for lm_head) alive.
_groups: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_ids = count()


def register_group(group) -> int:
    """A new id under which flashnorm::norm_projection finds `group`."""
    group_id = next(_ids)
    _groups[group_id] = group
    return group_id


def release_group(group_id: int) -> None:
    """Forget the group of `group_id` (its close()); unknown ids are ignored."""
    _groups.pop(group_id, None)


def registered_group(group_id: int):
    """The group registered as `group_id`, or a LookupError that says it was detached."""
    group = _groups.get(group_id)
    if group is None:
        raise LookupError(f"flashnorm::norm_projection: no attached norm → projection group has id {group_id}: its "
                          "model was detached (Attachment.detach() closes the groups). Attach the model again "
                          "before calling the compiled function (torch.compile recompiles for the new modules)")
    return group


def _unseen_work_declarer():
    """streamcheck.declare_access while a recording runs this operator as one opaque call (the
    torch adapter's dispatch mode is off inside a custom operator and nested library calls are
    not recorded), else None. The recorder is looked up, not imported: without a recording
    the operator costs no import."""
    recorder = sys.modules.get("streamcheck.record.recorder")
    if recorder is None or recorder.current is None or not recorder.depth():
        return None
    from streamcheck.record.instrument import declare_access

    return declare_access


@torch.library.custom_op("flashnorm::norm_projection", mutates_args=(), device_types="cuda")
def norm_projection(hidden: torch.Tensor, group: int, index: int) -> torch.Tensor:
    """Projection `index` of group `group` (an op id) on `hidden`: the group's step, run once per
    new input. Writes no argument: Y and r are the group's own buffers, the output is fresh."""
    found = registered_group(group)
    found.declare = _unseen_work_declarer()
    try:
        return found.outputs(hidden)[index]
    finally:
        found.declare = None


@norm_projection.register_fake
def _norm_projection_fake(hidden, group, index):
    found = registered_group(group)
    return hidden.new_empty((*hidden.shape[:-1], found.out_features[index]), dtype=found.dtype)


def attached_groups(model) -> list:
    """The CudaNormProjection groups attached to `model`, in model order (none for a plain model)."""
    groups = []
    for module in model.modules():
        if (isinstance(module, RoutedProjection) and isinstance(module.group, CudaNormProjection)
                and all(module.group is not g for g in groups)):
            groups.append(module.group)
    return groups


def unjoined_forks(plan: SyncPlan) -> list:
    """What the plan leaves unjoined in a captured step: side streams drawn into the capture (by
    a fork, or by waiting on a captured stream's event) whose work never flows back into the
    capturing caller's stream. CUDA ends such a capture with cudaErrorStreamCaptureUnjoined.
    (No `war` wait is issued inside a capture: see forget_previous_step.)"""
    post = plan.post_stream
    captured = {"caller"} | {side for side, fork in (("A", "fork_a"), ("B", "fork_b")) if plan.has(fork)}
    if post != "caller" and ((plan.has("join_mm") and "A" in captured) or (plan.has("join_rms") and "B" in captured)):
        captured.add(post)
    problems = []
    for side, join, work in (("A", "join_mm", "the matmul"), ("B", "join_rms", "the RMS")):
        if side not in captured:
            continue
        if side == post:
            missing = [] if plan.has("join_back") else ["join_back"]
        else:
            missing = [] if plan.has(join) else [join]
            if post != "caller" and not plan.has("join_back"):
                missing.append("join_back")
        if missing:
            problems.append(f"stream {side} ({work}) is never joined back into the capturing stream: missing "
                            f"{' and '.join(missing)}")
    return problems


# --- decoding -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ForwardArgs:
    """How this transformers version's forward takes the cache (the names moved in 5.x)."""

    cache: str  # "cache" or "past_key_values"
    cache_position: bool
    logits_to_keep: bool


def _forward_args(model) -> _ForwardArgs:
    params = inspect.signature(model.forward).parameters
    return _ForwardArgs("cache" if "cache" in params else "past_key_values", "cache_position" in params,
                        "logits_to_keep" in params)


def _new_cache(model, static: bool, max_len: int, batch: int):
    from transformers import DynamicCache, StaticCache

    config = model.config
    if not static:
        try:
            return DynamicCache(config=config)
        except TypeError:  # transformers before the layered caches
            return DynamicCache()
    try:
        return StaticCache(config=config, max_cache_len=max_len)  # layers allocate at their first update
    except TypeError:  # older signature
        weight = next(model.parameters())
        return StaticCache(config=config, max_batch_size=batch, max_cache_len=max_len, device=weight.device,
                           dtype=weight.dtype)


def _next_token(model, args: _ForwardArgs, cache, ids, positions, cache_position):
    """Greedy: the argmax of the last position's logits, [batch, 1]."""
    kwargs = {args.cache: cache, "use_cache": True, "position_ids": positions}
    if args.cache_position:
        kwargs["cache_position"] = cache_position
    if args.logits_to_keep:
        kwargs["logits_to_keep"] = 1
    logits = model(input_ids=ids, **kwargs).logits
    return logits[:, -1, :].argmax(-1, keepdim=True)


def _decode_step(model, args, cache, ids, positions, cache_position) -> None:
    """One decode step in place on static tensors: ids [batch, 1] becomes the next token."""
    ids.copy_(_next_token(model, args, cache, ids, positions, cache_position))
    positions.add_(1)
    cache_position.add_(1)


def _prompt(model, input_ids, max_new_tokens, groups) -> torch.Tensor:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    device = next(model.parameters()).device
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [batch, prompt length] with at least one token, got shape "
                         f"{tuple(ids.shape)}")
    rows = ids.shape[0] * ids.shape[1]
    for group in groups[:1]:  # every group of one attachment has the same max_tokens
        if rows > group.max_tokens:
            raise ValueError(f"the prompt is {ids.shape[0]} × {ids.shape[1]} = {rows} rows for the prefill step but "
                             f"the model was attached with max_tokens={group.max_tokens}; attach with "
                             f"max_tokens >= {rows}")
    return ids


def _prefill(model, args, cache, ids):
    batch, length = ids.shape
    positions = torch.arange(length, device=ids.device).repeat(batch, 1)
    return _next_token(model, args, cache, ids, positions, torch.arange(length, device=ids.device))


def _static_inputs(ids, first):
    batch, length = ids.shape
    positions = torch.full((batch, 1), length, dtype=torch.long, device=ids.device)
    return first.clone(), positions, torch.tensor([length], dtype=torch.long, device=ids.device)


def greedy_decode(model, input_ids, max_new_tokens: int, *, static_cache: bool = False) -> torch.Tensor:
    """Greedy decoding with a KV cache, eagerly: one forward for the prompt, then one per new
    token. Works on a plain or an attached model. Exactly `max_new_tokens` tokens (no stop at
    EOS). `static_cache`: transformers' StaticCache (what decode_with_graph captures) instead of
    the growing DynamicCache. Returns the prompt and the new tokens, LongTensor
    [batch, prompt + max_new_tokens], on the model's device."""
    ids = _prompt(model, input_ids, max_new_tokens, attached_groups(model))
    args = _forward_args(model)
    cache = _new_cache(model, static_cache, ids.shape[1] + max_new_tokens, ids.shape[0])
    with torch.no_grad():
        token, positions, cache_position = _static_inputs(ids, _prefill(model, args, cache, ids))
        tokens = [token.clone()]
        for _ in range(max_new_tokens - 1):
            _decode_step(model, args, cache, token, positions, cache_position)
            tokens.append(token.clone())
    return torch.cat([ids] + tokens, dim=1)


def decode_with_graph(model, input_ids, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding with the decode step captured once as a CUDA graph over transformers'
    StaticCache: the prefill runs eagerly, then every decode step is one graph replay. Same
    result as greedy_decode(..., static_cache=True). Works on a plain or an attached model
    (on CUDA). An attached plan that leaves a fork unjoined (the talk's SyncPlan.implicit_join())
    is refused by CUDA at the end of the capture: GraphCaptureError names the missing join."""
    groups = attached_groups(model)
    ids = _prompt(model, input_ids, max_new_tokens, groups)
    if ids.device.type != "cuda":
        raise ValueError(f"decode_with_graph: the model is on {ids.device}; CUDA graphs need it on CUDA")
    args = _forward_args(model)
    batch, length = ids.shape
    cache = _new_cache(model, True, length + max_new_tokens, batch)
    with torch.no_grad():
        token, positions, cache_position = _static_inputs(ids, _prefill(model, args, cache, ids))
        tokens = [token.clone()]
        if max_new_tokens > 1:
            stream = torch.cuda.Stream(ids.device)
            # Warm-up on the capture stream (cuBLAS handle and workspace per stream, first
            # kernels), against a scratch cache so that the real one is not advanced.
            scratch = _new_cache(model, True, length + max_new_tokens, batch)
            stream.wait_stream(torch.cuda.current_stream(ids.device))
            with torch.cuda.stream(stream):
                _decode_step(model, args, scratch, token.clone(), positions.clone(), cache_position.clone())
            torch.cuda.synchronize(ids.device)
            del scratch
            graph = _capture(groups, stream, lambda: _decode_step(model, args, cache, token, positions,
                                                                  cache_position))
            for _ in range(max_new_tokens - 1):
                graph.replay()
                tokens.append(token.clone())
    return torch.cat([ids] + tokens, dim=1)


def _capture(groups, stream, step):
    """`step()` captured on `stream` as one torch.cuda.CUDAGraph. Begun and ended by hand rather
    than with torch.cuda.graph, whose exit leaves the capture stream current when ending fails."""
    torch.cuda.synchronize()
    for group in groups:
        group.forget_previous_step()  # the previous step's war event was recorded outside the capture
    graph = torch.cuda.CUDAGraph()
    restore_generator = _generator_restorer(stream.device)
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            step()
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # the step's own error is the one to see
                restore_generator()
            raise
        finally:
            for group in groups:
                group.forget_previous_step()  # war was last recorded inside the capture
        try:
            graph.capture_end()
        except Exception as exc:
            restore_generator()
            raise GraphCaptureError(_refusal(groups, exc)) from exc
    return graph


def _generator_restorer(device):
    """A function that puts back the device's default CUDA generator as it was before a capture.
    capture_begin puts the generator in capture mode and only a successful capture_end takes it
    out (pytorch/pytorch#171263): after a refused capture, every later random op on the device
    would raise "Offset increment outside graph capture". A clone of the state taken before the
    capture has the seed and offset that eager code continues from."""
    generator = torch.cuda.default_generators[device.index if device.index is not None
                                              else torch.cuda.current_device()]
    if not hasattr(generator, "graphsafe_get_state"):  # an older torch without graph-safe generator states
        return lambda: None
    saved = generator.graphsafe_get_state().clone_state()
    return lambda: generator.graphsafe_set_state(saved)


def _refusal(groups, exc) -> str:
    if not groups:
        return f"decode_with_graph: CUDA refused to capture the decode step: {exc}"
    plan = groups[0].plan
    problems = unjoined_forks(plan)
    if not problems:
        return f"decode_with_graph: CUDA refused to capture the decode step with {plan.describe()}: {exc}"
    return (f"decode_with_graph: CUDA refused to capture the decode step (cudaErrorStreamCaptureUnjoined: a fork "
            f"never joined back). {plan.describe()}: {'; '.join(problems)}, in every norm → projection group "
            f"(first: {groups[0].name}). Attach with SyncPlan.correct(). CUDA said: {exc}")
