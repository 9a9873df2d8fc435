"""The CUDA path's custom operator, flashnorm::norm_projection, in the parts that run without a
GPU: the group registry (ids, forgotten at close), the schema (no written argument), the fake
(the output's shape, dtype and device), and the routing: a projection traced by Dynamo
(torch.export, which never runs the kernels) is one operator node naming its group and
index, while an eager call runs the group's step directly. The GPU half (compiled models,
their tokens, `streamcheck run`) is test_hf_cuda_compile_gpu.py."""
from __future__ import annotations

import gc

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from flashnorm_kernels import hf_cuda
from flashnorm_kernels.groups import RoutedProjection, StepPerInput

OP = torch.ops.flashnorm.norm_projection.default


class _Group(StepPerInput):
    """A group as the operator sees it (op_id, out_features, dtype), computing on the CPU."""

    compiled_output = hf_cuda.CudaNormProjection.compiled_output  # the CUDA group's routing, unchanged

    def __init__(self, out_features=(6, 2, 2), dtype=torch.float32):
        self.out_features, self.dtype = out_features, dtype
        self.op_id = hf_cuda.register_group(self)
        self.steps = 0

    def _step(self, hidden):
        self.steps += 1
        return [hidden[..., :n] * (i + 1) for i, n in enumerate(self.out_features)]


class _Projections(torch.nn.Module):
    def __init__(self, group):
        super().__init__()
        self.q, self.k, self.v = (RoutedProjection(group, i) for i in range(3))

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


def test_groups_get_distinct_ids_and_are_forgotten_at_release():
    first, second = _Group(), _Group()
    assert first.op_id != second.op_id
    assert hf_cuda.registered_group(first.op_id) is first
    assert hf_cuda.registered_group(second.op_id) is second
    hf_cuda.release_group(first.op_id)
    with pytest.raises(LookupError, match=rf"no attached norm → projection group has id {first.op_id}: its model "
                                          r"was detached .* Attach the model again"):
        hf_cuda.registered_group(first.op_id)
    assert hf_cuda.registered_group(second.op_id) is second  # the others stay
    hf_cuda.release_group(first.op_id)  # a second release does nothing


def test_the_registry_does_not_keep_a_group_alive():
    group = _Group()
    group_id = group.op_id
    del group
    gc.collect()
    with pytest.raises(LookupError):
        hf_cuda.registered_group(group_id)


def test_the_schema_writes_no_argument_and_returns_one_fresh_tensor():
    schema = torch._C.parse_schema(str(OP._schema))  # what torch.compile and streamcheck read
    assert [a.name for a in schema.arguments] == ["hidden", "group", "index"]
    assert all(a.alias_info is None for a in schema.arguments)
    assert [str(r.type) for r in schema.returns] == ["Tensor"] and schema.returns[0].alias_info is None
    assert not schema.is_mutable


@pytest.mark.parametrize("index, width", [(0, 8), (1, 4), (2, 2)])
def test_the_fake_gives_the_groups_output_shape_dtype_and_device(index, width):
    group = _Group(out_features=(8, 4, 2), dtype=torch.bfloat16)
    with FakeTensorMode():
        hidden = torch.empty((2, 3, 16), dtype=torch.bfloat16, device="cuda")
        out = OP(hidden, group.op_id, index)
    assert tuple(out.shape) == (2, 3, width)
    assert out.dtype == torch.bfloat16 and out.device == torch.device("cuda", 0)
    assert group.steps == 0  # tracing runs no step


def test_the_fake_of_a_released_group_says_it_was_detached():
    group = _Group()
    hf_cuda.release_group(group.op_id)
    with FakeTensorMode(), pytest.raises(LookupError, match="was detached"):
        OP(torch.empty((1, 16), device="cuda"), group.op_id, 0)


def test_traced_projections_are_one_operator_node_each_and_eager_runs_the_step():
    group = _Group()
    module = _Projections(group)
    x = torch.randn(2, 5, 16)
    exported = torch.export.export(module, (x,), strict=True)  # Dynamo: no graph break is allowed
    calls = [node.args for node in exported.graph.nodes if node.target is OP]
    assert [args[1:] for args in calls] == [(group.op_id, 0), (group.op_id, 1), (group.op_id, 2)]
    assert [tuple(n.meta["val"].shape) for n in exported.graph.nodes if n.target is OP] == [(2, 5, 6), (2, 5, 2),
                                                                                           (2, 5, 2)]
    assert group.steps == 0
    q, k, v = module(x)  # eager: the step itself, once for the three projections
    assert group.steps == 1
    assert torch.equal(q, x[..., :6]) and torch.equal(k, x[..., :2] * 2) and torch.equal(v, x[..., :2] * 3)


def test_the_operator_has_no_cpu_kernel():
    group = _Group()
    with pytest.raises(NotImplementedError, match="flashnorm::norm_projection"):
        OP(torch.randn(2, 16), group.op_id, 0)
    assert group.steps == 0
