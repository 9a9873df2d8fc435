"""flashify_checkpoint and the `flashnorm flashify` CLI: atomic output, untouched source, refusals."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402

from safetensors import SafetensorError  # noqa: E402

from flashnorm_kernels.checkpoint import (  # noqa: E402
    CheckpointLoadError,
    CheckpointPathError,
    CheckpointWriteError,
    flashify_checkpoint,
)
from flashnorm_kernels.cli import main  # noqa: E402
from flashnorm_kernels.fold import AlreadyFoldedError, UnsupportedArchitectureError  # noqa: E402
from tests.paths import ROOT  # noqa: E402

TOKENIZER_JSON = '{"version": "1.0", "model": {"type": "WordLevel"}}\n'
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "max_new_tokens": 17}


def _save_tiny_llama(path: Path, dtype=torch.float32, tie: bool = True) -> transformers.PreTrainedModel:
    """A tiny Llama checkpoint (tied embeddings, random gains) with tokenizer and generation files."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=tie,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    (path / "tokenizer.json").write_text(TOKENIZER_JSON)
    (path / "tokenizer_config.json").write_text('{"model_max_length": 64}\n')
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=1) + "\n")
    return model


def _tree_hash(path: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(path)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def src(tmp_path) -> Path:
    _save_tiny_llama(tmp_path / "src")
    return tmp_path / "src"


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_folded_checkpoint_is_complete_and_the_source_untouched(tmp_path):
    original = _save_tiny_llama(tmp_path / "src")
    before = _tree_hash(tmp_path / "src")

    dst = flashify_checkpoint(tmp_path / "src", tmp_path / "out" / ".." / "dst")

    assert dst == (tmp_path / "dst").resolve()
    assert _tree_hash(tmp_path / "src") == before
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]  # no temporary directory left behind
    assert (dst / "tokenizer.json").read_text() == TOKENIZER_JSON
    assert (dst / "tokenizer_config.json").read_bytes() == (tmp_path / "src" / "tokenizer_config.json").read_bytes()
    assert json.loads((dst / "generation_config.json").read_text()) == GENERATION_CONFIG
    config = json.loads((dst / "config.json").read_text())
    assert config["flashnorm"]["folded"] is True and config["flashnorm"]["untied_lm_head"] is True
    assert config["tie_word_embeddings"] is False
    with safe_open(dst / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert torch.all(f.get_tensor("model.norm.weight") == 1)
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), original.model.embed_tokens.weight)
    assert "lm_head.weight" in keys  # the folded head is its own tensor now

    folded = transformers.AutoModelForCausalLM.from_pretrained(dst).eval()
    ids = torch.randint(3, 120, (2, 10), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(folded, ids), _logits(original, ids), rtol=1e-5, atol=1e-5)


def test_checkpoint_dtype_is_kept(tmp_path):
    _save_tiny_llama(tmp_path / "src", dtype=torch.bfloat16)
    dst = flashify_checkpoint(tmp_path / "src", tmp_path / "dst")
    with safe_open(dst / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert json.loads((dst / "config.json").read_text())["dtype"] == "bfloat16"


def test_existing_destination_is_refused(src, tmp_path):
    (tmp_path / "dst").mkdir()  # even an empty one: rename would silently replace it
    with pytest.raises(CheckpointPathError, match="already exists"):
        flashify_checkpoint(src, tmp_path / "dst")
    assert os.listdir(tmp_path / "dst") == []


def test_destination_equal_to_source_is_refused(src):
    before = _tree_hash(src)
    with pytest.raises(CheckpointPathError, match="is the source"):
        flashify_checkpoint(src, src)
    assert _tree_hash(src) == before


@pytest.mark.parametrize("via_symlink", [False, True])
def test_destination_inside_source_is_refused(src, tmp_path, via_symlink):
    before = _tree_hash(src)
    if via_symlink:
        (tmp_path / "link").symlink_to(src)
        dst = tmp_path / "link" / "folded"
    else:
        dst = src / "folded"
    with pytest.raises(CheckpointPathError, match="inside the source"):
        flashify_checkpoint(src, dst)
    assert _tree_hash(src) == before and not (src / "folded").exists()


def test_missing_destination_parent_is_refused(src, tmp_path):
    with pytest.raises(CheckpointPathError, match="does not exist; create it first"):
        flashify_checkpoint(src, tmp_path / "no" / "such" / "dst")


def test_source_that_is_not_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointPathError, match="config.json not found"):
        flashify_checkpoint(tmp_path / "empty", tmp_path / "dst")


