"""Fold a checkpoint directory on disk: load, flashify, save next to the destination, rename.

The destination appears all at once (a rename of a finished temporary directory on the same
filesystem) or not at all, and the source is only ever read.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

from safetensors import SafetensorError, safe_open

from streamcheck.atomic_files import sync_directory, sync_tree

from .fold import AlreadyFoldedError, FlashNormError, flashify, is_folded, layout_for

logger = logging.getLogger(__name__)

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

# Names shown for a mismatch between config.json and the weights before "(and N more)".
_KEYS_SHOWN = 3


class CheckpointPathError(FlashNormError):
    """The source or destination directory is unusable (missing, existing, overlapping)."""


class CheckpointLoadError(FlashNormError):
    """The source cannot be loaded as it is: damaged weight files, or config.json and the weights disagree."""


class CheckpointWriteError(FlashNormError):
    """Writing the folded checkpoint failed (disk full, permissions); nothing was left behind."""


def flashify_checkpoint(src_dir: str | os.PathLike, dst_dir: str | os.PathLike) -> Path:
    """Write a folded copy of the checkpoint ``src_dir`` to the new directory ``dst_dir``.

    Loads with ``AutoModelForCausalLM.from_pretrained(src_dir, dtype="auto")`` on the CPU (the
    checkpoint's dtype is kept), folds with :func:`flashify`, saves safetensors with
    ``save_pretrained`` into a temporary directory next to ``dst_dir``, copies tokenizer files and
    generation_config.json, then renames the temporary directory to ``dst_dir``. The destination
    and its files get the modes a plain ``mkdir`` / ``open`` would give under the current umask.

    Refuses (CheckpointPathError) if ``dst_dir`` exists, equals or lies inside ``src_dir``, or its
    parent does not exist; refuses (AlreadyFoldedError) a checkpoint whose config.json is marked
    folded; raises UnsupportedArchitectureError before loading any weights for unsupported model
    types; raises CheckpointLoadError for damaged weight files or weights that do not match
    config.json (missing, unexpected or differently shaped tensors), CheckpointWriteError when
    writing fails. On any failure the temporary directory is removed and ``dst_dir`` does not exist.

    Temporary directories for ``dst_dir`` left by an interrupted run are removed first (logged at
    INFO; one that cannot be removed is logged as a warning). Returns the absolute destination path.
    """
    src, dst = _check_paths(Path(src_dir), Path(dst_dir))
    config = _read_config(src)
    if "model_type" not in config:
        raise CheckpointPathError(
            f"flashify_checkpoint: {src / 'config.json'} has no model_type; it is not a transformers model config."
        )
    layout_for(config["model_type"])  # fail on unsupported types before the (slow) load
    if is_folded(config):
        raise AlreadyFoldedError(
            f"flashify_checkpoint: {src} is already folded (config.json flashnorm={config['flashnorm']!r}); "
            "folding twice is refused. Use the checkpoint as it is."
        )
    _remove_leftover_temp_dirs(dst)
    model = _load_model(src)
    flashify(model)
    _write_atomically(model, src, dst)
    return dst


def _check_paths(src: Path, dst: Path) -> tuple[Path, Path]:
    # resolve() follows symlinks, so a dst reached through a link into src is still caught.
    try:
        src, dst = src.resolve(), dst.resolve()
    except (OSError, RuntimeError) as e:  # Python < 3.13 reports a symlink loop as RuntimeError
        raise CheckpointPathError(f"flashify_checkpoint: cannot resolve {src} or {dst} ({_one_line(e)}).") from None
    if not src.exists():
        raise CheckpointPathError(f"flashify_checkpoint: source {src} does not exist; pass a checkpoint directory.")
    if not src.is_dir():
        raise CheckpointPathError(
            f"flashify_checkpoint: source {src} is not a directory; pass the checkpoint directory that holds config.json."
        )
    if dst == src or src in dst.parents:
        raise CheckpointPathError(
            f"flashify_checkpoint: destination {dst} is {'the source' if dst == src else 'inside the source'} "
            f"{src}; the source is never written to. Choose a destination outside it."
        )
    if dst.exists() or dst.is_symlink():
        raise CheckpointPathError(f"flashify_checkpoint: destination {dst} already exists; remove it or choose a new path.")
    if not dst.parent.exists():
        raise CheckpointPathError(f"flashify_checkpoint: parent directory {dst.parent} of the destination does not exist; create it first.")
    if not dst.parent.is_dir():
        raise CheckpointPathError(f"flashify_checkpoint: parent {dst.parent} of the destination is not a directory; choose another destination.")
    return src, dst


def _read_config(src: Path) -> dict:
    path = src / "config.json"
    try:
        config = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointPathError(f"flashify_checkpoint: {path} not found; {src} is not a transformers checkpoint.") from None
    except OSError as e:
        raise CheckpointPathError(f"flashify_checkpoint: cannot read {path} ({_one_line(e)}).") from None
    except ValueError as e:  # JSONDecodeError, or bytes that are no text at all (UnicodeDecodeError)
        raise CheckpointPathError(f"flashify_checkpoint: {path} is not valid JSON ({_one_line(e)}).") from None
    if not isinstance(config, dict):
        raise CheckpointPathError(f"flashify_checkpoint: {path} does not hold a JSON object.")
    return config


def _load_model(src: Path):
    from transformers import AutoModelForCausalLM  # heavy import, only when there is work to do

    try:
        # ignore_mismatched_sizes=True makes transformers return instead of raising after its report,
        # so _check_weights_match_config can name the tensors itself.
        model, loading_info = AutoModelForCausalLM.from_pretrained(
            src, dtype="auto", ignore_mismatched_sizes=True, output_loading_info=True
        )  # CPU by default
    except SafetensorError as e:
        damaged = ", ".join(_unreadable_weight_files(src)) or "a weight file"
        raise CheckpointLoadError(
            f"flashify_checkpoint: {damaged} in {src} is not a complete safetensors file ({_one_line(e)}); "
            "it is truncated or damaged. Copy or download it again."
        ) from e
    except Exception as e:
        # transformers reports an unloadable checkpoint as OSError (no weights), RuntimeError or one of
        # several config validation errors; each means this input cannot be loaded as it is.
        raise CheckpointLoadError(
            f"flashify_checkpoint: transformers cannot load {src} ({type(e).__name__}: {_one_line(e)}); "
            "check that config.json and the weight files are complete and belong together."
        ) from e
    _check_weights_match_config(src, loading_info)
    return model


def _unreadable_weight_files(src: Path) -> list[str]:
    unreadable = []
    for path in sorted(src.glob("*.safetensors")):
        try:
            with safe_open(path, framework="pt"):
                pass
        except (SafetensorError, OSError):
            unreadable.append(path.name)
    return unreadable


def _check_weights_match_config(src: Path, loading_info: dict) -> None:
    # transformers has already dropped the keys it knows to be harmless (old rotary buffers, tied heads);
    # what is left would be re-initialised at random or dropped, so the "folded" model would not be the source's.
    problems = []
    mismatched = sorted(loading_info["mismatched_keys"])
    if mismatched:
        shown = "; ".join(
            f"{key} is {list(in_weights)} in the weights but {list(in_config)} per config.json"
            for key, in_weights, in_config in mismatched[:_KEYS_SHOWN]
        )
        problems.append(shown + _and_more(mismatched))
    missing = sorted(loading_info["missing_keys"])
    if missing:
        problems.append(f"the weights lack {', '.join(missing[:_KEYS_SHOWN])}{_and_more(missing)}, which config.json's model needs")
    unexpected = sorted(loading_info["unexpected_keys"])
    if unexpected:
        problems.append(
            f"the weights hold {', '.join(unexpected[:_KEYS_SHOWN])}{_and_more(unexpected)}, which config.json's model has no place for"
        )
    if problems:
        raise CheckpointLoadError(
            f"flashify_checkpoint: config.json of {src} does not match its weights: {'; '.join(problems)}. "
            "Fix config.json (or use the weights it was written for) and run again."
        )


def _and_more(items: list) -> str:
    return f" (and {len(items) - _KEYS_SHOWN} more)" if len(items) > _KEYS_SHOWN else ""


def _temp_dir_pattern(dst: Path) -> re.Pattern:
    # Ours are ".DST.flashnorm-tmp-" plus 8 characters: token_hex(4) now, tempfile.mkdtemp's [a-z0-9_] before.
    return re.compile(re.escape(f".{dst.name}.flashnorm-tmp-") + r"[a-z0-9_]{8}")


def _create_temp_dir(dst: Path) -> tuple[Path, int]:
    """Create and lock a temporary directory next to ``dst``; return it and the lock's descriptor."""
    for _ in range(100):
        tmp = dst.parent / f".{dst.name}.flashnorm-tmp-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp)  # mode 0o777 minus the umask, as any mkdir (tempfile.mkdtemp would give 0700)
        except FileExistsError:
            continue
        # While we hold the lock, a later run into the same parent knows the directory is in use, not
        # left over; the kernel drops the lock when this process dies, however it dies.
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            os.rmdir(tmp)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another run took it for a leftover in the instant since mkdir, and removes it
            os.close(fd)
            continue
        except OSError:  # no locks on this filesystem: fold anyway, unlocked
            pass
        return tmp, fd
    raise FileExistsError(f"no free temporary directory name for {dst} after 100 tries")


def _remove_leftover_temp_dirs(dst: Path) -> None:
    """Remove our temporary directories for ``dst`` that no running fold holds (a killed run's)."""
    pattern = _temp_dir_pattern(dst)
    try:
        entries = sorted(os.scandir(dst.parent), key=lambda entry: entry.name)
    except OSError:
        return  # an unreadable parent: writing there fails next and says so
    for entry in entries:
        if not pattern.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a fold into the same destination is running now and owns it
                os.close(fd)
                continue
            try:
                shutil.rmtree(entry.path)
            finally:
                os.close(fd)
        except OSError as e:
            logger.warning(
                "warning: could not remove %s, left by an interrupted run (%s); remove it by hand.", entry.path, _one_line(e)
            )
        else:
            logger.info("removed %s, left by an interrupted run.", entry.path)


def _write_atomically(model, src: Path, dst: Path) -> None:
    try:
        tmp, lock_fd = _create_temp_dir(dst)
    except OSError as e:
        raise CheckpointWriteError(
            f"flashify_checkpoint: cannot create a temporary directory in {dst.parent} ({_one_line(e)}); "
            "make it writable or choose another destination."
        ) from e
    try:
        model.save_pretrained(tmp)
        for name in EXTRA_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
        _give_plain_file_modes(tmp)
        # On disk before the rename: otherwise a crash of the machine can leave DST with empty files.
        sync_tree(tmp)
        if dst.exists() or dst.is_symlink():  # created by someone else while we worked; rename would replace an empty dir
            raise CheckpointPathError(f"flashify_checkpoint: destination {dst} appeared while folding; not overwriting it.")
        os.rename(tmp, dst)
        sync_directory(dst.parent)  # the new name itself
    except (OSError, SafetensorError) as e:  # safetensors reports a failed write (disk full) as SafetensorError
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(
            f"flashify_checkpoint: writing the folded checkpoint {dst} failed ({_one_line(e)}); nothing was written. "
            f"Free disk space or fix permissions in {dst.parent} and run again."
        ) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock_fd)


def _give_plain_file_modes(tmp: Path) -> None:
    # os.mkdir applied the umask (or the parent's default ACL) to tmp; a file a plain open() creates
    # there gets the same bits without execute. safetensors writes its files 0600 and copy2 keeps the
    # source's mode, so without this the weights would be readable by their owner only.
    file_mode = stat.S_IMODE(tmp.stat().st_mode) & 0o666
    for path in tmp.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(file_mode)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
