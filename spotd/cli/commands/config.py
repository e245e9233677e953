"""``spotd config``: the configuration itself, read as the daemon reads it."""

from __future__ import annotations

import json
from datetime import datetime, tzinfo
from pathlib import Path

import typer
from pydantic_core import to_jsonable_python
from rich.markup import escape
from rich.table import Table

from spotd.cli.commands.options import ConfigOpt, JsonOpt
from spotd.cli.errors import error
from spotd.cli.render.console import err, out, use_zone
from spotd.core.errors import ConfigError
from spotd.core.timefmt import shown
from spotd.daemon.config_check import (
    CheckReport,
    ConfigCheckFailed,
    EffectiveSetting,
    StrayVariable,
    check_config,
)

BAD_INPUT = 2
"""The exit code of a configuration that does not validate."""


def check(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Check the configuration and list the settings in force, with their sources.

    Reads the file and the SPOTD_* variables as the daemon does, and lists every
    setting with where it came from: the file, a variable, or the default. Secrets
    are shown as ****. Exits 2 when the configuration does not validate.
    """
    try:
        report = check_config(config)
    except ConfigCheckFailed as exc:
        _warn(exc.stray)
        _fail(exc)
    except ConfigError as exc:
        error(str(exc))
        raise typer.Exit(BAD_INPUT) from exc
    use_zone(report.zone)
    _warn(report.stray)
    if as_json:
        out.print_json(json.dumps([_json_row(row) for row in report.settings]))
    else:
        out.print(settings_table(report))


def _fail(exc: ConfigCheckFailed) -> None:
    """One error line naming the file, then one line per problem; exit 2."""
    error(f"invalid configuration ({exc.file or 'no file: environment and defaults'})")
    for problem in exc.problems:
        err.print(f"  {escape(problem.text)}", highlight=False, soft_wrap=True)
    raise typer.Exit(BAD_INPUT) from exc


def _warn(stray: tuple[StrayVariable, ...]) -> None:
    for variable in stray:
        hint = ""
        if variable.suggestion is not None:
            hint = f"; did you mean {variable.suggested_variable} (`{variable.suggestion}`)?"
        line = f"{variable.name} names no setting, so the daemon ignores it{hint}"
        err.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)


def settings_table(report: CheckReport) -> Table:
    """The settings in force: key, value (times in the config's zone), source."""
    title = f"settings from {report.file}" if report.file else "settings (no file)"
    table = Table(title=escape(title), box=None, header_style="bold")
    # The key stays whole, to grep; a long value (a list of zones) or path folds.
    table.add_column("KEY", no_wrap=True)
    table.add_column("VALUE", overflow="fold")
    table.add_column("SOURCE", overflow="fold")
    for row in report.settings:
        table.add_row(escape(row.key), escape(_shown(row.value, report.zone)), escape(row.where))
    return table


def _shown(value: object, zone: tzinfo) -> str:
    """A value to read: a string or a path bare, a time in the display zone, none for
    an unset value, anything else as JSON."""
    if value is None:
        return "none"
    if isinstance(value, datetime):
        return shown(value, zone)
    if isinstance(value, Path) or (isinstance(value, str) and value):
        return str(value)
    return json.dumps(to_jsonable_python(value))


def _json_row(row: EffectiveSetting) -> dict[str, object]:
    return {
        "key": row.key,
        "value": to_jsonable_python(row.value),
        "source": row.source.value,
        "origin": row.origin,
        "line": row.line,
    }
