"""`flashnorm` console script.

    flashnorm flashify SRC DST    fold a checkpoint's RMSNorm gains into its projections (Prop 1)

Exit codes: 0 success, 2 usage or input error (message on stderr).
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashnorm",
        description="FlashNorm tools: fold RMSNorm gains into projection weights.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    fold = commands.add_parser(
        "flashify",
        help="fold a transformers checkpoint (SRC) into a new directory (DST)",
        description=(
            "Load the checkpoint SRC (its dtype kept), fold every RMSNorm gain into the projections it "
            "feeds, and write the folded checkpoint (safetensors, tokenizer, generation config) to DST. "
            "DST must not exist; it appears only when complete. SRC is never modified."
        ),
    )
    fold.add_argument("src", metavar="SRC", help="source checkpoint directory (read only)")
    fold.add_argument("dst", metavar="DST", help="destination directory (must not exist)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    # Imported here so `flashnorm --help` does not pay for torch.
    from .checkpoint import flashify_checkpoint
    from .fold import FlashNormError

    try:
        dst = flashify_checkpoint(args.src, args.dst)
    except (FlashNormError, OSError) as e:
        print(f"flashnorm flashify: error: {e}", file=sys.stderr)
        return 2
    print(f"flashnorm flashify: wrote folded checkpoint {dst}")
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m flashnorm_kernels.cli`
    sys.exit(main())
