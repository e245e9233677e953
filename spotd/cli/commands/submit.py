"""``spotd submit``: a job file validated, its workdir shipped, the job handed to the daemon."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from spotd.cli.commands.options import ConfigOpt, JsonOpt, again, settings_of
from spotd.cli.errors import guard
from spotd.cli.render.console import err, out
from spotd.cli.render.jobs import warning_line
from spotd.cli.render.progress import working
from spotd.core.errors import SubmitRefused
from spotd.core.spec_io import load_job_file
from spotd.daemon.config import Settings

if TYPE_CHECKING:
    from spotd.core.spec import JobSpec
    from spotd.daemon.views import JobView
    from spotd.ship.workdir import Shipped


def submit(
    job_file: Annotated[Path, typer.Argument(help="The job.toml to run.")],
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            help="Key of this submit (a new UUID by default): a submit again with the key "
            "of one the daemon stored returns that job instead of a second one.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Validate a job spec, ship its workdir if that is a folder here, and hand it to
    the daemon."""
    from spotd.cli.client import Client

    shipped: list[Shipped] = []
    named: list[bool] = []

    def run() -> JobView:
        spec = load_job_file(job_file)  # a bad spec is the first thing to say
        settings = settings_of(config)
        named.append(spec.workdir is not None)
        with working("packing and storing the job's workdir"):
            shipped.append(_ship_submitted(spec, job_file, settings))
        client = Client.from_settings(settings)
        try:
            return client.submit(shipped[0].spec, idempotency_key=idempotency_key)
        except SubmitRefused as exc:
            raise SubmitRefused(f"{job_file}: {exc}") from exc

    job = guard(run)
    if as_json:
        out.print_json(job.model_dump_json())
        return
    code = shipped[0].spec.code if shipped else None
    if code is not None:
        how = "uploaded" if shipped[0].uploaded else "already stored"
        whose = "" if named[0] else " (the job file's folder, as the spec gives no workdir)"
        err.print(f"workdir: {code.files} files, {code.size_bytes / 2**20:.1f} MiB packed, "
                  f"{how} as {escape(code.uri)}{whose}", highlight=False)  # fmt: skip
    out.print(
        f"submitted [bold]{job.id}[/bold] ({escape(job.name)}); "
        f"watch it with `{escape(again('status', job.id, config))}`"
    )
    for warning in job.warnings:
        err.print(warning_line(warning), highlight=False)


def _ship_submitted(spec: JobSpec, job_file: Path, settings: Settings) -> Shipped:
    """:func:`ship_job` for a spec read from ``job_file``, whose folder it ships when the
    spec names no workdir (docs/job-spec.md)."""
    from spotd.ship.pack import WorkdirError
    from spotd.ship.workdir import with_default_workdir

    given = with_default_workdir(spec, job_file.parent, daemon_dir=settings.data_dir)
    try:
        return ship_job(given, settings)
    except WorkdirError as exc:
        if given is spec:
            raise
        # No workdir was written: say where this folder came from, and the way out.
        raise WorkdirError(
            f"{exc} (the job file's folder, as the spec gives no workdir: "
            "set workdir to the folder of the job's code)"
        ) from exc


def ship_job(spec: JobSpec, settings: Settings) -> Shipped:
    """``spec`` with its local ``workdir`` packed and stored where the daemon's nodes read,
    less the daemon's data_dir and the job's checkpoint folder where they lie inside it."""
    from spotd.engine.shipping import local_path
    from spotd.ship.store import storage_for
    from spotd.ship.workdir import ship_workdir

    storage = storage_for(spec, settings.storage.uri, settings.data_dir)
    limit = round(settings.storage.max_workdir_mb * 2**20)
    state = [settings.data_dir]
    checkpoints = local_path(spec.checkpoint.uri) if spec.checkpoint.uri else None
    if checkpoints is not None:
        state.append(Path(checkpoints))
    return ship_workdir(spec, storage, max_bytes=limit, leave_out=state)
