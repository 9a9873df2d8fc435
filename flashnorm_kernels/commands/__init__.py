"""The `streamcheck` subcommands FlashNorm brings: `repro` (the talk's implicit-join bug, on
purpose) and `fuzz` (its sync plans x shapes x schedules).

streamcheck never imports them: pyproject.toml names each module's `register(subparsers)`
in the `streamcheck.commands` entry point group, and streamcheck/cli.py adds what that group
lists to its parser.
"""
