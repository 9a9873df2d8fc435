"""A model's norm-fed projections routed to their group: one step per new input serves every
projection the norm feeds (q/k/v, gate/up). Shared by the device-API groups (hf.py) and the
CUDA path's (hf_cuda.py)."""
from __future__ import annotations

import torch


class StepPerInput:
    """A norm and the projections it feeds, run as one step per new input: q/k/v (gate/up) are
    called one after another on the same tensor, so one step (`_step`, the subclass's) serves
    all. The tensor is held, so that its address cannot be reused by a new one."""

    _last_hidden = None
    _last_version = -1
    _outputs = None

    def outputs(self, hidden: torch.Tensor) -> list:
        if hidden is not self._last_hidden or hidden._version != self._last_version:
            self._outputs = self._step(hidden)
            self._last_hidden, self._last_version = hidden, hidden._version
        return self._outputs


class RoutedProjection(torch.nn.Module):
    """Stands in for projection `index` of a group (a StepPerInput)."""

    def __init__(self, group: StepPerInput, index: int):
        super().__init__()
        self.group = group
        self.index = index

    def forward(self, hidden):
        return self.group.outputs(hidden)[self.index]
