"""Subcommands of the `streamcheck` CLI (see cli.py)."""
from __future__ import annotations

import os
import shutil
from typing import Optional


def report_width(stream) -> Optional[int]:
    """Columns to wrap race reports at on `stream`: the terminal's width on a terminal, None
    (whole lines, for grep and for pasting) in a log file or a pipe."""
    isatty = getattr(stream, "isatty", None)
    return shutil.get_terminal_size().columns if isatty is not None and isatty() else None


STDOUT = "-"  # `--json -`: the reports on stdout (the command's own lines go to stderr)


def timeline_file(name: str) -> str:
    """The file `--timeline NAME` writes: matplotlib adds `.png` to a name without a suffix."""
    return name if os.path.splitext(name)[1] else name + ".png"


def output_problem(option: str, path: Optional[str], example: str) -> Optional[str]:
    """Why `option path` cannot be written, found before a run rather than after it; None when it can
    (or when the option was not given, or names stdout)."""
    if not path or path == STDOUT:
        return None
    if os.path.isdir(path):
        return f"{option} {path} is a directory; give a file name, e.g. {option} {os.path.join(path, example)}"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{option} {path}: the directory {parent} does not exist; create it or choose another place"
    if not os.access(parent, os.W_OK):
        return f"{option} {path}: the directory {parent} is not writable; choose another place"
    return None


def timeline_problem(path: Optional[str]) -> Optional[str]:
    """Why `--timeline path` cannot be drawn (not a PNG name, no matplotlib, no place to write it)."""
    if not path:
        return None
    if os.path.splitext(path)[1].lower() not in ("", ".png"):
        return f"--timeline {path}: the timeline is a PNG; give a name ending in .png"
    try:
        import matplotlib.figure  # noqa: F401  (render_timeline draws with it, after the run)
    except ImportError:
        return ("--timeline needs matplotlib, which is not installed here: pip install 'streamcheck[plot]', "
                "or leave --timeline out")
    return output_problem("--timeline", path, "timeline.png") or output_problem("--timeline", timeline_file(path),
                                                                              "timeline.png")
