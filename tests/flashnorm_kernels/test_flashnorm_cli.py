"""The `flashnorm` CLI on bad input and on the side: one stderr line and exit 2, nothing written, quiet
dependencies, --version, notes about leftover temporary directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import transformers  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from flashnorm_kernels.cli import main  # noqa: E402
from tests.paths import ROOT  # noqa: E402
from tests.sigint import sigint_from_a_terminal  # noqa: E402

FIXTURES = ROOT / "flashnorm_kernels" / "models"


@pytest.fixture
def src(tmp_path) -> Path:
    """A copy of the fixture tiny_llama_zen that a test may corrupt (the package's copy is never written)."""
    return Path(shutil.copytree(FIXTURES / "tiny_llama_zen", tmp_path / "src"))


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("flashnorm")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "flashnorm_kernels.cli"]  # not installed: same main()


def _edit_config(src: Path, **changes) -> None:
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (src / "config.json").write_text(json.dumps(config))


def _truncate_weights(src: Path) -> None:
    with open(src / "model.safetensors", "r+b") as f:
        f.truncate(500_000)


def _not_a_checkpoint(src: Path) -> None:
    (src / "config.json").unlink()


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"flashnorm {metadata.version('streamcheck')}\n"


@pytest.mark.parametrize(
    "corrupt, src_arg, message",
    [
        (_truncate_weights, "src", "model.safetensors in {src} is not a complete safetensors file"),
        (lambda src: _edit_config(src, intermediate_size=128), "src", "config.json of {src} does not match its weights"),
        (lambda src: (src / "model.safetensors").unlink(), "src", "transformers cannot load {src} (OSError"),
        (_not_a_checkpoint, "src", "{src}/config.json not found; {src} is not a transformers checkpoint"),
        (lambda src: _edit_config(src, model_type="bert"), "src", "model_type 'bert' is not supported"),
        (lambda src: None, "src/model.safetensors", "source {src}/model.safetensors is not a directory"),
        (lambda src: None, "nowhere", "source {tmp}/nowhere does not exist"),
    ],
    ids=["truncated-weights", "size-mismatch", "no-weights", "no-config", "unsupported-arch", "file-as-src", "missing-src"],
)
def test_bad_source_is_one_line_on_stderr_exit_2_and_nothing_written(src, tmp_path, capsys, corrupt, src_arg, message):
    corrupt(src)
    before = sorted(os.listdir(tmp_path))
    assert main(["flashify", str(tmp_path / src_arg), str(tmp_path / "dst")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("flashnorm flashify: error: ")
    assert message.format(src=src, tmp=tmp_path) in captured.err
    assert sorted(os.listdir(tmp_path)) == before  # no destination, no temporary directory


def test_write_failure_in_safetensors_is_one_line_exit_2_and_nothing_written(src, tmp_path):
    # A real failed write: a file-size limit makes the kernel refuse the weights file half-way
    # (EFBIG), which safetensors reports as SafetensorError, not OSError.
    resource = pytest.importorskip("resource")
    import signal

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    run = subprocess.run(
        [*_console_script(), "flashify", str(src), str(tmp_path / "dst")],
        capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"flashnorm flashify: error: flashify_checkpoint: writing the folded checkpoint {tmp_path / 'dst'} failed (")
    assert "File too large" in run.stderr and "nothing was written" in run.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_interrupt_while_saving_exits_130_and_writes_nothing(src, tmp_path, monkeypatch, capsys):
    def interrupted_save(self, directory, *args, **kwargs):
        Path(directory, "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", interrupted_save)
    assert main(["flashify", str(src), str(tmp_path / "dst")]) == 130
    assert capsys.readouterr().err == f"flashnorm flashify: interrupted; {tmp_path / 'dst'} was not written.\n"
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_fold_prints_one_line_and_no_progress_bars(src, tmp_path, capsys):
    bars_before = transformers_logging.is_progress_bar_enabled()
    verbosity_before = transformers_logging.get_verbosity()
    assert main(["flashify", str(src), str(tmp_path / "dst")]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"flashnorm flashify: wrote folded checkpoint {tmp_path / 'dst'}\n"
    assert captured.err == ""  # no "Loading weights" / "Writing model shards" bars
    # main() gives transformers its settings back for whoever called it.
    assert transformers_logging.is_progress_bar_enabled() == bars_before
    assert transformers_logging.get_verbosity() == verbosity_before


def test_console_script_fold_is_quiet_on_stderr(src, tmp_path):
    run = subprocess.run(
        [*_console_script(), "flashify", str(src), str(tmp_path / "dst")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0
    assert run.stderr == ""
    assert run.stdout == f"flashnorm flashify: wrote folded checkpoint {tmp_path / 'dst'}\n"


def test_leftover_temp_dirs_are_reported_one_line_each(src, tmp_path, monkeypatch, capsys):
    (tmp_path / ".dst.flashnorm-tmp-0123abcd").mkdir()
    (tmp_path / ".dst.flashnorm-tmp-4567abcd").mkdir()
    real_rmtree = shutil.rmtree

    def rmtree_refusing_one(path, *args, **kwargs):
        if str(path).endswith("4567abcd"):
            raise PermissionError(13, "Permission denied", str(path))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree_refusing_one)
    assert main(["flashify", str(src), str(tmp_path / "dst")]) == 0
    removed, refused = tmp_path / ".dst.flashnorm-tmp-0123abcd", tmp_path / ".dst.flashnorm-tmp-4567abcd"
    assert capsys.readouterr().err == (
        f"flashnorm flashify: removed {removed}, left by an interrupted run.\n"
        f"flashnorm flashify: warning: could not remove {refused}, left by an interrupted run "
        f"([Errno 13] Permission denied: '{refused}'); remove it by hand.\n"
    )
    assert sorted(os.listdir(tmp_path)) == [".dst.flashnorm-tmp-4567abcd", "dst", "src"]


# --- Ctrl-C wherever it lands: one line that says what is on disk, exit 130 ---------------


def _snapshot(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _sigint_here() -> None:
    """A real SIGINT to this process, handled before this returns (as a Ctrl-C lands)."""
    import signal
    import time

    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)  # the handler raises KeyboardInterrupt out of the sleep


def test_ctrl_c_just_after_the_rename_says_dst_is_complete(src, tmp_path, monkeypatch, capsys):
    before = _snapshot(src)
    rename = os.rename

    def rename_then_ctrl_c(old, new):
        rename(old, new)
        _sigint_here()

    monkeypatch.setattr(os, "rename", rename_then_ctrl_c)
    dst = tmp_path / "dst"
    with sigint_from_a_terminal():
        assert main(["flashify", str(src), str(dst)]) == 130
    assert capsys.readouterr().err == f"flashnorm flashify: interrupted after {dst} was written; it is complete.\n"
    assert json.loads((dst / "config.json").read_text())["flashnorm"]  # the folded checkpoint, whole
    assert {"config.json", "model.safetensors", "generation_config.json"} <= set(os.listdir(dst))
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]  # no temporary directory left
    assert _snapshot(src) == before


def test_ctrl_c_that_a_lazy_import_turns_into_another_error_is_still_an_interrupt(src, tmp_path, monkeypatch,
                                                                                 capsys):
    # transformers' lazy modules catch what an interrupted import raises and report a missing
    # module; the checkpoint is not to blame.
    def interrupted_import(*args, **kwargs):
        try:
            _sigint_here()
        except KeyboardInterrupt:
            raise ModuleNotFoundError("Could not import module 'LlamaForCausalLM'") from None

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", interrupted_import)
    with sigint_from_a_terminal():
        assert main(["flashify", str(src), str(tmp_path / "dst")]) == 130
    assert capsys.readouterr().err == f"flashnorm flashify: interrupted; {tmp_path / 'dst'} was not written.\n"
    assert sorted(os.listdir(tmp_path)) == ["src"]


def _with_fault(fault: str) -> dict:
    """The environment of a run that gets a real signal at `fault` (tests/fault_injection)."""
    from tests.paths import FAULT_INJECTION

    path = os.pathsep.join(filter(None, [str(FAULT_INJECTION), str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, STREAMCHECK_TEST_FAULT=fault)


def test_ctrl_c_during_the_start_up_imports_gives_one_line(src, tmp_path):
    before = _snapshot(src)
    with sigint_from_a_terminal():
        done = subprocess.run([sys.executable, "-m", "flashnorm_kernels.cli", "flashify", str(src),
                               str(tmp_path / "dst")], env=_with_fault("INT import torch"), capture_output=True,
                              text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, f"flashnorm flashify: interrupted; {tmp_path / 'dst'} was not written.\n")
    assert sorted(os.listdir(tmp_path)) == ["src"]
    assert _snapshot(src) == before


def test_ctrl_c_at_interpreter_exit_gives_one_line_not_a_traceback(tmp_path):
    # After every atexit callback (torch's clean-up among them).
    with sigint_from_a_terminal():
        done = subprocess.run([sys.executable, "-m", "flashnorm_kernels.cli", "--version"],
                              env=_with_fault("INT atexit"), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("flashnorm ")
    assert (done.returncode, done.stderr) == (130, "flashnorm: interrupted; nothing was written.\n")
