"""The emulation on a machine with a GPU and a CUDA build of torch (docs/emulation.md): with
`--backend sim` the sim still decides (emulated tensors never reach the GPU, the races are the
CPU's), and a Triton kernel launched under the sim is refused in one line.

    pytest -m gpu tests/streamcheck/emulation/test_emulation_gpu.py
"""
from __future__ import annotations

import pytest

from tests.paths import GPU_PROGRAMS

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA build of torch with a GPU (torch {torch.__version__} sees none)")
    return torch


def test_with_a_cuda_build_the_sim_decides_and_nothing_reaches_the_gpu(cuda_torch):
    from streamcheck.emulation.script import run_script

    torch = cuda_torch
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    program = GPU_PROGRAMS / "torch" / "race_kv_swap_before_write.py"
    run = run_script(str(program))
    assert run.status == 0 and run.error == "" and run.refused == "", run.error + run.refused
    assert [r.kind for r in run.device.races] == ["RAW"]
    assert run.device.schedule.policy == "sequential"  # the sim's own schedule, not the GPU's timing
    assert torch.cuda.memory_allocated() == before  # no emulated tensor was ever a real CUDA tensor
    assert torch.cuda.is_available() and type(torch.zeros(1, device="cuda")).__name__ == "Tensor"  # restored
    wrong = [run_script(str(program), policy="pct", seed=seed, check=False) for seed in range(4)]
    assert any('"wrong": 0' not in w.stdout for w in wrong), [w.stdout for w in wrong]


def test_a_triton_kernel_under_the_sim_is_refused_in_one_line(cuda_torch):
    triton = pytest.importorskip("triton")
    import triton.language as tl

    from streamcheck.device import Device
    from streamcheck.emulation.torch_cuda import Emulation, EmulationError

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)

    with Emulation(Device("sim")):
        x = cuda_torch.zeros(16, device="cuda")
        with pytest.raises(EmulationError) as caught:
            add_one[(1,)](x, 16, BLOCK=16)  # the launch line
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("Triton kernel `add_one` launched at test_emulation_gpu.py:")
    assert "--backend gpu" in message
