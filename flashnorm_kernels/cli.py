"""`flashnorm` console script.

    flashnorm flashify SRC DST    fold a checkpoint's RMSNorm gains into its projections (Prop 1)
    flashnorm --version

Exit codes: 0 success, 2 usage or input error (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import os
import sys

# Only what main() needs to catch a Ctrl-C: the rest is imported inside the functions.
from streamcheck import interrupts


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("streamcheck")  # flashnorm_kernels ships in the streamcheck distribution
    except metadata.PackageNotFoundError:
        return "(version unknown: the streamcheck distribution is not installed)"


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="flashnorm",
        description="FlashNorm tools: fold RMSNorm gains into projection weights.",
    )
    parser.add_argument("--version", action="version", version=f"flashnorm {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    fold = commands.add_parser(
        "flashify",
        help="fold a transformers checkpoint (SRC) into a new directory (DST)",
        description=(
            "Load the checkpoint SRC (its dtype kept), fold every RMSNorm gain into the projections it "
            "feeds, and write the folded checkpoint (safetensors, tokenizer, generation config) to DST. "
            "DST must not exist; it appears only when complete. SRC is never modified. Temporary "
            "directories that an interrupted run left next to DST are removed first."
        ),
    )
    fold.add_argument("src", metavar="SRC", help="source checkpoint directory (read only)")
    fold.add_argument("dst", metavar="DST", help="destination directory (must not exist)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `flashnorm` command. Ctrl-C, wherever it lands (imports, the fold, shutdown): one line
    that says what is on disk, and exit status 130 (streamcheck/interrupts.py)."""
    interrupts.install()  # before torch and transformers are imported
    args, dst_existed = None, False
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        dst_existed = args.command is not None and os.path.lexists(args.dst)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        return _flashify(args)
    except KeyboardInterrupt:
        print(_interrupted_line(args, dst_existed), file=sys.stderr)
        return interrupts.INTERRUPTED
    finally:  # after the heavy imports: before their atexit clean-up
        interrupts.at_exit(lambda: _interrupted_line(args, dst_existed))


def _flashify(args) -> int:
    from . import transformers_missing

    missing = transformers_missing()
    if missing:  # the fold loads and saves the checkpoint with transformers
        print(f"flashnorm flashify: error: {missing}", file=sys.stderr)
        return 2
    # Imported here so `flashnorm --help` does not pay for torch.
    from .checkpoint import flashify_checkpoint
    from .fold import FlashNormError

    try:
        with _quiet_transformers(), _checkpoint_notes_on_stderr():
            dst = flashify_checkpoint(args.src, args.dst)
    except (FlashNormError, OSError) as e:  # OSError: a file-system failure none of our checks foresaw
        if interrupts.received():  # a library made another error of the KeyboardInterrupt (a lazy import)
            raise KeyboardInterrupt from e
        print(f"flashnorm flashify: error: {e}", file=sys.stderr)
        return 2
    print(f"flashnorm flashify: wrote folded checkpoint {dst}")
    return 0


def _interrupted_line(args, dst_existed: bool) -> str:
    """Said from what is on disk: DST appears only complete (a rename is the fold's last step)."""
    if args is None or args.command is None:
        return "flashnorm: interrupted; nothing was written."
    if dst_existed:
        return f"flashnorm flashify: interrupted; {args.dst} existed before and was left as it was."
    if os.path.lexists(args.dst):
        return f"flashnorm flashify: interrupted after {args.dst} was written; it is complete."
    return f"flashnorm flashify: interrupted; {args.dst} was not written."


@contextlib.contextmanager
def _quiet_transformers():
    """Hide transformers' progress bars ("Loading weights", "Writing model shards") and notices.

    Our own lines say what happened; a load problem transformers would only log is turned into
    an error by flashify_checkpoint. The previous settings come back afterwards, for callers of main().
    """
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    bars_were_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars_were_enabled:
            transformers_logging.enable_progress_bar()


@contextlib.contextmanager
def _checkpoint_notes_on_stderr():
    """Print flashify_checkpoint's notes (leftover temporary directories) as one stderr line each."""
    import logging

    checkpoint_logger = logging.getLogger("flashnorm_kernels.checkpoint")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("flashnorm flashify: %(message)s"))
    level, propagate = checkpoint_logger.level, checkpoint_logger.propagate
    checkpoint_logger.addHandler(handler)
    checkpoint_logger.setLevel(logging.INFO)
    checkpoint_logger.propagate = False
    try:
        yield
    finally:
        checkpoint_logger.removeHandler(handler)
        checkpoint_logger.setLevel(level)
        checkpoint_logger.propagate = propagate


if __name__ == "__main__":  # pragma: no cover - `python -m flashnorm_kernels.cli`
    sys.exit(main())
