"""Subcommands of the `streamcheck` CLI (see cli.py)."""
