"""What a command shows while it waits on something slow: a spinner on stderr naming it.

The spinner is transient (gone when the wait ends) and only on a terminal: a pipe,
a log file and ``--json`` on stdout never see it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape

from spotd.cli.render.console import err

__all__ = ["working"]


@contextmanager
def working(what: str, console: Console = err) -> Iterator[None]:
    """A spinner saying ``what`` is going on (``polling 3 providers``) while the block
    runs, on ``console`` when it is a terminal; lines printed meanwhile go above it."""
    if not console.is_terminal:
        yield
        return
    with console.status(f"{escape(what)} ...", spinner="dots"):
        yield
