"""The commands on submitted jobs: ``status``, ``events``, ``cancel``, ``priority`` and
``logs``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from spotd.cli.commands.options import ConfigOpt, JobArg, JsonOpt, again, settings_of
from spotd.cli.errors import guard, stopped
from spotd.cli.render.console import err, out
from spotd.cli.render.jobs import events_table, print_jobs, write_log
from spotd.cli.render.progress import working

if TYPE_CHECKING:
    from spotd.daemon.views import JobView


def status(  # noqa: PLR0917 (typer options)
    job: Annotated[str | None, typer.Argument(help="Job id, id prefix or name.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="Include ended jobs.")] = False,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            "-s",
            help="Only jobs in this status (repeatable; `active` and `ended` too).",
            show_default=False,
        ),
    ] = None,
    team: Annotated[
        str | None, typer.Option(help="Only the jobs of this team.", show_default=False)
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=1000, help="Most jobs to show, newest first.")
    ] = 100,
    cursor: Annotated[
        str | None,
        typer.Option(
            help="Continue after the jobs shown before (with the cursor it printed).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show jobs, newest first (the active ones unless told): where they run, their
    attempts, preemptions and cost."""
    from spotd.cli.client import Client

    more: list[str] = []

    def run() -> list[JobView]:
        client = Client.from_settings(settings_of(config))
        if job is not None:
            return [client.job(job)]
        statuses = only or (None if all_jobs else ["active"])
        page = client.jobs(statuses=statuses, team=team, limit=limit, cursor=cursor)
        if page.next is not None:
            more.append(page.next)
        return page.jobs

    jobs = guard(run)
    if more:
        # On stderr: a --json reader gets the jobs alone on stdout, as before.
        flags = [" --all"] * all_jobs + [f" --status {shlex.quote(s)}" for s in only or ()]
        flags += [f" --team {shlex.quote(team)}"] if team is not None else []
        flags += [f" --limit {limit}"] * (limit != 100) + [f" --cursor {more[0]}"]
        next_page = again("status", "".join(flags).lstrip(), config)
        err.print(f"more jobs: `{escape(next_page)}`", highlight=False)
    if as_json:
        payload = [j.model_dump(mode="json") for j in jobs]
        out.print_json(json.dumps(payload[0] if job is not None else payload))
        return
    if not jobs:
        filtered = all_jobs or bool(only) or team is not None or cursor is not None
        # soft_wrap: the commands in it are copied whole, never broken at the width.
        out.print(escape(empty_status(filtered=filtered, config=config)), highlight=False,
                  soft_wrap=True)  # fmt: skip
        return
    print_jobs(jobs, one=job is not None)


def empty_status(*, filtered: bool, config: Path | None) -> str:
    """What ``spotd status`` says in place of an empty table: that nothing matched,
    and how to submit a first job."""
    first = (f"submit one with `{again('submit', 'job.toml', config)}` (docs/job-spec.md "
             f"describes the file), or watch one run with `spotd demo`")  # fmt: skip
    if filtered:
        return f"no jobs match; {first}"
    return f"no active jobs (`{again('status', '--all', config)}` lists ended ones too); {first}"


