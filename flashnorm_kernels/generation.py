"""Long generations through the dual-stream pipeline, against the sequential reference.

The implicit-join bug passed unit tests and perplexity; it showed only as text
repeating with a one-step lag in long generations. `run_generation` produces the
token sequence of one (plan, policy, seed) run of a transformers model with its
norm → projection groups on a streamcheck Device; `check_generation` runs the
sequential reference and a candidate and compares them token by token.
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
    device: Device

    @property
    def races(self):
        return self.device.races

    def report(self) -> str:
        return self.device.report()


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
