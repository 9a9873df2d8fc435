"""Tiny byte-level fixture models that recite the Zen of Python cyclically.

The fixtures are package data, ``flashnorm_kernels/models/<name>/`` (installed with the
package, so ``streamcheck repro implicit-join`` runs from a wheel), produced by the
repository's ``fixtures/train_tiny_model.py``.  They are used by long-generation
tests: greedy decoding from :data:`PROMPT` must reproduce the cyclic Zen text byte
for byte, so any corruption of activations or KV cache (e.g. a stream race in a
kernel under test) shows up as a text mismatch.

Tokenisation is byte level: token id == byte value (vocab size 256), so no
tokenizer files are needed -- use :func:`encode` / :func:`decode`.

This module must stay importable without torch: torch and transformers are
imported lazily inside the functions that need them.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import os
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional, Union

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "FIXTURE_NAMES",
    "PROMPT",
    "SEPARATOR",
    "FixtureCorruptError",
    "fixtures_root",
    "fixture_dir",
    "load_fixture_model",
    "load_fixture_metadata",
    "encode",
    "decode",
    "zen_text",
    "cycle_bytes",
    "cyclic_bytes",
    "expected_continuation",
    "greedy_generate",
]

#: Names of the fixture directories shipped under ``flashnorm_kernels/models/``.
FIXTURE_NAMES = ("tiny_llama_zen", "tiny_qwen3_zen")

#: Opening of the Zen; the prompt the fixtures are verified with.
PROMPT = "The Zen of Python, by Tim Peters\n\n"

#: Separator placed after each copy of the Zen to form the cyclic text.
SEPARATOR = "\n\n"

#: Files every fixture directory must contain.
REQUIRED_FILES = ("config.json", "model.safetensors")

_ARCH_FOR_NAME = {"tiny_llama_zen": "llama", "tiny_qwen3_zen": "qwen3"}


class FixtureCorruptError(RuntimeError):
    """A fixture directory exists but its contents are missing or unreadable."""


# ---------------------------------------------------------------------------
# text helpers (no torch)
# ---------------------------------------------------------------------------


def zen_text() -> str:
    """The text printed by ``import this`` (without the trailing newline).

    Obtained at runtime from the standard library's ``this`` module (whose
    ``s`` attribute is the ROT13-encoded Zen); the import's print is swallowed.
    """
    mod = sys.modules.get("this")
    if mod is None:
        with contextlib.redirect_stdout(io.StringIO()):
            import this as mod  # noqa: F401  (prints the Zen on first import)
    return codecs.decode(mod.s, "rot13")


def cycle_bytes() -> bytes:
    """One period of the cyclic text: the Zen followed by :data:`SEPARATOR`."""
    return (zen_text() + SEPARATOR).encode("utf-8")


def cyclic_bytes(start: int, length: int) -> bytes:
    """``length`` bytes of the infinitely repeated cycle, beginning at offset ``start``."""
    if start < 0 or length < 0:
        raise ValueError(f"start and length must be >= 0, got {start}, {length}")
    cyc = cycle_bytes()
    period = len(cyc)
    phase = start % period
    reps = (phase + length) // period + 1
    return (cyc * reps)[phase : phase + length]


def expected_continuation(prompt_len: int, n_tokens: int) -> bytes:
    """Bytes a correct fixture generates after a prompt of the first ``prompt_len``
    bytes of the cyclic text, for ``n_tokens`` new tokens (one byte per token)."""
    return cyclic_bytes(prompt_len, n_tokens)


def encode(text: Union[str, bytes]) -> list[int]:
    """Byte-level encoding: UTF-8 bytes of ``text`` as token ids (0..255)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    return list(bytes(text))


def decode(ids: Iterable[int]) -> str:
    """Inverse of :func:`encode`; invalid UTF-8 is replaced, never raised.

    Accepts any iterable of ints, including a 1-D torch tensor.
    """
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------
# locating and validating fixture directories (no torch)
# ---------------------------------------------------------------------------


def fixtures_root() -> Path:
    """``flashnorm_kernels/models``: where the package's fixture models are installed."""
    return Path(__file__).resolve().parent.parent / "models"


def _train_hint(name: str, path: Path) -> str:
    arch = _ARCH_FOR_NAME.get(name, "llama|qwen3")
    return (
        f"run `python fixtures/train_tiny_model.py --arch {arch} --out {path}` "
        f"from the repository root to (re)create it"
    )


