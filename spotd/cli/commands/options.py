"""What the commands share: their common options and arguments, and the command line
a command suggests next."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from spotd.cli.render.console import use_zone
from spotd.daemon.config import Settings, load_settings

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="spotd.toml to read.", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
JobArg = Annotated[str, typer.Argument(help="Job id, id prefix or name.", show_default=False)]


def again(command: str, job_id: str, config: Path | None) -> str:
    """The command line to run next, with the ``--config`` this one was given."""
    where = f" --config {shlex.quote(str(config))}" if config is not None else ""
    return f"spotd {command} {job_id}{where}"


def settings_of(config: Path | None) -> Settings:
    """The settings a command runs with (:func:`~spotd.daemon.config.load_settings`),
    its times then shown in their ``[display] timezone``."""
    settings = load_settings(config)
    use_zone(settings.display.zone)
    return settings
