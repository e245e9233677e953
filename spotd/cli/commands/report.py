"""``spotd report``: the cost report from the ledger, printed, written or emailed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from spotd.cli.commands.options import ConfigOpt, JsonOpt, settings_of
from spotd.cli.errors import guard, usage_error
from spotd.cli.render.console import err
from spotd.cli.render.progress import working
from spotd.core.clock import clock_note
from spotd.core.errors import ConfigError, SpotdError
from spotd.daemon.config import Settings

if TYPE_CHECKING:
    from spotd.billing.report_model import ToFinish
    from spotd.core.contracts import Clock
    from spotd.core.values import JobRecord

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
            usage_error(f"--json and --format {fmt}: choose one")
        fmt = "json"  # as every other command takes it; --format json says the same
    if email:
        with working("building and sending the report"):
            guard(lambda: _email_report(settings_of(config), since, start, end, job))
        return
    from spotd.billing import reports
    from spotd.store import open_store

    if fmt not in ("text", "html", "json", "csv"):
        usage_error(f"--format {fmt!r}: expected text, html, json or csv")

    def run() -> str:
        from spotd.daemon.wiring import records_clock

        settings = settings_of(config)
        clock = records_clock(settings)
        begin, finish = _period(since, start, end, clock)
        store = open_store(settings.db_url)
        try:
            job_id = store.find_job(job).id if job else None
            with _daemon_forecasts(settings) as to_finish:
                built = reports.build_report(store, since=begin, until=finish, job_id=job_id,
                                             zone=settings.display.timezone,
                                             clock_note=clock_note(clock), clock=clock,
                                             to_finish=to_finish)  # fmt: skip
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

    with working("building the report"):
        text = guard(run)
    if out_file is not None:
        out_file.write_text(text, encoding="utf-8")
        err.print(f"report written to {escape(str(out_file))}")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


@contextmanager
def _daemon_forecasts(settings: Settings) -> Iterator[ToFinish | None]:
    """The running daemon's forecast of each running job (``spotd status JOB`` gives the
    same), or None with no daemon running: the report is the store's, and only a
    daemon knows the market and the policy a forecast needs."""
    from spotd.cli.client import Client, daemon_alive

    if not daemon_alive(settings.address_file):
        yield None
        return
    client = Client.from_settings(settings)

    def ask(job: JobRecord) -> tuple[float, float] | None:
        try:
            found = client.job(job.id).forecast
        except SpotdError:
            return None  # the report goes on without the figure
        return None if found is None else (found.expected_usd, found.p90_usd)

    try:
        yield ask
    finally:
        client.close()


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
        kit = ReportKit(partial(reports.build_report, store, clock=clock), reports.render_text,
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
