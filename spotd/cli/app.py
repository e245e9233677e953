"""The ``spotd`` command line (typer + rich)."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup, TyperOption

from spotd import __version__
from spotd.core.errors import ConfigError, JobSpecError, SpotdError, SubmitRefused
from spotd.core.spec import load_job_file
from spotd.daemon.config import Settings, find_config_file, load_settings
from spotd.daemon.views import EventView, JobView, MarketView

if TYPE_CHECKING:
    # typer vendors click: its own Context, Command and Parameter are these.
    from typer._click.core import Command, Context, Parameter

    from spotd.core.contracts import Clock
    from spotd.core.spec import JobSpec
    from spotd.core.values import CloudCheck
    from spotd.daemon.planning import CandidateView, PlanView
    from spotd.ship.workdir import Shipped


class _Group(TyperGroup):
    """spotd's command group: every flag's help shows the flag alone.

    typer's rich help gives each option a value type, a flag too (``--json <bool>``),
    as if it took a value; an empty metavar leaves a flag's type out, here once for
    the root's options and every command's, ``-h`` included.
    """

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _untyped_flags(super().get_params(ctx))

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untyped_flags(command.get_params(ctx))
        return command


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
PIPE_WIDTH = 200
"""Columns a table may take when stdout is a pipe or a file, which has no width:
rich would assume 80 and fold a row over lines, an instance type mid-word."""


def _stdout() -> Console:
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=PIPE_WIDTH)
    return console


out = _stdout()
err = Console(stderr=True)


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

T = TypeVar("T")
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="spotd.toml to read.", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
JobArg = Annotated[str, typer.Argument(help="Job id, id prefix or name.", show_default=False)]


def _settings(config: Path | None) -> Settings:
    return load_settings(config)


def _guard(action: Callable[[], T]) -> T:
    """Run ``action``; our own errors become a message and an exit code, not a traceback."""
    try:
        return action()
    except JobSpecError as exc:
        _error(str(exc))
        raise typer.Exit(2) from exc
    except SpotdError as exc:
        _error(str(exc))
        raise typer.Exit(1) from exc


def _error(message: str) -> None:
    # soft_wrap: a line is not broken at the terminal's width, so a command it names
    # (pip install 'spotd[...]') can be copied whole and a script reads one line.
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)


def _again(command: str, job_id: str, config: Path | None) -> str:
    """The command line to run next, with the ``--config`` this one was given."""
    where = f" --config {shlex.quote(str(config))}" if config is not None else ""
    return f"spotd {command} {job_id}{where}"


def _where(job: JobView) -> str:
    if not job.attempts:
        return "-"
    a = job.attempts[-1]
    return f"{a.provider}/{a.zone}/{a.instance_type} ({a.market})"


def _status_table(jobs: list[JobView]) -> Table:
    table = Table(box=None, header_style="bold")
    # The id is what every other command takes: never cut. Narrow terminals, and a pipe
    # (80 columns to rich), fold the other cells instead, losing nothing.
    table.add_column("ID", no_wrap=True, min_width=max((len(j.id) for j in jobs), default=2))
    for column in ("NAME", "STATUS", "WHERE", "ATTEMPTS", "PREEMPTED", "COST USD"):
        right = column in ("ATTEMPTS", "COST USD")
        table.add_column(column, justify="right" if right else "left", overflow="fold")
    colour = {"succeeded": "green", "failed": "red", "cancelled": "yellow"}
    for j in jobs:
        status = j.status if not j.failure else f"{j.status} ({j.failure})"
        table.add_row(
            j.id,
            escape(j.name),
            f"[{colour.get(j.status, 'cyan')}]{escape(status)}[/]",
            escape(_where(j)),
            str(len(j.attempts)),
            str(j.preemptions),
            f"{j.cost_usd:,.2f}",
        )
    return table


@app.command()
def version() -> None:
    """Print spotd's version."""
    out.print(__version__)


@app.command()
def daemon(
    config: ConfigOpt = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log at DEBUG, the scheduler's runs included.")
    ] = False,
) -> None:
    """Run the daemon: reconcile loop, price polls and the HTTP API, until SIGTERM."""
    from spotd.daemon.process import Daemon, quiet_scheduler_log

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    quiet_scheduler_log(verbose)

    def run() -> None:
        Daemon(_settings(config), config_file=find_config_file(config)).run_forever()

    _guard(run)


