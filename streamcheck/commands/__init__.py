"""Subcommands of the `streamcheck` CLI (see cli.py)."""
from __future__ import annotations

import shutil
from typing import Optional


def report_width(stream) -> Optional[int]:
    """Columns to wrap race reports at on `stream`: the terminal's width on a terminal, None
    (whole lines, for grep and for pasting) in a log file or a pipe."""
    isatty = getattr(stream, "isatty", None)
    return shutil.get_terminal_size().columns if isatty is not None and isatty() else None