def test_already_folded_checkpoint_is_refused(src, tmp_path):
    flashify_checkpoint(src, tmp_path / "once")
    with pytest.raises(AlreadyFoldedError, match="already folded"):
        flashify_checkpoint(tmp_path / "once", tmp_path / "twice")
    assert not (tmp_path / "twice").exists()


def test_unsupported_checkpoint_is_refused_before_loading(tmp_path, monkeypatch):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=128, n_positions=32)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gpt2")

    def no_load(*args, **kwargs):
        raise AssertionError("weights were loaded for an unsupported model type")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'.*llama"):
        flashify_checkpoint(tmp_path / "gpt2", tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def _fail_mid_save(self, save_directory, *args, **kwargs):
    Path(save_directory, "model.safetensors").write_bytes(b"partial")
    raise OSError("disk full (injected)")


def _fail_mid_save_in_safetensors(self, save_directory, *args, **kwargs):
    # What safetensors raises when the disk fills up: a SafetensorError, which is not an OSError.
    Path(save_directory, "model.safetensors").write_bytes(b"partial")
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28) (injected)")


def _fail_copy(*args, **kwargs):
    raise OSError("I/O error (injected)")


def _fail_rename(*args, **kwargs):
    raise OSError("rename failed (injected)")


@pytest.mark.parametrize(
    "target, name, failure",
    [
        (transformers.PreTrainedModel, "save_pretrained", _fail_mid_save),
        (transformers.PreTrainedModel, "save_pretrained", _fail_mid_save_in_safetensors),
        (shutil, "copy2", _fail_copy),
        (os, "rename", _fail_rename),
    ],
    ids=["save", "save-safetensors-error", "copy-extras", "rename"],
)
def test_failure_mid_write_leaves_no_destination(src, tmp_path, monkeypatch, target, name, failure):
    before = _tree_hash(src)
    monkeypatch.setattr(target, name, failure)
    with pytest.raises(CheckpointWriteError, match=r"writing the folded checkpoint .*dst failed \(.*injected"):
        flashify_checkpoint(src, tmp_path / "dst")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["src"]  # neither dst nor the temporary directory
    assert _tree_hash(src) == before


def test_destination_appearing_during_the_fold_is_not_overwritten(src, tmp_path, monkeypatch):
    real_save = transformers.PreTrainedModel.save_pretrained

    def save_then_race(self, save_directory, *args, **kwargs):
        real_save(self, save_directory, *args, **kwargs)
        (tmp_path / "dst").mkdir()  # another process wins the race

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", save_then_race)
    with pytest.raises(CheckpointPathError, match="appeared while folding"):
        flashify_checkpoint(src, tmp_path / "dst")
    assert os.listdir(tmp_path / "dst") == []
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]


# ------------------------------------------------------- damaged or inconsistent source checkpoints

FIXTURES = ROOT / "flashnorm_kernels" / "models"


@pytest.fixture
def zen_copy(tmp_path) -> Path:
    """A copy of the fixture tiny_llama_zen (fp32, untied) that a test may corrupt."""
    return Path(shutil.copytree(FIXTURES / "tiny_llama_zen", tmp_path / "src"))


def _edit_config(src: Path, **changes) -> None:
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (src / "config.json").write_text(json.dumps(config))


def _edit_weights(src: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})


