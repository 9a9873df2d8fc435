"""`streamcheck` command line: one subcommand per module in streamcheck.commands.

Each module there defines `register(subparsers)`, which adds its parser and sets
`func` to a callable taking the parsed args and returning an exit status.
Exit status 2 means bad usage or an environment that cannot run the command.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

COMMANDS = ("repro", "run", "fuzz", "demo")


def version() -> str:
    try:
        return metadata.version("streamcheck")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamcheck", description="Find CUDA stream synchronization bugs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"streamcheck.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"streamcheck.commands.{name}":
                raise
            continue  # subcommand not built yet
        module.register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
