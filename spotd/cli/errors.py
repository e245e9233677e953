"""How a command reports a failure: one red line on stderr and an exit code, no traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import typer
from rich.markup import escape

from spotd.cli.render.console import err
from spotd.core.errors import JobSpecError, RequestInvalid, SpotdError

T = TypeVar("T")


def guard(action: Callable[[], T]) -> T:
    """Run ``action``; our own errors become a message and an exit code, not a traceback."""
    try:
        return action()
    except JobSpecError as exc:
        error(str(exc))
        raise typer.Exit(2) from exc
    except SpotdError as exc:
        render_problem(exc)
        raise typer.Exit(1) from exc


def error(message: str) -> None:
    """Print ``message`` as an error on stderr."""
    # soft_wrap: a line is not broken at the terminal's width, so a command it names
    # (pip install 'spotd[...]') can be copied whole and a script reads one line.
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)


def render_problem(exc: SpotdError) -> None:
    """Print an error the daemon answered with (:mod:`spotd.cli.client` raised it again
    from its problem): its message as :func:`error` does, then, when the daemon named
    several fields it could not read, one indented line per field."""
    error(str(exc))
    if isinstance(exc, RequestInvalid) and len(exc.problems) > 1:
        for problem in exc.problems:
            err.print(f"  {escape(problem.field)}: {escape(problem.message)}",
                      highlight=False, soft_wrap=True)  # fmt: skip
