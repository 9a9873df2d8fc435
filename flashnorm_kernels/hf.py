"""Run a transformers model's norm → projection pairs through the dual-stream pipeline.

`attach(model, device, plan)` replaces, in every decoder layer, the input norm and
the pre-MLP norm, and the final norm, with identities, and the projections they
feed (q/k/v, gate/up, lm_head) with modules that run one `DeferredNormProjection`
step per group: folded weights W* = W·g on stream A, 1/RMS on stream B, the
post-scale after the plan's joins. Each group keeps persistent device buffers, as
inference engines preallocate them, so a post-scale that reads Y too early gets
the previous step's projection: the one-step lag of the FlashNorm talk.

With `cancel=True` (FlashNorm Prop 3, cancel.py) the projections whose output a later
norm re-normalises (q_proj and k_proj of QK-norm models such as Qwen3) skip the input
norm's 1/RMS scale: their group runs with `unscaled=` those indices, so they get W*·x
and q_norm / k_norm do the normalising. Exact without ε; with ε the relative change per
head is bounded by `cancel.cancellation_error_bound`.

The model's own parameters are not touched (W* is computed from them); `detach()`
puts the original modules back, so the model is bit-for-bit what it was.
With streamcheck Devices, activations cross to the device and back through host
copies: a test harness for the synchronization, not a fast path.

`attach(model, "cuda", plan)` is the real path (hf_cuda.py): the model on a GPU, each
group a hf_cuda.CudaNormProjection on the model's own tensors, forked from and joined
back to torch's current stream, no host copies.

Both paths check every group before replacing anything: an unsupported architecture,
a norm or projection that is not what the layout says, a model on the wrong device or
in a dtype the kernels lack raise, and leave the model as it was.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from streamcheck.device import Device

from .cancel import CancellationPlan, cancellable_projections
from .fold import FlashNormError, UnsupportedArchitectureError, layout_for, norm_gain, norm_groups
from .groups import RoutedProjection, StepPerInput
from .pipeline import DeferredNormProjection
from .plan import SyncPlan


class _Identity(torch.nn.Module):
    """Stands in for a norm whose 1/RMS the pipeline applies after the matmul."""

    def forward(self, hidden):
        return hidden


class LockstepMismatch(AssertionError):
    """A device computed different values than the first one at the same step."""


class _Group(StepPerInput):
    """One norm and the projections it feeds, run as one pipeline step per new input.

    With several devices (lockstep), every device runs the same step on the same
    input; the first device's outputs feed the model and every other device must
    produce them bit for bit, or LockstepMismatch names the step and the schedule."""

    def __init__(self, name: str, norm, linears, gain_style: str, devices, plan: SyncPlan,
                 callers, max_tokens: int, dtype: str, unscaled: tuple = ()):
        with torch.no_grad():  # W* = W·g, as flashify folds it, without touching the model
            gain = norm_gain(norm, gain_style).double()
            weights = [(lin.weight.detach().double() * gain[None, :]).float().numpy() for lin in linears]
        self.name = name
        self.biases = [lin.bias.detach().clone() if lin.bias is not None else None for lin in linears]
        self.modules = [DeferredNormProjection(device, weights, eps=_norm_eps(norm), plan=plan, dtype=dtype,
                                               max_tokens=max_tokens, name=name, unscaled=unscaled)
                        for device in devices]
        self.inputs = [module.alloc_input(name=f"{name}.x") for module in self.modules]
        self.callers = callers
        self.steps = 0
        self._host_input = None  # kept alive: the uploads read it when they execute

    @property
    def module(self) -> DeferredNormProjection:
        return self.modules[0]

    def close(self) -> None:
        """Nothing to release: the Devices own their buffers."""

    def _run(self, module, x, caller, m) -> list:
        module.device.upload(x[:m], self._host_input, stream=caller)
        outs = module(x[:m], caller)
        return module.read(outs, caller)

    def _step(self, hidden: torch.Tensor) -> list:
        rows = hidden.detach().reshape(-1, hidden.shape[-1]).float().cpu().numpy()
        m = rows.shape[0]
        if m > self.module.max_tokens:
            raise ValueError(f"flashnorm attach: {self.name} got {m} rows but max_tokens={self.module.max_tokens}; "
                             "pass a larger max_tokens to attach()")
        self._host_input = self.module.encode(rows)
        values = self._run(self.module, self.inputs[0], self.callers[0], m)
        for module, x, caller in zip(self.modules[1:], self.inputs[1:], self.callers[1:]):
            other = self._run(module, x, caller, m)
            for j, (want, got) in enumerate(zip(values, other)):
                if not np.array_equal(want, got, equal_nan=True):
                    raise LockstepMismatch(
                        f"{self.name} step {self.steps}, output {j}: {module.device.backend.name} schedule "
                        f"{module.device.schedule} differs from the first device's (max |diff| "
                        f"{np.nanmax(np.abs(want - got)):.3g})\n{module.device.report()}")
        self.steps += 1
        result = []
        for value, bias in zip(values, self.biases):
            out = torch.from_numpy(np.ascontiguousarray(value)).to(hidden.dtype)
            if bias is not None:
                out = out + bias  # W·(x/rms) + b: the bias is outside the deferred scale
            result.append(out.reshape(*hidden.shape[:-1], out.shape[-1]))
        return result


def _norm_eps(norm) -> float:
    for attr in ("variance_epsilon", "eps", "epsilon"):
        if hasattr(norm, attr):
            return float(getattr(norm, attr))
    raise ValueError(f"flashnorm attach: cannot find the epsilon of {type(norm).__name__}")


def _set(root, path: str, module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


class Attachment:
    """What `attach` changed; `detach()` (or leaving the `with` block) undoes it."""

    def __init__(self, model, devices, groups, originals, cancellation: Optional[CancellationPlan] = None):
        self.model = model  # devices: streamcheck Devices, or [the torch.device] of the CUDA path
        self.devices = devices
        self.groups = groups
        self.cancellation = cancellation  # the Prop 3 plan applied (attach(cancel=True)), else None
        self._originals = originals  # path -> original module

    @property
    def device(self):
        return self.devices[0]

    @property
    def modules(self) -> list:
        return [g.module for g in self.groups]

    def group(self, name: str):
        """The group of norm `name` ("layers.0.input_layernorm", "norm")."""
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(f"no norm → projection group {name!r}; groups: {', '.join(g.name for g in self.groups)}")

    def detach(self) -> None:
        """Put the original modules back (the model is bit for bit what it was), then release
        the groups' buffers. A second call does nothing."""
        if not self._originals:
            return
        for path, module in self._originals.items():
            _set(self.model, path, module)
        self._originals = {}
        for group in self.groups:
            group.close()

    def __enter__(self) -> "Attachment":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