def events(job: JobArg, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Show every transition of a job, with its cause."""
    from spotd.cli.client import Client

    rows = guard(lambda: Client.from_settings(settings_of(config)).events(job))
    if as_json:
        out.print_json(json.dumps([e.model_dump(mode="json") for e in rows]))
        return
    out.print(events_table(rows))


CANCEL_WAIT_SECONDS = 120.0
"""How long ``spotd cancel`` waits by default for the job's nodes to be stopped."""


def cancel(
    job: JobArg,
    config: ConfigOpt = None,
    wait: Annotated[
        bool,
        typer.Option(help="Wait until the daemon has stopped the job (else return once asked)."),
    ] = True,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait at most.", min=0.0)
    ] = CANCEL_WAIT_SECONDS,
) -> None:
    """Cancel a job: the daemon that holds it stops its instances in its next pass."""
    from spotd.cli.client import Client, wait_ended

    client = guard(lambda: Client.from_settings(settings_of(config)))
    asked = guard(lambda: client.cancel(job))
    view = asked
    if wait:
        try:
            with working(f"waiting up to {timeout:g} s for its daemon to stop {asked.id}"):
                view = guard(lambda: wait_ended(client, asked.id, timeout_seconds=timeout))
        except KeyboardInterrupt:
            stopped(f"no longer waiting; the cancel of {asked.id} stays asked, and "
                    "`spotd status` shows when it is done")  # fmt: skip
    if view.status_ended or not wait:
        note = "" if view.status_ended else " (cancel asked; `spotd status` shows when done)"
        out.print(f"{view.id} {view.status}{note}")
        return
    err.print(f"{view.id} is still {view.status} after {timeout:g} s; the cancel stays "
              "asked and its daemon carries it out when it can")  # fmt: skip
    raise typer.Exit(1)


def priority(
    job: JobArg,
    value: Annotated[int, typer.Argument(help="The new priority (higher runs first).")],
    config: ConfigOpt = None,
) -> None:
    """Give a job another priority: its daemon's next pass orders the queue by it."""
    from spotd.cli.client import Client

    view = guard(lambda: Client.from_settings(settings_of(config)).set_priority(job, value))
    out.print(f"{view.id} priority {value} asked (now {view.spec.get('priority', 0)})")


def logs(
    job: JobArg,
    config: ConfigOpt = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f",
                     help="Keep printing new output until the job ends (Ctrl-C stops)."),
    ] = False,
    attempt: Annotated[
        int | None,
        typer.Option(min=1, help="Only this attempt's output (its number, 1 first).",
                     show_default=False),
    ] = None,
    node: Annotated[
        int | None,
        typer.Option(min=0, help="Only this node's output, by its rank (0 first).",
                     show_default=False),
    ] = None,
) -> None:
    """Print the job's output, attempt by attempt and node by node, as the nodes'
    agents send it (the same on every provider)."""
    from spotd.cli.client import Client
    from spotd.cli.follow import write_page

    if follow:
        _follow_logs(job, config, attempt, node)
        return
    page = guard(lambda: Client.from_settings(settings_of(config)).logs(
        job, attempt=attempt, node=node))  # fmt: skip
    if not page.nodes:
        err.print(escape(_no_output(job, attempt, node)), highlight=False, soft_wrap=True)
    write_page(page, write_log, _gone, empty=True)


def _no_output(job: str, attempt: int | None, node: int | None) -> str:
    """Why ``spotd logs`` printed nothing."""
    if attempt is None and node is None:
        return f"{job}: no instance has been launched for it yet, so no output"
    asked = " ".join([f"--attempt {attempt}"] * (attempt is not None)
                     + [f"--node {node}"] * (node is not None))  # fmt: skip
    return f"{job}: no node matches {asked} (`spotd status {job}` lists its attempts)"


def _gone(header: str, skipped: int) -> None:
    said = (f"({header}: {skipped:,} bytes of its output before this are no longer kept; "
            "a job keeps its newest [agent] log_keep_bytes)")  # fmt: skip
    err.print(escape(said), highlight=False, soft_wrap=True)


def _follow_logs(job: str, config: Path | None, attempt: int | None, node: int | None) -> None:
    from spotd.cli.client import Client
    from spotd.cli.follow import follow_logs

    try:
        ended = guard(lambda: follow_logs(Client.from_settings(settings_of(config)), job,
                                          write_log, _gone, attempt=attempt,
                                          node=node))  # fmt: skip
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    why = f": {ended.failure_reason}" if ended.failure_reason else ""  # failed: say why
    err.print(f"{ended.id}: {ended.status}{why}", highlight=False)