@app.command()
def dashboard(
    config: ConfigOpt = None,
    open_it: Annotated[
        bool, typer.Option("--open", help="Open it in the default web browser too.")
    ] = False,
) -> None:
    """Print the web dashboard's address (log in with the daemon's API token)."""
    import webbrowser

    from spotd.cli.client import daemon_alive, daemon_url

    settings = _settings(config)
    url = f"{daemon_url(settings)}/dashboard/"
    out.print(url, highlight=False, soft_wrap=True)
    if not daemon_alive(settings.address_file):
        err.print("no daemon runs with this configuration now: start one with spotd daemon")
    err.print(f"log in with the API token in {escape(str(settings.token_file))}",
              highlight=False, soft_wrap=True)
    if open_it and not webbrowser.open(url):
        _error("no web browser could be opened here: open the address above")
        raise typer.Exit(1)


@app.command()
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
        settings = _settings(config)
        named.append(spec.workdir is not None)
        shipped.append(_ship_submitted(spec, job_file, settings))
        client = Client.from_settings(settings)
        try:
            return client.submit(shipped[0].spec, idempotency_key=idempotency_key)
        except SubmitRefused as exc:
            raise SubmitRefused(f"{job_file}: {exc}") from exc

    job = _guard(run)
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
        f"watch it with `{escape(_again('status', job.id, config))}`"
    )
    for warning in job.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}; the job is stored and waits "
                  "until the market offers what it needs", highlight=False)  # fmt: skip


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


@app.command()
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

    exits: list[int] = []

    def run() -> list[JobView]:
        client = Client.from_settings(_settings(config))
        if job is not None:
            view = client.job(job)
            if view.restarts and view.last_exit_code is None:
                # No agent reported the code (the simulated market): the event says it.
                exits.extend(_error_exit_codes(client.events(view.id)))
            return [view]
        statuses = only or (None if all_jobs else ["active"])
        page = client.jobs(statuses=statuses, team=team, limit=limit, cursor=cursor)
        if page.next is not None:
            more.append(page.next)
        return page.jobs

    jobs = _guard(run)
    if more:
        # On stderr: a --json reader gets the jobs alone on stdout, as before.
        flags = [" --all"] * all_jobs + [f" --status {shlex.quote(s)}" for s in only or ()]
        flags += [f" --team {shlex.quote(team)}"] if team is not None else []
        flags += [f" --limit {limit}"] * (limit != 100) + [f" --cursor {more[0]}"]
        again = _again("status", "".join(flags).lstrip(), config)
        err.print(f"more jobs: `{escape(again)}`", highlight=False)
    if as_json:
        payload = [j.model_dump(mode="json") for j in jobs]
        out.print_json(json.dumps(payload[0] if job is not None else payload))
        return
    out.print(_status_table(jobs))
    for waits in _waiting_lines(jobs, one=job is not None):
        out.print(waits, highlight=False)
    if job is not None and jobs:
        line = _progress_line(jobs[0])
        if line is not None:
            out.print(line)
        line = restart_line(jobs[0], exits[-1] if exits else None)
        if line is not None:
            out.print(line, highlight=False)
        _print_attempts(jobs[0])
        for line in _gang_lines(jobs[0]):
            out.print(line, highlight=False)


def _waiting_lines(jobs: list[JobView], *, one: bool) -> list[str]:
    """Why each job the engine has placed nowhere yet waits (``waiting: ...``), under
    the table; each prefixed with its id in a list of several."""
    return [
        escape(f"{'' if one else j.id + ' '}waiting: {j.waiting}")
        for j in jobs
        if j.waiting is not None
    ]


def restart_line(job: JobView, exit_code: int | None = None) -> str | None:
    """``restarts: 1 of 3 (exit 137)`` for a job with ``retry.max_restarts_on_errors``
    (``exit_code``, given, stands for the view's when its agents reported none); None
    for a job that restarts on no error."""
    if not job.max_restarts and not job.restarts:
        return None
    line = f"restarts: {job.restarts} of {job.max_restarts}"
    code = job.last_exit_code if job.last_exit_code is not None else exit_code
    if job.restarts and code is not None:
        line += f" (exit {code})"
    return line


_EXIT_CODE = re.compile(r"^command on \S+ exited with (-?\d+)")