def _unscaled(norm_path: str, proj_paths, linears, cancellation: Optional[CancellationPlan]) -> tuple:
    """Indices of the projections of this group that skip the 1/RMS scale (Prop 3)."""
    if cancellation is None or norm_path.rpartition(".")[2] != "input_layernorm":
        return ()
    names = [p.rpartition(".")[2] for p in proj_paths]
    missing = [p for p in cancellation.skip_prescale if p not in names]
    if missing:
        raise FlashNormError(f"flashnorm attach(cancel=True): {norm_path} feeds {', '.join(names)} but the "
                             f"{cancellation.model_type} cancellation plan names {', '.join(missing)}; the fold "
                             "layout and cancel.FOLLOWING_NORMS disagree for this model")
    indices = tuple(i for i, n in enumerate(names) if n in cancellation.skip_prescale)
    for i in indices:
        if linears[i].bias is not None:  # N(c·Wx + b) ≠ N(Wx + b)
            raise FlashNormError(f"flashnorm attach(cancel=True): {proj_paths[i]} has a bias, so it cannot skip "
                                 "the 1/RMS scale; attach without cancel=True")
    return indices


def _is_cuda(devices) -> bool:
    if isinstance(devices, torch.device):
        return devices.type == "cuda"
    return isinstance(devices, str) and devices.split(":")[0] == "cuda"


