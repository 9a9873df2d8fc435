"""A model's norm-fed projections routed to their group: one step per new input serves every
projection the norm feeds (q/k/v, gate/up). Shared by the device-API groups (hf.py) and the
CUDA path's (hf_cuda.py).

Under torch.compile a projection asks its group for `compiled_output` instead: Dynamo cannot
trace a step (CuPy, events, the held input), so a group that can be one node of the graph
(hf_cuda: the custom operator flashnorm::norm_projection) says how; the device-API groups
keep the default, the eager step, where Dynamo breaks the graph as before."""
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

    def compiled_output(self, hidden: torch.Tensor, index: int) -> torch.Tensor:
        """Projection `index` as torch.compile traces it (see the module docstring)."""
        return self.outputs(hidden)[index]


class RoutedProjection(torch.nn.Module):
    """Stands in for projection `index` of a group (a StepPerInput)."""

    def __init__(self, group: StepPerInput, index: int):
        super().__init__()
        self.group = group
        self.index = index

    def forward(self, hidden):
        # Checked per call (about 0.3 µs, torch.jit.is_scripting inside): Dynamo folds it to True
        # while it traces, and the eager decode keeps the direct call, no dispatcher in between.
        if torch.compiler.is_compiling():
            return self.group.compiled_output(hidden, self.index)
        return self.group.outputs(hidden)[self.index]
