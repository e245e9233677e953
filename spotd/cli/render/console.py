"""The two consoles every command prints to: ``out`` (stdout) and ``err`` (stderr)."""

from __future__ import annotations

import os

from rich.console import Console

PIPE_WIDTH = 200
"""Columns a table may take when stdout is a pipe or a file, which has no width:
rich would assume 80 and fold a row over lines, an instance type mid-word."""


def _stdout() -> Console:
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=PIPE_WIDTH)
    return console


out = _stdout()
err = Console(stderr=True)
