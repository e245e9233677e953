"""How a command reports a failure: one red line on stderr and an exit code, no traceback.

The codes are :class:`~spotd.core.exit_codes.ExitCode`'s: 2 for an error in what the
user gave, 1 for a failure, 130 for Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer
from rich.markup import escape

from spotd.cli.render.console import err
from spotd.core.errors import RequestInvalid, SpotdError
from spotd.core.exit_codes import ExitCode, exit_code

T = TypeVar("T")

__all__ = ["ExitCode", "error", "guard", "render_problem", "stopped", "usage_error"]


def guard(action: Callable[[], T]) -> T:
    """Run ``action``; our own errors become a message and an exit code (2 for bad
    input, else 1: :func:`~spotd.core.exit_codes.exit_code`), not a traceback."""
    try:
        return action()
    except SpotdError as exc:
        render_problem(exc)
        raise typer.Exit(exit_code(exc)) from exc


def usage_error(message: str) -> NoReturn:
    """Arguments that cannot go together, or cannot be read: ``message`` as an error,
    exit 2."""
    error(message)
    raise typer.Exit(ExitCode.BAD_INPUT)


def stopped(message: str) -> NoReturn:
    """Ctrl-C: ``stopped: message`` on stderr (what was stopped, and what was cleaned
    up or kept), exit 130."""
    err.print(f"[yellow]stopped:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(ExitCode.INTERRUPTED)


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
