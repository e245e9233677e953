"""The two consoles every command prints to: ``out`` (stdout) and ``err`` (stderr), and
the one zone their times are shown in."""

from __future__ import annotations

import os
from datetime import UTC, datetime, tzinfo

from rich.console import Console

from spotd.core.timefmt import Precision, shown

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


class _Display:
    """The zone of the config the command read (``[display] timezone``); UTC until
    one is read. One per CLI process, which runs one command."""

    zone: tzinfo = UTC


def use_zone(zone: tzinfo) -> None:
    """Show this command's times in ``zone``."""
    _Display.zone = zone


def when(at: datetime, precision: Precision = Precision.SECOND) -> str:
    """``at`` in the command's zone, 24-hour ISO 8601 (:func:`spotd.core.timefmt.shown`)."""
    return shown(at, _Display.zone, precision)
