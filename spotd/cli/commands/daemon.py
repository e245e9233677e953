"""The processes spotd runs: the daemon, its dashboard's address, the on-VM agent; and
which spotd this is."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from spotd import __version__
from spotd.cli.commands.options import ConfigOpt
from spotd.cli.errors import error, guard, stopped
from spotd.cli.render.console import err, out
from spotd.daemon.config import find_config_file, load_settings


def version() -> None:
    """Print spotd's version."""
    out.print(__version__)


def daemon(
    config: ConfigOpt = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log at DEBUG, the scheduler's runs included.")
    ] = False,
) -> None:
    """Run the daemon: reconcile loop, price polls and the HTTP API, until SIGTERM or
    Ctrl-C."""
    from spotd.daemon.log_setup import configure_daemon_log
    from spotd.daemon.logtimes import use_zone_in_log
    from spotd.daemon.process import Daemon

    configure_daemon_log(verbose)

    def run() -> None:
        settings = load_settings(config)
        use_zone_in_log(settings.display.zone)
        Daemon(settings, config_file=find_config_file(config)).run_forever()

    try:
        guard(run)
    except KeyboardInterrupt:
        # Ctrl-C before the daemon took SIGINT over (reading its config, migrating).
        stopped("interrupted before the daemon started; nothing was left running")


def dashboard(
    config: ConfigOpt = None,
    open_it: Annotated[
        bool, typer.Option("--open", help="Open it in the default web browser too.")
    ] = False,
) -> None:
    """Print the web dashboard's address (log in with the daemon's API token)."""
    import webbrowser

    from spotd.cli.client import daemon_alive, daemon_url

    settings = guard(lambda: load_settings(config))
    url = f"{daemon_url(settings)}/dashboard/"
    out.print(url, highlight=False, soft_wrap=True)
    if not daemon_alive(settings.address_file):
        err.print("no daemon runs with this configuration now: start one with spotd daemon")
    err.print(f"log in with the API token in {escape(str(settings.token_file))}",
              highlight=False, soft_wrap=True)
    if open_it and not webbrowser.open(url):
        error("no web browser could be opened here: open the address above")
        raise typer.Exit(1)


def agent(ctx: typer.Context) -> None:
    """Run the on-VM agent (started by the node's bootstrap): `spotd agent -- CMD ARGS...`.

    It runs the job's command, watches the provider's preemption notice,
    signals the job to checkpoint, and reports to the daemon. Configured by
    SPOTD_AGENT_* variables (see docs/agent.md).
    """
    from spotd.agent import main as agent_main

    raise typer.Exit(agent_main(list(ctx.args)))