def test_truncated_weights_are_refused_naming_the_file(zen_copy, tmp_path):
    with open(zen_copy / "model.safetensors", "r+b") as f:
        f.truncate(500_000)  # a download cut short: the header promises more bytes than the file has
    with pytest.raises(CheckpointLoadError, match=r"model\.safetensors in .*src is not a complete safetensors file .*truncated"):
        flashify_checkpoint(zen_copy, tmp_path / "dst")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_weights_missing_altogether_are_refused(zen_copy, tmp_path):
    (zen_copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointLoadError, match=r"transformers cannot load .*src \(OSError: .*no file named model\.safetensors"):
        flashify_checkpoint(zen_copy, tmp_path / "dst")
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (
            lambda src: _edit_config(src, intermediate_size=128),
            r"model\.layers\.0\.mlp\.down_proj\.weight is \[96, 256\] in the weights but \[96, 128\] per config\.json"
            r".* \(and 3 more\)",
        ),
        (
            lambda src: _edit_weights(src, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight")),
            r"the weights lack model\.layers\.1\.self_attn\.v_proj\.weight, which config\.json's model needs",
        ),
        (
            lambda src: _edit_config(src, num_hidden_layers=1),
            r"the weights hold model\.layers\.1\.input_layernorm\.weight, .* \(and 6 more\), which config\.json's model has no place for",
        ),
    ],
    ids=["size-mismatch", "missing-tensor", "extra-layer"],
)
def test_config_that_does_not_match_the_weights_is_refused(zen_copy, tmp_path, corrupt, message):
    # transformers would re-initialise these tensors at random (or drop them) and only log it.
    corrupt(zen_copy)
    with pytest.raises(CheckpointLoadError, match=r"config\.json of .*src does not match its weights: " + message):
        flashify_checkpoint(zen_copy, tmp_path / "dst")
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.parametrize(
    "config_bytes, message",
    [
        (b"\xff\xfe\x00garbage", "is not valid JSON"),
        (json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(), "has no model_type"),
    ],
    ids=["not-text", "no-model-type"],
)
def test_unusable_config_json_is_refused(zen_copy, tmp_path, config_bytes, message):
    (zen_copy / "config.json").write_bytes(config_bytes)
    with pytest.raises(CheckpointPathError, match=message):
        flashify_checkpoint(zen_copy, tmp_path / "dst")
    assert sorted(os.listdir(tmp_path)) == ["src"]


# ------------------------------------------------------------- modes and leftover temporary dirs


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002], ids=lambda umask: f"umask-{umask:03o}")
def test_destination_gets_the_modes_of_a_plain_mkdir(src, tmp_path, umask):
    old = os.umask(umask)
    try:
        dst = flashify_checkpoint(src, tmp_path / "dst")
    finally:
        os.umask(old)
    assert stat.S_IMODE(dst.stat().st_mode) == 0o777 & ~umask  # tempfile.mkdtemp gave 0700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in dst.iterdir()}
    assert set(modes) >= {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"}
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)  # safetensors alone writes 0600


def _temp_dirs(parent: Path) -> list[str]:
    return sorted(name for name in os.listdir(parent) if ".flashnorm-tmp-" in name)


# Runs flashify_checkpoint in a child whose save_pretrained ends with "{after_save}".
_CHILD = """
import os, signal, sys
import transformers
from flashnorm_kernels.checkpoint import flashify_checkpoint

real_save = transformers.PreTrainedModel.save_pretrained

def save(self, directory, *args, **kwargs):
    real_save(self, directory, *args, **kwargs)
    {after_save}

transformers.PreTrainedModel.save_pretrained = save
flashify_checkpoint(sys.argv[1], sys.argv[2])
"""


def test_leftover_of_a_killed_run_is_removed_by_the_next_run(src, tmp_path, caplog):
    killed = subprocess.run(
        [sys.executable, "-c", _CHILD.format(after_save="os.kill(os.getpid(), signal.SIGKILL)"), str(src), str(tmp_path / "dst")],
        capture_output=True, text=True, timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [leftover] = _temp_dirs(tmp_path)
    assert leftover.startswith(".dst.flashnorm-tmp-") and (tmp_path / leftover / "model.safetensors").is_file()

    with caplog.at_level(logging.INFO, logger="flashnorm_kernels.checkpoint"):
        flashify_checkpoint(src, tmp_path / "dst")
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]
    assert [r.getMessage() for r in caplog.records] == [f"removed {tmp_path / leftover}, left by an interrupted run."]


def test_only_our_temp_dirs_for_this_destination_are_removed(src, tmp_path):
    (tmp_path / ".dst.flashnorm-tmp-abcd_123").mkdir()  # a tempfile.mkdtemp name, as older versions made
    (tmp_path / ".dst.flashnorm-tmp-0123abcd").mkdir()  # our name today
    kept = [
        ".other.flashnorm-tmp-0123abcd",  # another destination's
        ".dst.flashnorm-tmp-0123abcd-mine",  # not our pattern
        ".dst.flashnorm-tmp-0123",
        "dst.flashnorm-tmp-0123abcd",
    ]
    for name in kept:
        (tmp_path / name).mkdir()
    (tmp_path / ".dst.flashnorm-tmp-ffffffff").write_text("a file, not our directory")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("kept")
    (tmp_path / ".dst.flashnorm-tmp-eeeeeeee").symlink_to(tmp_path / "elsewhere")  # never followed

    flashify_checkpoint(src, tmp_path / "dst")
    assert sorted(os.listdir(tmp_path)) == sorted(
        [*kept, ".dst.flashnorm-tmp-ffffffff", ".dst.flashnorm-tmp-eeeeeeee", "elsewhere", "dst", "src"]
    )
    assert (tmp_path / "elsewhere" / "keep.txt").read_text() == "kept"