def _error_exit_codes(events: list[EventView]) -> list[int]:
    """The first failing node's exit code of every error exit in the events, in order."""
    found = (_EXIT_CODE.match(e.detail) for e in events if e.cause == "user-failed")
    return [int(m.group(1)) for m in found if m is not None]


def _progress_line(job: JobView) -> str | None:
    """One line on how far the job is, e.g. for a running deadline job
    ``progress: 12.4 of 24.0 compute hours (estimate); deadline in 30.5 h, 18.9 h of
    slack; 13.1 h to go at the current rate``; None from a daemon too old to say."""
    p = job.progress
    if p is None:
        return None
    if p.compute_hours is None and job.status == "succeeded":
        return "progress: complete"  # no hours stated to count against, and its command said so
    of = f" of {p.compute_hours:.1f}" if p.compute_hours is not None else ""
    source = "estimate"
    if p.from_job and p.step is not None:
        source = f"the job's step {p.step:,} of {p.total_steps:,}"
    parts = [f"progress: {p.done_hours:.1f}{of} compute hours ({source})"]
    late = False
    if p.hours_to_deadline is not None and p.hours_to_deadline < 0:
        parts.append(f"[red]deadline passed {-p.hours_to_deadline:.1f} h ago[/]")
        late = True
    elif p.hours_to_deadline is not None:
        deadline = f"deadline in {p.hours_to_deadline:.1f} h"
        if p.slack_hours is not None:
            slack = f"{p.slack_hours:.1f} h of slack"
            deadline += f", [red]{slack}[/]" if p.slack_hours < 0 else f", {slack}"
        parts.append(deadline)
        late = p.finish_in_hours is not None and p.finish_in_hours > p.hours_to_deadline
    if p.finish_in_hours is not None:
        pace = f"{p.finish_in_hours:.1f} h to go at the current rate"
        parts.append(f"[red]{pace}[/]" if late else pace)
    return "; ".join(parts)


def _gang_lines(job: JobView) -> list[str]:
    """What the agents of the latest attempt said: gang, preflight, step, GPUs."""
    if not job.attempts or job.attempts[-1].gang is None:
        return []
    from spotd.core.agent_wire import GPU_UTIL_THRESHOLD_PCT
    from spotd.engine.gang import preflight_summary

    a = job.attempts[-1]
    gang = a.gang
    assert gang is not None
    where = escape(", ".join(gang.addresses)) or "no address yet"
    lines = [f"attempt {a.seq}: {gang.joined} of {a.nodes} node(s) joined, "
             f"{gang.started} passed preflight ({where})"]  # fmt: skip
    if gang.preflight is not None:
        summary = escape(preflight_summary(gang.preflight))
        lines.append(f"  {summary}" if gang.preflight.passed else f"  [red]{summary}[/]")
    if gang.step is not None:
        of = f" of {gang.total_steps:,}" if gang.total_steps else ""
        kept = f", last checkpoint {escape(gang.checkpoint)}" if gang.checkpoint else ""
        lines.append(f"  step {gang.step:,}{of} (from the job){kept}")
    for g in gang.gpus:
        utils = " ".join(f"{u:.0f}" for u in g.util_pct)
        low = ""
        if g.low_share:
            share = f"{g.low_share:.0%} of {g.samples} samples"
            low = f", under {GPU_UTIL_THRESHOLD_PCT:g} % in {share}"
        lines.append(f"  GPUs of {escape(g.instance_id)}: {utils} % now{low}")
    return lines


def _times(clock: str | None) -> str:
    """A table title's note of the clock its times are on, when not the wall's."""
    return f" (times: {clock})" if clock else ""


def _print_attempts(job: JobView) -> None:
    table = Table(title=f"attempts{_times(job.clock)}", box=None, header_style="bold")
    columns = ("#", "PROVIDER", "ZONE", "TYPE", "MARKET", "USD/H", "START", "END", "REASON", "COST")
    for column in columns:
        table.add_column(column)
    for a in job.attempts:
        table.add_row(
            str(a.seq), a.provider, a.zone, a.instance_type, a.market,
            f"{a.price_per_node_hour * a.nodes:.2f}",
            f"{a.started_at:%m-%d %H:%M}",
            f"{a.ended_at:%m-%d %H:%M}" if a.ended_at else "-",
            escape(a.end_reason or "-"),
            f"{a.cost_usd:.2f}",
        )
    out.print(table)


