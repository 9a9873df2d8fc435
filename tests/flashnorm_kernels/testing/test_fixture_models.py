"""The tiny Zen-reciting fixture models: exact long greedy generation, and clear
errors for missing / damaged fixture directories."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashnorm_kernels.testing import fixtures as fx

N_TOKENS = 1024


# ---------------------------------------------------------------------------
# text helpers (no torch needed)
# ---------------------------------------------------------------------------


def test_import_does_not_import_torch():
    code = "import sys, flashnorm_kernels.testing.fixtures; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(fx.__file__).parents[2])


def test_zen_text_and_cycle():
    zen = fx.zen_text()
    assert zen.startswith(fx.PROMPT)
    assert zen.rstrip().endswith("let's do more of those!")
    cyc = fx.cycle_bytes()
    assert cyc == (zen + fx.SEPARATOR).encode()
    period = len(cyc)
    # wraps around the cycle boundary
    assert fx.cyclic_bytes(period - 2, 9) == b"\n\nThe Zen"
    assert fx.cyclic_bytes(0, 3 * period) == cyc * 3
    assert fx.expected_continuation(len(fx.PROMPT), 9) == b"Beautiful"


def test_encode_decode_roundtrip():
    text = fx.zen_text()
    ids = fx.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert len(ids) == len(text.encode())
    assert fx.decode(ids) == text
    assert fx.encode(b"\x00\xff") == [0, 255]
    assert fx.decode([0xE2, 0x82, 0xAC]) == "\u20ac"


# ---------------------------------------------------------------------------
# the models
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", fx.FIXTURE_NAMES)
def test_greedy_generation_reproduces_cyclic_zen(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch

    # Token-by-token decoding of a 96-wide model is all tiny ops: extra intra-op
    # threads only add synchronisation (and are much slower on a busy machine).
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _check_generation(name)
    finally:
        torch.set_num_threads(prev_threads)


def _check_generation(name):
    import torch

    model = fx.load_fixture_model(name)
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32

    t0 = time.perf_counter()
    got = fx.greedy_generate(model, fx.PROMPT, N_TOKENS)
    secs = time.perf_counter() - t0
    expected = fx.expected_continuation(len(fx.encode(fx.PROMPT)), N_TOKENS)
    if got != expected:
        bad = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        pytest.fail(
            f"{name}: mismatch at new token {bad} of {N_TOKENS} (len {len(got)}): "
            f"got {fx.decode(got[bad:bad + 40])!r}, expected {fx.decode(expected[bad:bad + 40])!r}"
        )
    print(f"{name}: {N_TOKENS} greedy tokens in {secs:.2f}s")

    meta = fx.load_fixture_metadata(name)
    assert meta["prompt"] == fx.PROMPT
    assert meta["tokens_verified"] >= N_TOKENS
    assert meta["expected_sha256"] == hashlib.sha256(expected).hexdigest()
    assert meta["zen_sha256"] == hashlib.sha256(fx.zen_text().encode()).hexdigest()


@pytest.mark.parametrize("name", fx.FIXTURE_NAMES)
def test_fixture_files_are_small_and_well_formed(name):
    path = fx.fixture_dir(name)
    for f in ("config.json", "generation_config.json", "model.safetensors", "metadata.json"):
        assert (path / f).is_file(), f
    assert (path / "model.safetensors").stat().st_size <= 5 * 1024 * 1024
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["vocab_size"] == 256
    assert cfg["max_position_embeddings"] >= 2048
    assert cfg["tie_word_embeddings"] is False
    eos = cfg["eos_token_id"]
    assert eos not in fx.cycle_bytes(), "EOS must be a byte that never occurs in the text"


# ---------------------------------------------------------------------------
# missing / damaged fixtures
# ---------------------------------------------------------------------------


def test_missing_fixture_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        fx.fixture_dir("tiny_llama_zen", root=tmp_path)
    msg = str(ei.value)
    assert str(tmp_path / "tiny_llama_zen") in msg
    assert "fixtures/train_tiny_model.py --arch llama --out" in msg
    with pytest.raises(FileNotFoundError):
        fx.load_fixture_model("tiny_qwen3_zen", root=tmp_path)


@pytest.fixture
def llama_copy(tmp_path):
    src = fx.fixture_dir("tiny_llama_zen")
    dst = tmp_path / "tiny_llama_zen"
    shutil.copytree(src, dst)
    return dst


def test_copied_fixture_loads_from_other_root(llama_copy):
    assert fx.fixture_dir("tiny_llama_zen", root=llama_copy.parent) == llama_copy


def test_missing_weights_is_corrupt(llama_copy):
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(fx.FixtureCorruptError, match="missing model.safetensors") as ei:
        fx.fixture_dir("tiny_llama_zen", root=llama_copy.parent)
    assert str(llama_copy) in str(ei.value)
    assert "train_tiny_model.py" in str(ei.value)


def test_unreadable_config_is_corrupt(llama_copy):
    (llama_copy / "config.json").write_text("{ not json")
    with pytest.raises(fx.FixtureCorruptError, match="config.json"):
        fx.fixture_dir("tiny_llama_zen", root=llama_copy.parent)


def test_truncated_weights_are_corrupt(llama_copy):
    w = llama_copy / "model.safetensors"
    data = w.read_bytes()
    w.write_bytes(data[: len(data) // 2])
    with pytest.raises(fx.FixtureCorruptError, match="truncated"):
        fx.fixture_dir("tiny_llama_zen", root=llama_copy.parent)
    with pytest.raises(fx.FixtureCorruptError):
        fx.load_fixture_model("tiny_llama_zen", root=llama_copy.parent)


def test_garbage_weights_are_corrupt(llama_copy):
    (llama_copy / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header!!!!")
    with pytest.raises(fx.FixtureCorruptError, match="model.safetensors"):
        fx.fixture_dir("tiny_llama_zen", root=llama_copy.parent)


def test_weights_with_wrong_shapes_fail_to_load(llama_copy):
    """Structurally valid safetensors whose tensors do not fit the config."""
    pytest.importorskip("torch")
    import torch
    from safetensors.torch import load_file, save_file

    w = llama_copy / "model.safetensors"
    tensors = load_file(str(w))
    key = next(k for k in tensors if k.endswith("embed_tokens.weight"))
    tensors[key] = torch.zeros(7, 3)
    save_file(tensors, str(w), metadata={"format": "pt"})
    fx.fixture_dir("tiny_llama_zen", root=llama_copy.parent)  # structure is fine
    with pytest.raises(fx.FixtureCorruptError, match="could not be loaded"):
        fx.load_fixture_model("tiny_llama_zen", root=llama_copy.parent)


def test_missing_tensor_is_corrupt(llama_copy):
    """transformers would silently re-initialise a missing weight; the loader refuses."""
    pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    w = llama_copy / "model.safetensors"
    tensors = load_file(str(w))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(w), metadata={"format": "pt"})
    with pytest.raises(fx.FixtureCorruptError, match="missing_keys"):
        fx.load_fixture_model("tiny_llama_zen", root=llama_copy.parent)
