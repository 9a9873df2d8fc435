"""The long-generation symptom on a real GPU: the pipeline's kernels on CuPy streams, the
stale read made to strike by a bounded spin kernel before layer 0's matmul."""
import pytest

from flashnorm_kernels.commands.repro import strike_policy
from flashnorm_kernels.generation import check_generation, run_generation
from flashnorm_kernels.plan import SyncPlan
from flashnorm_kernels.testing.fixtures import PROMPT, decode, encode, expected_continuation, load_fixture_model
from streamcheck.device.backends import gpu_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU and CuPy (pip install 'streamcheck[gpu]')"),
]
PROMPT_IDS = encode(PROMPT)


@pytest.fixture(scope="module")
def model():
    return load_fixture_model("tiny_llama_zen")


@pytest.fixture(scope="module")
def reference(model):
    run = run_generation(model, PROMPT_IDS, 96, SyncPlan.correct(), backend="cupy", policy="sequential")
    assert bytes(run.tokens) == expected_continuation(len(PROMPT_IDS), 96)
    return run


# Without a delay the race must not strike, which another worker sharing the GPU can make it.
@pytest.mark.streamcheck_gpu_timing
def test_implicit_join_hides_without_delay_but_is_flagged(model, reference):
    run = run_generation(model, PROMPT_IDS, 96, SyncPlan.implicit_join(), backend="cupy", policy="eager")
    assert run.tokens == reference.tokens
    assert any(r.kind == "RAW" and r.buffer.endswith(".Y") for r in run.races), run.report()


@pytest.mark.streamcheck_gpu_timing  # the lag share: strikes other than the injected ones would lower it
@pytest.mark.parametrize("seed", [0, 7])
def test_spin_delay_makes_it_strike_with_a_one_step_lag(model, reference, seed):
    result = check_generation(model, PROMPT_IDS, 96, SyncPlan.implicit_join(), backend="cupy", policy="delay",
                              seed=seed, reference=reference, **strike_policy("cupy", seed))
    assert not result.comparison.matches
    assert result.comparison.first_divergence < 32
    assert result.comparison.lag1_share > 0.5, result.message(decode)


def test_correct_plan_survives_the_spin_delay(model, reference):
    result = check_generation(model, PROMPT_IDS, 96, SyncPlan.correct(), backend="cupy", policy="delay", seed=0,
                              reference=reference, **strike_policy("cupy", 0))
    assert result.comparison.matches, result.message(decode)
    assert result.candidate.races == []