@app.command()
def events(job: JobArg, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Show every transition of a job, with its cause."""
    from spotd.cli.client import Client

    rows = _guard(lambda: Client.from_settings(_settings(config)).events(job))
    if as_json:
        out.print_json(json.dumps([e.model_dump(mode="json") for e in rows]))
        return
    clock = rows[0].clock if rows else None
    table = Table(title=f"events{_times(clock)}" if clock else None, box=None,
                  header_style="bold")  # fmt: skip
    for column in ("AT", "FROM", "TO", "CAUSE", "DETAIL"):
        table.add_column(column, no_wrap=column == "AT", overflow="fold")
    for e in rows:
        when = f"{e.at:%Y-%m-%d %H:%M:%S}"
        table.add_row(when, e.from_status or "-", e.to_status, escape(e.cause), escape(e.detail))
    out.print(table)


@app.command()
def cancel(job: JobArg, config: ConfigOpt = None) -> None:
    """Cancel a job and stop its instances."""
    from spotd.cli.client import Client

    view = _guard(lambda: Client.from_settings(_settings(config)).cancel(job))
    out.print(f"{view.id} {view.status}")


@app.command()
def logs(
    job: JobArg,
    config: ConfigOpt = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f",
                     help="Keep printing new output until the job ends (Ctrl-C stops)."),
    ] = False,
) -> None:
    """Print the job's output, attempt by attempt."""
    from spotd.cli.client import Client

    if follow:
        _follow_logs(job, config)
        return
    found = _guard(lambda: Client.from_settings(_settings(config)).logs(job))
    if not found:
        err.print(f"{escape(job)}: no instance has been launched for it yet, so no output")
    for header, text in found.items():
        _write_log(header, text)


def _write_log(header: str | None, text: str) -> None:
    """``text`` of one node's output, under a rule naming it when ``header`` is given."""
    if header is not None:
        out.rule(escape(header))
    sys.stdout.write(text)
    sys.stdout.flush()


def _follow_logs(job: str, config: Path | None) -> None:
    from spotd.cli.client import Client
    from spotd.cli.follow import follow_logs

    try:
        ended = _guard(lambda: follow_logs(Client.from_settings(_settings(config)), job,
                                           _write_log))  # fmt: skip
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    err.print(f"{ended.id}: {ended.status}", highlight=False)


def _market(settings: Settings) -> tuple[MarketView, str]:
    """The daemon's view of the market, or a direct poll when no daemon answers."""
    from spotd.cli.client import Client
    from spotd.core.errors import ApiError

    try:
        return Client.from_settings(settings).prices(), "daemon"
    except ApiError:
        import time

        from spotd.daemon.views import market_view
        from spotd.daemon.wiring import build_providers
        from spotd.market.cache import MarketCache

        _, providers = build_providers(settings)
        cache = MarketCache(providers)
        # The cache's warning of a failed poll is the daemon's log line; here each
        # failed provider gets a line of its own under the table.
        cache_log = logging.getLogger(MarketCache.__module__)
        level = cache_log.level
        cache_log.setLevel(logging.ERROR)
        try:
            cache.refresh_all()
        finally:
            cache_log.setLevel(level)
        return market_view(cache.snapshots(), time.time()), "direct poll (no daemon running)"


def _filter_offerings(
    view: MarketView, gpu: str | None, provider: str | None, region: str | None
) -> MarketView:
    from fnmatch import fnmatchcase

    offerings = [
        o for o in view.offerings
        if (gpu is None or o.gpu.upper() == gpu.upper())
        and (provider is None or fnmatchcase(o.provider, provider))
        and (region is None or fnmatchcase(o.region, region))
    ]
    offerings.sort(key=lambda o: (o.gpu, o.gpus_per_node, o.spot_price or o.on_demand_price or 0))
    return view.model_copy(update={"offerings": offerings})


@app.command()
def prices(
    gpu: Annotated[str | None, typer.Option(help="Only this GPU model, e.g. H100.")] = None,
    provider: Annotated[str | None, typer.Option(help="Provider name or glob.")] = None,
    region: Annotated[str | None, typer.Option(help="Region glob, e.g. 'us-*'.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the current market: offerings, both prices, fabric, and how fresh the data is."""
    view, source = _guard(lambda: _market(_settings(config)))
    failed = [p for p in view.providers if p.error is not None and not p.offerings]
    # Nothing to show because every poll failed is an error, not an empty market.
    code = 1 if failed and len(failed) == len(view.providers) else 0
    view = _filter_offerings(view, gpu, provider, region)
    if as_json:
        out.print_json(view.model_dump_json())
        raise typer.Exit(code)
    _print_market(view, source)
    raise typer.Exit(code)


def _print_market(view: MarketView, source: str) -> None:
    table = Table(box=None, header_style="bold", title=f"market ({source})")
    columns = ("PROVIDER", "ZONE", "TYPE", "GPU", "FABRIC", "GBPS/GPU", "SPOT", "ON-DEMAND", "CAP")
    for column in columns:
        table.add_column(column, justify="right" if column in ("SPOT", "ON-DEMAND") else "left")
    for o in view.offerings:
        table.add_row(
            o.provider, o.zone, o.instance_type, f"{o.gpus_per_node}x {o.gpu}", o.fabric,
            f"{o.gbps_per_gpu:g}", _usd(o.spot_price), _usd(o.on_demand_price),
            "-" if o.capacity is None else f"{o.capacity:.1f}",
        )
    out.print(table)
    for p in view.providers:
        if p.error is not None and not p.offerings:
            _error(f"{p.provider}: no offerings, its price poll failed ({p.failures}x): {p.error}")
            continue
        age = "never polled" if p.age_seconds is None else f"{p.age_seconds:.0f} s old"
        line = f"{p.provider}: {p.offerings} offerings, {age}"
        if p.stale:
            line += f" [yellow]STALE[/]: {p.failures} failed poll(s), last: {escape(p.error or '')}"
        out.print(line, highlight=False)


@app.command("check-cloud")
def check_cloud(
    job: Annotated[
        Path | None,
        typer.Argument(help="A job.toml whose launch request to check too.", show_default=False),
    ] = None,
    provider: Annotated[
        str | None, typer.Option(help="Only this provider (name or glob).", show_default=False)
    ] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check, launching nothing billable, that a real launch would work.

    Per enabled provider: credentials, permissions, quotas and, with a job file,
    the very request the daemon would send for it (AWS's DryRun; GCP and Azure
    by read-only calls), and what spotd would create. Exits 1 if a check failed.
    """
    from spotd.daemon.cloudcheck import check_clouds

    def run() -> list[CloudCheck]:
        spec = load_job_file(job) if job is not None else None
        return check_clouds(_settings(config), spec, provider)

    checks = _guard(run)
    if as_json:
        sys.stdout.write(json.dumps([_check_json(c) for c in checks], indent=2) + "\n")
    else:
        for check in checks:
            _print_check(check)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def _check_json(check: CloudCheck) -> dict[str, object]:
    return {
        "provider": check.provider,
        "ok": check.ok,
        "checks": [{"name": o.name, "ok": o.ok, "detail": o.detail} for o in check.outcomes],
        "would_create": list(check.would_create),
    }


def _print_check(check: CloudCheck) -> None:
    verdict = "[green]ready[/green]" if check.ok else "[red]not ready[/red]"
    out.print(f"[bold]{escape(check.provider)}[/bold]: {verdict}", highlight=False)
    for o in check.outcomes:
        mark = "[green]pass[/green]" if o.ok else "[red]FAIL[/red]"
        out.print(f"  {mark} {escape(o.name)}: {escape(o.detail)}", highlight=False,
                  soft_wrap=True)  # fmt: skip
    if check.would_create:
        out.print("  a launch would create (nothing was created):", highlight=False)
        for line in check.would_create:
            out.print(f"    {escape(line)}", highlight=False, soft_wrap=True)


def _usd(price: float | None) -> str:
    return "-" if price is None else f"{price:,.2f}"


@app.command()
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
    view = _guard(lambda: _plan_view(job, config, policy))
    if as_json:
        out.print_json(view.model_dump_json())
        return
    c = view.choice
    if c is None:
        out.print(f"[red]{escape(view.policy)}: no offering passes the filters[/red]")
    else:
        out.print(
            f"[bold]{escape(view.policy)}[/bold] chooses {c.provider}/{c.zone}/{c.instance_type} "
            f"{c.market}: {c.price_per_hour:,.2f} USD/h, expected {c.expected_cost_usd:,.2f} USD",
            highlight=False,
        )
    usable = [x for x in view.candidates if x.excluded is None]
    out_of = [x for x in view.candidates if x.excluded is not None]
    if usable:
        out.print(_usable_table(usable[:top]))
    if c is not None:
        _print_environment(view, c)
    if excluded:
        out.print(_excluded_table(out_of))
    elif out_of:
        _print_exclusions(view, len(view.candidates))


def _plan_view(job: str, config: Path | None, policy: str | None) -> PlanView:
    """The plan of a job file (an existing file wins), or of a submitted job by the daemon."""
    path = Path(job)
    if path.is_file() or path.suffix == ".toml" or path.name != job:
        from spotd.daemon.planning import plan_job

        return plan_job(load_job_file(path), _settings(config), policy)
    from spotd.cli.client import Client

    client = Client.from_settings(_settings(config))
    try:
        return client.plan(job, policy)
    finally:
        client.close()


def _print_environment(view: PlanView, c: CandidateView) -> None:
    """The fabric variables and the preflight floor the choice's gang would get."""
    nodes = f"{c.nodes} node" + ("s" if c.nodes != 1 else "")
    head = f"environment for {c.interconnect.fabric} ({c.instance_type}, {nodes})"
    env = view.environment or {}
    lines = [f"{head}:", *(f"  {name}={value}" for name, value in env.items())]
    if not env:
        why = "one node: nothing crosses the fabric" if c.nodes <= 1 else "[fabric_env] removes all"
        lines = [f"{head}: none, {why}"]
    # soft_wrap: one line each, never folded, so a NAME=value line pastes as is.
    for line in [*lines, _preflight_line(view, c)]:
        out.print(escape(line), highlight=False, soft_wrap=True)


def _preflight_line(view: PlanView, c: CandidateView) -> str:
    """What the preflight would hold the gang to, and whose figure that is."""
    floor, source = view.preflight_min_busbw_gbps, view.preflight_threshold_source
    if source == "disabled":
        return "preflight: off ([preflight] enabled = false)"
    if floor is not None:
        # The fabric's figure is NCCL's: a gang without GPUs (the simulated market) runs
        # gloo and is held to none.
        whose = (
            "the job's [preflight] min_busbw_gbps" if source == "spec"
            else "the fabric's floor, for NCCL on GPU nodes"
        )  # fmt: skip
        return f"preflight: all-reduce bus bandwidth must exceed {floor:g} GB/s ({whose})"
    if c.nodes <= 1:
        return "preflight: no bus bandwidth floor (one node)"
    return (
        f"preflight: no bus bandwidth floor ({c.interconnect.fabric} has no default; "
        "set [preflight] min_busbw_gbps for one)"
    )


def _offering_cell(x: CandidateView) -> str:
    return escape(f"{x.provider}/{x.zone}/{x.instance_type}")


def _usable_table(rows: list[CandidateView]) -> Table:
    # One space between columns and the move column only where a move costs anything:
    # the table then fits 80 columns for the usual offering names.
    moves = any(x.breakdown.get("migration_usd", 0.0) for x in rows)
    table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("OFFERING", no_wrap=True)
    table.add_column("FABRIC", no_wrap=True)
    table.add_column("MARKET", no_wrap=True)
    for column in ("USD/H", "EFF", "LOSS H", *(("MOVE USD",) if moves else ()), "EXPECTED"):
        table.add_column(column, justify="right", no_wrap=True)
    for x in rows:
        b = x.breakdown
        move = (f"{b.get('migration_usd', 0.0):.2f}",) if moves else ()
        table.add_row(
            _offering_cell(x), f"{x.interconnect.fabric} {x.interconnect.gbps_per_gpu:g}",
            x.market, f"{x.price_per_hour:,.2f}", f"{b.get('efficiency', 1.0):.2f}",
            f"{b.get('preemption_overhead_hours', 0.0):.2f}", *move,
            f"{x.expected_cost_usd:,.2f}",
        )  # fmt: skip
    return table


def _excluded_table(rows: list[CandidateView]) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("OFFERING", overflow="fold")
    table.add_column("MARKET")
    table.add_column("USD/H", justify="right")
    table.add_column("KIND", no_wrap=True)
    table.add_column("EXCLUDED BECAUSE", overflow="fold")
    for x in rows:
        table.add_row(_offering_cell(x), x.market, f"{x.price_per_hour:,.2f}", _kind(x),
                      escape(x.excluded or ""))  # fmt: skip
    return table


def _kind(x: CandidateView) -> str:
    """The kind of rule that excluded ``x`` (``other`` from a daemon that does not say)."""
    return str(x.excluded_kind) if x.excluded_kind is not None else "other"


def _print_exclusions(view: PlanView, total: int) -> None:
    """How many offerings each kind of rule excluded, most first, with what they have in
    common (the daemon's summary; the kind alone from a daemon too old to give one)."""
    groups = [(g.count, str(g.kind), g.summary) for g in view.exclusions]
    if not groups:
        kinds = Counter(_kind(x) for x in view.candidates if x.excluded is not None)
        groups = [(n, kind, "") for kind, n in kinds.most_common()]
    width = max(len(kind) for _, kind, _ in groups)
    excluded = sum(n for n, _, _ in groups)
    out.print(f"{excluded} of {total} candidates excluded (--excluded lists each):")
    for n, kind, summary in groups:
        out.print(f"  {n:>4}  {kind:<{width}}  {escape(summary)}".rstrip(), highlight=False)


REPORT_DAYS = 7
"""The default report window: the past week of real time."""


def _period(
    since: str | None, start: str | None, end: str | None, clock: Clock
) -> tuple[datetime, datetime]:
    """The report's window: ``--since 7d`` (or 12h, 30m), or ``--from`` / ``--to`` dates,
    on the clock of the daemon's records (the simulated market's, say); by default
    the past :data:`REPORT_DAYS` days of real time."""
    now = clock.now()
    if since is not None and (start is not None or end is not None):
        raise ConfigError("give --since or --from/--to, not both")
    if since is not None:
        units = {"d": 86400, "h": 3600, "m": 60}
        number, unit = since[:-1], since[-1:]
        if unit not in units or not number.isdigit():
            raise ConfigError(f"--since {since!r}: expected a number and d, h or m, e.g. 7d")
        return now - timedelta(seconds=int(number) * units[unit]), now
    # A week of real time: a simulated market 600 times faster runs a week of its own
    # in 17 real minutes, and this morning's jobs would fall out of its last week.
    week = timedelta(days=REPORT_DAYS) / clock.seconds_to_real(1.0)
    try:
        begin = _utc(start) if start else max(now - week, _EARLIEST)
        finish = _utc(end) if end else now
    except (ValueError, OverflowError) as exc:
        raise ConfigError(f"--from/--to: {exc} (expected a date such as 2026-11-01)") from exc
    return begin, finish


_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
"""No window starts before this, however fast a simulated clock runs."""


def _utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@app.command()
def report(
    *,
    since: Annotated[str | None, typer.Option(help="Window back from now: 7d, 24h.")] = None,
    start: Annotated[str | None, typer.Option("--from", help="Start date (UTC).")] = None,
    end: Annotated[str | None, typer.Option("--to", help="End date (UTC).")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job (id, prefix or name).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="text, html, json or csv.")] = "text",
    out_file: Annotated[Path | None, typer.Option("--out", help="Write here, not stdout.")] = None,
    email: Annotated[
        bool,
        typer.Option("--email", help=f"Email it to the addresses of {escape('[email]')} to."),
    ] = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Cost report from the ledger: spend, savings against on-demand, preemptions, time lost."""
    if as_json:
        if fmt not in ("text", "json"):
            _error(f"--json and --format {fmt}: choose one")
            raise typer.Exit(2)
        fmt = "json"  # as every other command takes it; --format json says the same
    if email:
        _guard(lambda: _email_report(_settings(config), since, start, end, job))
        return
    from spotd.billing import reports
    from spotd.store import open_store

    if fmt not in ("text", "html", "json", "csv"):
        err.print(
            f"[red]error:[/red] --format {escape(repr(fmt))}: expected text, html, json or csv"
        )
        raise typer.Exit(2)

    def run() -> str:
        from spotd.daemon.wiring import records_clock

        settings = _settings(config)
        begin, finish = _period(since, start, end, records_clock(settings))
        store = open_store(settings.db_url)
        try:
            job_id = store.find_job(job).id if job else None
            built = reports.build_report(store, since=begin, until=finish, job_id=job_id)
        finally:
            store.close()
        if fmt == "json":
            return reports.render_json(built)
        if fmt == "csv":
            return reports.render_csv(built)
        if fmt == "html":
            charts = reports.data_uri_sources(reports.render_charts(built))
            return reports.render_html(built, charts)
        return reports.render_text(built)

    text = _guard(run)
    if out_file is not None:
        out_file.write_text(text, encoding="utf-8")
        err.print(f"report written to {escape(str(out_file))}")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _email_report(
    settings: Settings, since: str | None, start: str | None, end: str | None, job: str | None
) -> None:
    """Send the report by email now, or leave it in the outbox for the daemon to retry."""
    from functools import partial

    from spotd.billing import charts, reports
    from spotd.daemon.wiring import records_clock
    from spotd.mail import ReportKit, build_mailer
    from spotd.store import open_store

    if not settings.email.enabled:
        raise ConfigError("--email needs an SMTP host: set [email] host in spotd.toml")
    clock = records_clock(settings)
    begin, finish = _period(since, start, end, clock)
    store = open_store(settings.db_url)
    try:
        kit = ReportKit(partial(reports.build_report, store), reports.render_text,
                        reports.render_html, charts.render_charts)  # fmt: skip
        mailer = build_mailer(
            settings.email, settings.data_dir, store=store, clock=clock,
            claim=lambda key: store.claim_notification(key, at=clock.now()), reports=kit,
        )  # fmt: skip
        job_id = store.find_job(job).id if job else None
        if mailer.email_report(since=begin, until=finish, job_id=job_id):
            err.print(f"report emailed to {escape(', '.join(settings.email.to))}")
        else:
            err.print(
                f"[yellow]could not send now[/yellow]; the report waits in "
                f"{escape(str(settings.data_dir / 'outbox'))} and the daemon retries it"
            )
    finally:
        store.close()


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def agent(ctx: typer.Context) -> None:
    """Run the on-VM agent (started by the node's bootstrap): `spotd agent -- CMD ARGS...`.

    It runs the job's command, watches the provider's preemption notice,
    signals the job to checkpoint, and reports to the daemon. Configured by
    SPOTD_AGENT_* variables (see docs/agent.md).
    """
    from spotd.agent import main as agent_main

    raise typer.Exit(agent_main(list(ctx.args)))


class DemoExample(StrEnum):
    """The jobs ``spotd demo`` can run."""

    TINY = "tiny"
    """examples/train_tiny.py: one node, numpy."""
    DDP = "ddp"
    """examples/train_ddp.py: 2 nodes x 2 processes, PyTorch DDP on gloo, DCP checkpoints."""


@app.command()
def demo(
    as_json: JsonOpt = False,
    example: Annotated[
        DemoExample, typer.Option(help="tiny: one numpy node; ddp: 2 nodes x 2 PyTorch ranks.")
    ] = DemoExample.TINY,
    seed: Annotated[int, typer.Option(help="Seed of the simulated market (tiny).")] = 11,
    steps: Annotated[
        int | None, typer.Option(help="Training steps (default: 300 tiny, 120 ddp).")
    ] = None,
    keep: Annotated[Path | None, typer.Option(help="Keep the demo's files in this folder.")] = None,
) -> None:
    """Run an example job on the simulated market through preemptions, then summarise."""
    if example is DemoExample.DDP:
        _demo_ddp(as_json, steps, keep)
        return
    from spotd.cli.demo import DemoOptions, run_demo

    options = DemoOptions(seed=seed, steps=steps or 300, keep=keep, quiet=as_json)
    summary = _guard(lambda: run_demo(options, console=err))
    if as_json:
        sys.stdout.write(summary.model_dump_json(indent=2) + "\n")
    else:
        from spotd.cli.demo import print_summary

        print_summary(summary, out)
    if summary.status != "succeeded":
        raise typer.Exit(1)


def _demo_ddp(as_json: bool, steps: int | None, keep: Path | None) -> None:
    from spotd.cli.demo_ddp import DdpDemoOptions, print_ddp_summary, run_ddp_demo

    options = DdpDemoOptions(keep=keep, quiet=as_json)
    if steps is not None:
        options = replace(options, steps=steps)
    summary = _guard(lambda: run_ddp_demo(options, console=err))
    if as_json:
        sys.stdout.write(summary.model_dump_json(indent=2) + "\n")
    else:
        print_ddp_summary(summary, out)
    if summary.status != "succeeded" or not summary.digest_matches:
        raise typer.Exit(1)


def _register_simulate() -> None:
    from spotd.simulate.cli import simulate

    app.command()(simulate)


_register_simulate()


def main() -> None:
    """Entry point of the ``spotd`` console script."""
    app()