def _check_safetensors(path: Path) -> None:
    """Cheap structural check of a .safetensors file without importing torch."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise FixtureCorruptError(f"{path} is truncated ({size} bytes)")
        (hlen,) = struct.unpack("<Q", head)
        if hlen == 0 or 8 + hlen > size:
            raise FixtureCorruptError(
                f"{path} has an invalid header length {hlen} for a {size}-byte file"
            )
        try:
            header = json.loads(fh.read(hlen).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise FixtureCorruptError(f"{path} has an unreadable header: {exc}") from exc
    if not isinstance(header, dict):
        raise FixtureCorruptError(f"{path} header is not a JSON object")
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise FixtureCorruptError(f"{path}: bad entry for tensor {key!r}") from exc
    if 8 + hlen + end > size:
        raise FixtureCorruptError(
            f"{path} is truncated: tensors need {8 + hlen + end} bytes, file has {size}"
        )


def fixture_dir(name: str, root: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Path of fixture ``name`` (e.g. ``"tiny_llama_zen"``), validated.

    ``root`` is the directory holding the fixtures (default :func:`fixtures_root`).

    Raises :class:`FileNotFoundError` when the directory is missing, and
    :class:`FixtureCorruptError` when it lacks ``config.json`` /
    ``model.safetensors`` or either is unreadable. Both messages name the path and
    the command that regenerates the fixture.
    """
    base = Path(root) if root is not None else fixtures_root()
    path = base / name
    if base.is_file():  # a typo'd root, not a missing model: retraining into it would fail too
        raise FileNotFoundError(f"fixtures root {base} is a file, not a directory; give the directory that holds "
                                f"the fixture models ({name}/)")
    if not path.is_dir():
        raise FileNotFoundError(
            f"fixture model {name!r} not found at {path}; {_train_hint(name, path)}"
        )
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise FixtureCorruptError(
            f"fixture {name!r} at {path} is corrupt: missing {', '.join(missing)}; "
            f"{_train_hint(name, path)}"
        )
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if not isinstance(cfg, dict) or "model_type" not in cfg:
            raise ValueError("no 'model_type' key")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FixtureCorruptError(
            f"fixture {name!r} at {path} is corrupt: unreadable config.json ({exc}); "
            f"{_train_hint(name, path)}"
        ) from exc
    try:
        _check_safetensors(path / "model.safetensors")
    except FixtureCorruptError as exc:
        raise FixtureCorruptError(
            f"fixture {name!r} at {path} is corrupt: {exc}; {_train_hint(name, path)}"
        ) from exc
    return path


def load_fixture_metadata(name: str, root: Optional[Union[str, os.PathLike]] = None) -> dict:
    """Contents of ``<fixture>/metadata.json`` (prompt, sha256, steps, ...)."""
    path = fixture_dir(name, root) / "metadata.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FixtureCorruptError(f"unreadable fixture metadata {path}: {exc}") from exc


# ---------------------------------------------------------------------------
# torch-dependent helpers (lazy imports)
# ---------------------------------------------------------------------------


def load_fixture_model(
    name: str,
    dtype: "Optional[torch.dtype]" = None,
    root: Optional[Union[str, os.PathLike]] = None,
    device: "Union[str, torch.device, None]" = None,
):
    """Load fixture ``name`` as an eval-mode ``AutoModelForCausalLM``.

    ``dtype`` defaults to ``torch.float32`` (the dtype the fixtures were trained
    and verified in; other dtypes are not guaranteed to reproduce the text).
    Loading is strictly local (``local_files_only=True``); the hub is never
    contacted. Errors from a damaged checkpoint are re-raised as
    :class:`FixtureCorruptError`.
    """
    path = fixture_dir(name, root)
    import torch
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.float32
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, local_files_only=True, output_loading_info=True
        )
    except Exception as exc:  # transformers raises many types for bad files
        raise FixtureCorruptError(
            f"fixture {name!r} at {path} could not be loaded: {type(exc).__name__}: {exc}; "
            f"{_train_hint(name, path)}"
        ) from exc
    # transformers only warns about (and randomly initialises) missing weights;
    # for a fixture that is corruption, not a warning.
    problems = {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs" and v}
    if info.get("error_msgs"):
        problems["error_msgs"] = [str(m) for m in info["error_msgs"]]
    if problems:
        raise FixtureCorruptError(
            f"fixture {name!r} at {path} has weights that do not match its config: {problems}; "
            f"{_train_hint(name, path)}"
        )
    if device is not None:
        model = model.to(device)
    model.eval()
    return model


def greedy_generate(model, prompt: Union[str, bytes] = PROMPT, max_new_tokens: int = 1024) -> bytes:
    """Greedy (``do_sample=False``, KV-cached) continuation of ``prompt``; returns
    only the new bytes. The fixtures' EOS id is byte 0 (NUL), which never occurs in
    the text, so a correct model never stops early; an early stop shows up as a
    short result."""
    import torch

    ids = torch.tensor([encode(prompt)], dtype=torch.long, device=model.device)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            use_cache=True,
            max_new_tokens=max_new_tokens,
        )
    return bytes(out[0, ids.shape[1] :].tolist())
