"""Fold a checkpoint directory on disk: load, flashify, save next to the destination, rename.

The destination appears all at once (a rename of a finished temporary directory on the same
filesystem) or not at all, and the source is only ever read.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .fold import AlreadyFoldedError, FlashNormError, flashify, is_folded, layout_for

# Copied verbatim when present: the folded weights change nothing about tokenization, and the
# source's generation_config.json replaces the one save_pretrained regenerates.
EXTRA_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "generation_config.json",
)


class CheckpointPathError(FlashNormError):
    """The source or destination directory is unusable (missing, existing, overlapping)."""


def flashify_checkpoint(src_dir: str | os.PathLike, dst_dir: str | os.PathLike) -> Path:
    """Write a folded copy of the checkpoint ``src_dir`` to the new directory ``dst_dir``.

    Loads with ``AutoModelForCausalLM.from_pretrained(src_dir, dtype="auto")`` on the CPU (the
    checkpoint's dtype is kept), folds with :func:`flashify`, saves safetensors with
    ``save_pretrained`` into a temporary directory next to ``dst_dir``, copies tokenizer files and
    generation_config.json, then renames the temporary directory to ``dst_dir``.

    Refuses (CheckpointPathError) if ``dst_dir`` exists, equals or lies inside ``src_dir``, or its
    parent does not exist; refuses (AlreadyFoldedError) a checkpoint whose config.json is marked
    folded; raises UnsupportedArchitectureError before loading any weights for unsupported model
    types. On any failure the temporary directory is removed and ``dst_dir`` does not exist.
    Returns the absolute destination path.
    """
    src, dst = _check_paths(Path(src_dir), Path(dst_dir))
    config = _read_config(src)
    layout_for(config.get("model_type"))  # fail on unsupported types before the (slow) load
    if is_folded(config):
        raise AlreadyFoldedError(
            f"flashify_checkpoint: {src} is already folded (config.json flashnorm={config['flashnorm']!r}); "
            "folding twice is refused. Use the checkpoint as it is."
        )

    from transformers import AutoModelForCausalLM  # heavy import, only when there is work to do

    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")  # CPU by default
    flashify(model)

    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.flashnorm-tmp-", dir=dst.parent))
    try:
        model.save_pretrained(tmp)
        for name in EXTRA_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
        if dst.exists():  # created by someone else while we worked; rename would replace an empty dir
            raise CheckpointPathError(f"flashify_checkpoint: destination {dst} appeared while folding; not overwriting it.")
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _check_paths(src: Path, dst: Path) -> tuple[Path, Path]:
    # resolve() follows symlinks, so a dst reached through a link into src is still caught.
    src, dst = src.resolve(), dst.resolve()
    if not src.is_dir():
        raise CheckpointPathError(f"flashify_checkpoint: source {src} is not a directory; pass a checkpoint directory.")
    if dst == src or src in dst.parents:
        raise CheckpointPathError(
            f"flashify_checkpoint: destination {dst} is {'the source' if dst == src else 'inside the source'} "
            f"{src}; the source is never written to. Choose a destination outside it."
        )
    if dst.exists() or dst.is_symlink():
        raise CheckpointPathError(f"flashify_checkpoint: destination {dst} already exists; remove it or choose a new path.")
    if not dst.parent.is_dir():
        raise CheckpointPathError(f"flashify_checkpoint: parent directory {dst.parent} of the destination does not exist; create it first.")
    return src, dst


def _read_config(src: Path) -> dict:
    path = src / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointPathError(f"flashify_checkpoint: {path} not found; {src} is not a transformers checkpoint.") from None
    except json.JSONDecodeError as e:
        raise CheckpointPathError(f"flashify_checkpoint: {path} is not valid JSON ({e}).") from None
    if not isinstance(config, dict):
        raise CheckpointPathError(f"flashify_checkpoint: {path} does not hold a JSON object.")
    return config
