"""``spotd plan``: where a job would run and why, from a job file or a submitted job."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from spotd.cli.commands.options import ConfigOpt, JsonOpt, settings_of
from spotd.cli.errors import guard
from spotd.cli.render.console import out
from spotd.cli.render.plan import print_plan
from spotd.core.spec_io import load_job_file

if TYPE_CHECKING:
    from spotd.daemon.planning import PlanView


def plan(  # noqa: PLR0917 (typer options)
    job: Annotated[
        str,
        typer.Argument(
            help="A job.toml, or a submitted job's id, id prefix or name (an existing file wins).",
            show_default=False,
        ),
    ],
    policy: Annotated[str | None, typer.Option(help="Policy name (default: configured).")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    top: Annotated[int, typer.Option(help="Usable candidates to show.")] = 10,
    excluded: Annotated[
        bool, typer.Option("--excluded", help="List every excluded offering and why.")
    ] = False,
) -> None:
    """Show where a job would run and why, and why the other offerings were excluded.

    A job file is planned here as a new job (not running, nothing spent, no
    cooldowns), without asking the daemon. A submitted job is planned by the
    running daemon as its engine would place it now: with the job's cooldowns,
    current placement, progress and spend. JOB names a file when that file
    exists, or when it ends in .toml or has a folder part; else a submitted job.
    """
    view = guard(lambda: _plan_view(job, config, policy))
    if as_json:
        out.print_json(view.model_dump_json())
        return
    print_plan(view, top=top, excluded=excluded)


def _plan_view(job: str, config: Path | None, policy: str | None) -> PlanView:
    """The plan of a job file (an existing file wins), or of a submitted job by the daemon."""
    path = Path(job)
    if path.is_file() or path.suffix == ".toml" or path.name != job:
        from spotd.daemon.planning import plan_job

        return plan_job(load_job_file(path), settings_of(config), policy)
    from spotd.cli.client import Client

    client = Client.from_settings(settings_of(config))
    try:
        return client.plan(job, policy)
    finally:
        client.close()