def test_temp_dir_of_a_running_fold_is_left_alone(src, tmp_path):
    # The child saves, says so, and waits for a line on stdin before renaming: a fold in progress.
    running = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(after_save="print('saved', flush=True); sys.stdin.readline()"),
         str(src), str(tmp_path / "dst")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert running.stdout.readline() == "saved\n"
        [in_use] = _temp_dirs(tmp_path)

        flashify_checkpoint(src, tmp_path / "dst")
        assert (tmp_path / in_use / "model.safetensors").is_file()  # not taken for a leftover
    finally:
        _, stderr = running.communicate(input="go\n", timeout=300)
    assert "appeared while folding" in stderr  # the running fold lost the race and cleaned up after itself
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]


def test_leftover_that_cannot_be_removed_is_reported(src, tmp_path, monkeypatch, caplog):
    (tmp_path / ".dst.flashnorm-tmp-0123abcd").mkdir()

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied (injected)", str(path))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    with caplog.at_level(logging.INFO, logger="flashnorm_kernels.checkpoint"):
        dst = flashify_checkpoint(src, tmp_path / "dst")
    assert dst.is_dir()
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    leftover = tmp_path / ".dst.flashnorm-tmp-0123abcd"
    assert record.getMessage() == (
        f"warning: could not remove {leftover}, left by an interrupted run "
        f"([Errno 13] Permission denied (injected): '{leftover}'); remove it by hand."
    )


# -------------------------------------------------------------------------------------- CLI


def test_cli_main_folds_and_returns_zero(src, tmp_path, capsys):
    assert main(["flashify", str(src), str(tmp_path / "dst")]) == 0
    assert "wrote folded checkpoint" in capsys.readouterr().out
    assert json.loads((tmp_path / "dst" / "config.json").read_text())["flashnorm"]["folded"] is True


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda src, tmp: [str(src), str(src / "inside")], "inside the source"),
        (lambda src, tmp: [str(tmp / "nowhere"), str(tmp / "dst")], "does not exist"),
        (lambda src, tmp: [str(src), str(src.parent)], "already exists"),
    ],
    ids=["dst-inside-src", "missing-src", "dst-exists"],
)
def test_cli_errors_go_to_stderr_with_exit_code_2(src, tmp_path, capsys, make_args, message):
    assert main(["flashify", *make_args(src, tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("flashnorm flashify: error:") and message in captured.err


def test_cli_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["flashify", "only-one-arg"])
    assert info.value.code == 2
    assert main([]) == 2  # no command: help on stderr
    assert "flashify" in capsys.readouterr().err


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("flashnorm")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "flashnorm_kernels.cli"]  # not installed: same main()


def test_console_script_help_and_fold(src, tmp_path):
    help_run = subprocess.run([*_console_script(), "--help"], capture_output=True, text=True, timeout=120)
    assert help_run.returncode == 0 and "flashify" in help_run.stdout

    run = subprocess.run(
        [*_console_script(), "flashify", str(src), str(tmp_path / "dst")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "dst" / "model.safetensors").is_file()

    again = subprocess.run(
        [*_console_script(), "flashify", str(src), str(tmp_path / "dst")], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 2
    assert "already exists" in again.stderr


def test_every_file_and_directory_is_on_disk_before_and_after_the_rename(src, tmp_path, monkeypatch):
    # Without fsync before the rename, a crash of the machine can leave DST with files of zero length.
    events = []
    fsync, rename = os.fsync, os.rename

    def recorded_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def recorded_rename(old, new):
        events.append(("rename", str(new)))
        return rename(old, new)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("names the synced files through /proc (Linux)")
    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "rename", recorded_rename)
    dst = flashify_checkpoint(src, tmp_path / "dst")
    at = events.index(("rename", str(dst)))
    synced_before = {os.path.basename(path) for kind, path in events[:at] if kind == "fsync"}
    assert set(os.listdir(dst)) <= synced_before  # each file of the checkpoint
    assert any(name.startswith(".dst.flashnorm-tmp-") for name in synced_before)  # and its directory
    assert ("fsync", str(tmp_path)) in events[at:]  # the parent, which holds the new name
