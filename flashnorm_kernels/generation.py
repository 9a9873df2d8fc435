"""Long generations through the dual-stream pipeline, against the sequential reference.

The implicit-join bug passed unit tests and perplexity; it showed only as text
repeating with a one-step lag in long generations. `run_generation` produces the
token sequence of one (plan, policy, seed) run of a transformers model with its
norm → projection groups on a streamcheck Device; `check_generation` runs the
sequential reference and a candidate and compares them token by token.

`run_generation_cuda` / `check_generation_cuda` do the same on the real path: the model on a
GPU, attached with `hf.attach(model, "cuda", plan)`, generating through transformers, the
torch and CuPy work recorded and checked by `streamcheck.instrument`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from streamcheck.core.compare import Comparison, compare_tokens, format_comparison
from streamcheck.device import Device

from .hf import attach
from .plan import SyncPlan


@dataclass
class GenerationRun:
    tokens: list
    device: Optional[Device]  # the Device, or the instrument Session of a CUDA run (None: not checked)

    @property
    def races(self):
        return self.device.races if self.device is not None else []

    def report(self) -> str:
        return self.device.report() if self.device is not None else "(not checked)"


def _generate(model, prompt_ids, max_new_tokens: int, plan: SyncPlan, devices: list,
              cancel: bool = False) -> GenerationRun:
    """Greedy `model.generate` (KV cache on) with the model's norm → projection groups on `devices`;
    `cancel`: apply pre-norm cancellation (Prop 3, hf.attach's cancel=)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    for device in devices:
        device.backend.warm_up()  # first cuBLAS call, module loading, pool growth: implicit syncs that hide races
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1)
    with attach(model, devices, plan, max_tokens=max(ids.shape[1], 1), cancel=cancel):
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, use_cache=True,
                                 max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    return GenerationRun(out[0, ids.shape[1]:].tolist(), devices[0])


def run_generation(model, prompt_ids, max_new_tokens: int, plan: SyncPlan, *, backend: str = "sim",
                   policy="sequential", seed: int = 0, check: bool = True, cancel: bool = False,
                   **policy_params) -> GenerationRun:
    """One (plan, policy, seed) generation on one Device."""
    device = Device(backend, check=check, policy=policy, seed=seed, **policy_params)
    return _generate(model, prompt_ids, max_new_tokens, plan, [device], cancel)


def run_lockstep(model, prompt_ids, max_new_tokens: int, plan: SyncPlan, schedules, *, backend: str = "sim",
                 check: bool = False, cancel: bool = False) -> GenerationRun:
    """One generation, many schedules: the sequential reference device feeds the model and
    every (policy, seed, params) device in `schedules` must compute the same values bit
    for bit at every step (else hf.LockstepMismatch). Equal values at every step from the
    same inputs mean each schedule would have generated exactly these tokens on its own,
    at the cost of one model forward per token instead of one per schedule."""
    devices = [Device(backend, check=check, policy="sequential")]
    devices += [Device(backend, check=check, policy=policy, seed=seed, **params) for policy, seed, params in schedules]
    return _generate(model, prompt_ids, max_new_tokens, plan, devices, cancel)


@dataclass
class GenerationCheck:
    reference: GenerationRun
    candidate: GenerationRun
    comparison: Comparison

    def message(self, decode=None) -> str:
        return format_comparison(self.comparison, decode, self.candidate.report())


def check_generation(model, prompt_ids, max_new_tokens: int, plan: SyncPlan, *, backend: str = "sim",
                     policy="delay", seed: int = 0, reference: Optional[GenerationRun] = None,
                     cancel: bool = False, **policy_params) -> GenerationCheck:
    """The candidate (plan, policy, seed) against the sequential reference with every edge;
    with `cancel`, both apply pre-norm cancellation, so only the schedule differs."""
    if reference is None:
        reference = run_generation(model, prompt_ids, max_new_tokens, SyncPlan.correct(), backend=backend,
                                   policy="sequential", cancel=cancel)
    candidate = run_generation(model, prompt_ids, max_new_tokens, plan, backend=backend, policy=policy, seed=seed,
                               cancel=cancel, **policy_params)
    return GenerationCheck(reference, candidate, compare_tokens(reference.tokens, candidate.tokens))


def run_generation_cuda(model, prompt_ids, max_new_tokens: int, plan: SyncPlan, *, hold: Optional[dict] = None,
                        check: bool = True) -> GenerationRun:
    """Greedy `model.generate` (KV cache on) with the model (on a GPU) attached by
    `hf.attach(model, "cuda", plan)`. `check`: record and check the run with
    streamcheck.instrument, started before the attach so that every buffer and kernel is seen;
    the run's `device` is the Session. `hold`: {"group": norm name, "us": µs, "after": step,
    "every": steps}, a bounded spin on that group's stream A before its matmul at those steps
    (hf_cuda.CudaNormProjection.hold_matmul)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    from streamcheck import instrument

    device = next(model.parameters()).device
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(1, -1)
    session = instrument.start() if check else None
    try:
        if session is None and hold:
            from streamcheck.record.gpu import warm_up

            from .hf_cuda import import_cupy

            warm_up(cupy=import_cupy(), torch=torch, spin=True)  # implicit syncs out of the way (gpu.warm_up)
        with attach(model, "cuda", plan, max_tokens=max(ids.shape[1], 1)) as attachment:
            if hold:
                attachment.group(hold["group"]).hold_matmul(hold["us"], after=hold.get("after", 0),
                                                            every=hold.get("every", 1))
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, use_cache=True,
                                     max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    finally:
        if session is not None:
            instrument.stop()
    return GenerationRun(out[0, ids.shape[1]:].tolist(), session)


def check_generation_cuda(model, prompt_ids, max_new_tokens: int, plan: SyncPlan, *,
                          reference: Optional[GenerationRun] = None, hold: Optional[dict] = None,
                          check: bool = True) -> GenerationCheck:
    """The candidate plan (under `hold`) against the reference: every edge, no hold, unchecked."""
    if reference is None:
        reference = run_generation_cuda(model, prompt_ids, max_new_tokens, SyncPlan.correct(), check=False)
    candidate = run_generation_cuda(model, prompt_ids, max_new_tokens, plan, hold=hold, check=check)
    return GenerationCheck(reference, candidate, compare_tokens(reference.tokens, candidate.tokens))
