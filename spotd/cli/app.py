"""The ``spotd`` command line: the typer app and its commands, in the order ``--help``
lists them (the commands live in :mod:`spotd.cli.commands`, what they print in
:mod:`spotd.cli.render`)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup, TyperOption

from spotd import __version__
from spotd.cli.commands import (
    config,
    daemon,
    demos,
    drill,
    jobs,
    market,
    plan,
    report,
    retry,
    submit,
)
from spotd.cli.render.console import out

if TYPE_CHECKING:
    # typer vendors click: its own Context, Command and Parameter are these.
    from typer._click.core import Command, Context, Parameter


class _Group(TyperGroup):
    """spotd's command group: every flag's help shows the flag alone, and every
    command's help wraps at the terminal's width.

    typer's rich help gives each option a value type, a flag too (``--json <bool>``),
    as if it took a value; an empty metavar leaves a flag's type out, here once for
    the root's options and every command's, ``-h`` included. It also keeps the line
    breaks of a docstring in the list of commands and in a command's later paragraphs,
    so a sentence broke where the source did, not where the terminal ends.
    """

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _untyped_flags(super().get_params(ctx))

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untyped_flags(command.get_params(ctx))
            command.help = reflowed(command.help)
        return command


def reflowed(text: str | None) -> str | None:
    """A docstring as help: each paragraph one line, for rich to wrap at the terminal's
    width; a paragraph that starts with ``\\b`` (click's "keep as written") is kept."""
    if text is None:
        return None
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _untyped_flags(params: list[Parameter]) -> list[Parameter]:
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params


app = typer.Typer(
    help="spotd: run GPU training on spot capacity across clouds, and survive preemptions.",
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(wanted: bool) -> None:
    if wanted:
        out.print(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True,
                     help="Print spotd's version and exit."),
    ] = False,
) -> None:
    """Options before any command."""


app.command()(daemon.version)
app.command()(daemon.daemon)
app.command()(daemon.dashboard)
app.command()(submit.submit)
app.command()(jobs.status)
app.command()(jobs.events)
app.command()(jobs.cancel)
app.command()(retry.retry)
app.command()(retry.release)
app.command()(drill.drill)
app.command()(jobs.priority)
app.command()(jobs.logs)
app.command()(market.prices)
app.command("check-cloud")(market.check_cloud)
app.command()(plan.plan)
app.command()(report.report)
# The agent's own arguments follow `--`: typer leaves them to it, unparsed.
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    daemon.agent
)
app.command()(demos.demo)

config_app = typer.Typer(
    help="The configuration, read as the daemon reads it.", cls=_Group, no_args_is_help=True
)
config_app.command()(config.check)
app.add_typer(config_app, name="config")


def _register_simulate() -> None:
    from spotd.simulate.cli import simulate

    app.command()(simulate)


_register_simulate()


def main() -> None:
    """Entry point of the ``spotd`` console script."""
    app()