def _checked_groups(model, what: str) -> list:
    """[(norm path, norm, projection paths, linears)] of every group, each checked to be what the
    layout says (a 1-D gain, an epsilon, Linear projections of the norm's width), before anything
    is replaced."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    try:
        groups = norm_groups(model)
    except UnsupportedArchitectureError as exc:
        raise UnsupportedArchitectureError(str(exc).replace("flashify:", f"{what}:", 1)) from None
    found = []
    for norm_path, proj_paths in groups:
        try:
            norm = model.get_submodule(norm_path)
            linears = [model.get_submodule(p) for p in proj_paths]
        except AttributeError as exc:
            raise FlashNormError(f"{what}: this {model_type} model has no module the layout names ({exc}); the "
                                 "transformers layout differs from flashnorm_kernels.fold.LAYOUTS") from None
        weight = getattr(norm, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
            hint = " (already attached? detach() first)" if isinstance(norm, _Identity) else ""
            raise FlashNormError(f"{what}: {norm_path} ({type(norm).__name__}) has no 1-D gain 'weight'{hint}; it "
                                 f"is not the RMSNorm fold.LAYOUTS[{model_type!r}] expects. Nothing was attached")
        _norm_eps(norm)
        for path, linear in zip(proj_paths, linears):
            if not isinstance(linear, torch.nn.Linear) or linear.in_features != weight.numel():
                raise FlashNormError(f"{what}: {path} is not a Linear with in_features={weight.numel()} (got "
                                     f"{type(linear).__name__}); it cannot take {norm_path}'s output. Nothing was "
                                     "attached")
        found.append((norm_path, norm, proj_paths, linears))
    return found


def _group_name(norm_path: str) -> str:
    return norm_path.split(".", 1)[1] if "." in norm_path else norm_path  # "layers.0.input_layernorm"


def _replace(model, groups, found, projection) -> dict:
    """Swap in the groups (every one already built): norms become identities, projections
    `projection(group, index)`. Returns path -> original module."""
    originals = {}
    for group, (norm_path, norm, proj_paths, _) in zip(groups, found):
        originals[norm_path] = norm
        _set(model, norm_path, _Identity())
        for index, path in enumerate(proj_paths):
            originals[path] = model.get_submodule(path)
            _set(model, path, projection(group, index))
    return originals


def _check_count(name: str, value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}: {name} must be an integer >= 1, got {value!r}")
    return value


def attach(model, devices, plan: Optional[SyncPlan] = None, *, max_tokens: int = 256,
           dtype: Optional[str] = None, cancel: bool = False, prefill_rows: Optional[int] = None,
           kernels: str = "auto") -> Attachment:
    """Route every norm → projection group of `model` through the dual-stream pipeline.

    `devices`: one Device, or several run in lockstep (the first feeds the model; the
    others must compute the same values bit for bit at every step); `dtype` is then the
    pipeline's (default float32). Or "cuda" / a torch.device of type cuda: the real path
    (hf_cuda.py) on a model whose parameters are on that GPU, computing in the model's
    dtype; `prefill_rows` (default hf_cuda.PREFILL_ROWS) is where steps switch to the
    pre-scaled single-stream path. `max_tokens`: the most rows one step takes (batch ×
    tokens of that step, the prompt's included). `kernels` (CUDA path only): "cupy" (the
    CUDA C kernels through CuPy; without CuPy, an ImportError that says how to install it),
    "torch" (torch operators on torch.cuda.Stream()s: no CuPy needed, so it also runs on
    streamcheck's emulated CUDA device; a plan with blocking side streams is refused), or
    "auto" (the default): CuPy where it imports, else torch (hf_cuda, "Kernel paths").
    `cancel=True`: FlashNorm Prop 3. `cancel.cancellable_projections(model)` decides which
    of the projections fed by each `input_layernorm` skip its 1/RMS scale (q_proj, k_proj
    of QK-norm models); a model that does not qualify raises cancel.NotCancellableError
    before anything is attached. Device API only."""
    if _is_cuda(devices):
        return _attach_cuda(model, devices, plan, max_tokens=max_tokens, dtype=dtype, cancel=cancel,
                            prefill_rows=prefill_rows, kernels=kernels)
    if not isinstance(cancel, bool):
        raise ValueError(f"flashnorm attach: cancel must be True or False, got {cancel!r}")
    if prefill_rows is not None:
        raise ValueError("flashnorm attach: prefill_rows applies to the CUDA path (attach(model, 'cuda')) only")
    if kernels != "auto":
        raise ValueError(f"flashnorm attach: kernels={kernels!r} applies to the CUDA path (attach(model, 'cuda')) "
                         "only; a streamcheck Device runs its own kernels")
    cancellation = cancellable_projections(model) if cancel else None  # raises before anything changes
    devices = [devices] if isinstance(devices, Device) else list(devices)
    if not devices or not all(isinstance(d, Device) for d in devices):
        raise ValueError("flashnorm attach: devices must be a streamcheck Device or a non-empty list of them, "
                         "or 'cuda' for the CUDA path")
    plan = SyncPlan.correct() if plan is None else plan
    dtype = "float32" if dtype is None else dtype
    # Every group checked, its cancellation decided (and refused) and built before the model is changed.
    found = _checked_groups(model, "flashnorm attach")
    unscaled = [_unscaled(norm_path, proj_paths, linears, cancellation) for norm_path, _, proj_paths, linears in found]
    gain_style = layout_for(getattr(model.config, "model_type", None)).gain
    callers = [d.legacy if plan.caller_kind == "legacy" else d.stream("caller", kind=plan.caller_kind)
               for d in devices]
    groups = [_Group(_group_name(norm_path), norm, linears, gain_style, devices, plan, callers, max_tokens, dtype, skip)
              for (norm_path, norm, _, linears), skip in zip(found, unscaled)]
    originals = _replace(model, groups, found, RoutedProjection)
    for device in devices:
        device.synchronize()  # weight uploads done before the first step
    return Attachment(model, devices, groups, originals, cancellation)


def _attach_cuda(model, devices, plan, *, max_tokens, dtype, cancel, prefill_rows, kernels) -> Attachment:
    from . import hf_cuda

    what = f"flashnorm attach(model, {str(devices)!r})"
    plan = SyncPlan.correct() if plan is None else plan
    if not isinstance(plan, SyncPlan):
        raise ValueError(f"{what}: plan must be a SyncPlan (e.g. SyncPlan.correct()), got {type(plan).__name__}")
    if cancel is not False:
        raise ValueError(f"{what}: cancel=True (Prop 3) runs on the device API only; attach to a streamcheck "
                         "Device for it")
    max_tokens = _check_count("max_tokens", max_tokens, what)
    prefill_rows = _check_count("prefill_rows", hf_cuda.PREFILL_ROWS if prefill_rows is None else prefill_rows, what)
    if kernels not in hf_cuda.KERNEL_PATHS:
        raise ValueError(f"{what}: kernels must be one of {', '.join(repr(k) for k in hf_cuda.KERNEL_PATHS)}, "
                         f"got {kernels!r}")
    # In this order, each before anything is replaced: the layout, the dtype, the device, the
    # kernel path (CuPy imported for "cupy"), the plan against that path.
    found = _checked_groups(model, what)
    hf_cuda.compute_dtype([lin for *_, linears in found for lin in linears], dtype)
    device = hf_cuda.cuda_device(model, devices)
    path = hf_cuda.kernel_path(kernels)
    if path == "cupy":
        from . import kernels_cuda

        kernels_cuda.compile_kernels()  # NVRTC and the module load now, not in the first step or a capture
    else:
        hf_cuda.check_torch_plan(plan, kernels)
    gain_style = layout_for(getattr(model.config, "model_type", None)).gain
    groups = [hf_cuda.CudaNormProjection(_group_name(norm_path), norm, linears, gain_style, eps=_norm_eps(norm),
                                         plan=plan, max_tokens=max_tokens, prefill_rows=prefill_rows,
                                         kernels=path)
              for norm_path, norm, proj_paths, linears in found]
    originals = _replace(model, groups, found, RoutedProjection)
    torch.cuda.synchronize(device)  # W* folded before the first step, whatever stream it runs on
    return Attachment(model, [device], groups, originals)
