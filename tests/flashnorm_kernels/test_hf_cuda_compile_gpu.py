"""torch.compile of a model attached with hf.attach(model, "cuda"): the projections compile with
fullgraph=True (every group one flashnorm::norm_projection node, no graph break at FlashNorm)
to the eager values, on both paths (dual-stream, pre-scaled); a compiled forward decodes the
eager attached model's tokens; and `streamcheck run` of a script that compiles the attached
model checks it as it checks the eager one: the fixed plan clean, the talk's plan
(SyncPlan.implicit_join()) reported as the RAW race between the matmul on stream A and the
post-scale, through the compiled graph's operator calls. The CPU half is test_hf_cuda_compile.py.

Run on a GPU machine:  python -m pytest -m gpu -q tests/flashnorm_kernels/test_hf_cuda_compile_gpu.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamcheck.device.backends import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available() or not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU, CuPy (pip install 'streamcheck[gpu]') and a CUDA build of torch",
                allow_module_level=True)

from flashnorm_kernels.hf import attach  # noqa: E402
from flashnorm_kernels.hf_cuda import greedy_decode  # noqa: E402
from flashnorm_kernels.plan import SyncPlan  # noqa: E402
from flashnorm_kernels.testing.fixtures import PROMPT, encode, expected_continuation, load_fixture_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPT_IDS = encode(PROMPT)
P = len(PROMPT_IDS)
OP = torch.ops.flashnorm.norm_projection.default
TIMEOUT_S = 540


@pytest.fixture(scope="module")
def model():
    return load_fixture_model("tiny_llama_zen").to("cuda")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # no graph compiled for another attachment's modules
    yield
    torch._dynamo.reset()


def _projections(model):
    layer = model.model.layers[0]

    def projections(x):
        attn, mlp = layer.self_attn, layer.mlp
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x), mlp.gate_proj(x), mlp.up_proj(x)
    return projections


@pytest.mark.parametrize("prefill_rows", [256, 1])  # P rows: dual-stream below 256, pre-scaled with 1
def test_attached_projections_compile_with_fullgraph_to_the_eager_values(model, prefill_rows):
    x = torch.randn((1, P, model.config.hidden_size), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    nodes = []

    def inductor_noting_the_operator(gm, example_inputs):
        nodes.extend(n for n in gm.graph.nodes if n.target in (OP, torch.ops.flashnorm.norm_projection))
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    with attach(model, "cuda", SyncPlan.correct(), max_tokens=P, prefill_rows=prefill_rows), torch.no_grad():
        projections = _projections(model)
        want = projections(x)
        compiled = torch.compile(projections, fullgraph=True, backend=inductor_noting_the_operator)
        got = compiled(x.clone())  # a new input: the group runs a new step, not the eager one's outputs
        again = compiled(x.clone())
    assert len(nodes) == 5, [str(n.target) for n in nodes]  # q, k, v, gate, up: each one node
    for w, g, a in zip(want, got, again):
        assert torch.equal(g, w) and torch.equal(a, w)


def test_a_compiled_forward_decodes_the_eager_attached_models_tokens(model):
    with attach(model, "cuda", SyncPlan.correct(), max_tokens=P), torch.no_grad():
        eager = greedy_decode(model, PROMPT_IDS, 32, static_cache=True)
        model.forward = torch.compile(model.forward)
        try:
            compiled = greedy_decode(model, PROMPT_IDS, 32, static_cache=True)
        finally:
            del model.forward  # the class's forward again, for the other tests
    assert bytes(eager[0, P:].tolist()) == expected_continuation(P, 32)
    assert torch.equal(compiled, eager)


SCRIPT = """\
import sys

import torch

from flashnorm_kernels.hf import attach
from flashnorm_kernels.hf_cuda import greedy_decode
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, encode, load_fixture_model

plan = getattr(SyncPlan, sys.argv[1])()
model = load_fixture_model("tiny_llama_zen").to("cuda")
ids = encode(PROMPT)
with attach(model, "cuda", plan, max_tokens=len(ids)):
    model.forward = torch.compile(model.forward)
    out = greedy_decode(model, ids, 6, static_cache=True)
print("TOKENS", out[0, len(ids):].tolist())
"""


def _streamcheck_run(tmp_path, plan: str):
    script, races, ops = tmp_path / "compiled_decode.py", tmp_path / "races.json", tmp_path / "ops.json"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "streamcheck.cli", "run", "--json", str(races), "--ops-json", str(ops),
           str(script), plan]
    env = {**{k: v for k, v in os.environ.items() if k != "STREAMCHECK_RUN"},
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=env)
    what = f"exit status {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, what
    assert "internal error" not in proc.stderr.lower(), what
    recorded = ops.read_text()
    assert "norm_projection" in recorded, f"the compiled graph never called the operator\n{what}"
    # Every step ran inside the operator: its declared post-scale (named by dtype) and no CuPy
    # launch of the eager path (named by kernel: postscale_f32, postscale_f32_v4).
    assert "postscale_float32" in recorded and "postscale_f32" not in recorded, what
    tokens = [json.loads(line[len("TOKENS "):]) for line in proc.stdout.splitlines() if line.startswith("TOKENS ")]
    return json.loads(races.read_text()) if races.exists() else [], tokens, what


def test_streamcheck_run_finds_nothing_in_the_compiled_model_with_the_fixed_plan(tmp_path):
    races, tokens, what = _streamcheck_run(tmp_path, "correct")
    assert races == [], what
    assert tokens and bytes(tokens[0]) == expected_continuation(P, 6), what


def test_streamcheck_run_reports_the_missing_join_in_the_compiled_model(tmp_path):
    races, _, what = _streamcheck_run(tmp_path, "implicit_join")
    raw = [r for r in races if r["kind"] == "RAW" and "aten.mm" in r["first"]["name"]
           and r["second"]["name"].startswith("postscale")]
    assert raw, f"{[(r['kind'], r['first']['name'], r['second']['name']) for r in races]}\n{what}"
    assert raw[0]["first"]["write"] and not raw[0]["second"]["write"]
    assert raw[0]["first"]["actor"] != raw[0]["second"]["actor"]  # stream A against the caller's stream
