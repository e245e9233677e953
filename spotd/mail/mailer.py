"""The mailer: what the daemon, the engine and the CLI call."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

from spotd.billing.ledger import spend_so_far
from spotd.core.clock import WALL, clock_note
from spotd.core.contracts import Clock, JobSource
from spotd.core.errors import MailError
from spotd.core.states import ACTIVE
from spotd.core.timefmt import Precision, shown
from spotd.core.values import JobRecord
from spotd.mail.alerts import BudgetAlert, budget_alerts, budget_email, job_end_email
from spotd.mail.compose import ReportComposer
from spotd.mail.message import Composed
from spotd.mail.outbox import Outbox
from spotd.mail.settings import EmailSettings, cron_trigger
from spotd.mail.smtp import MessageSender, SmtpNotifier

log = logging.getLogger(__name__)



class Mailer:
    """Composes spotd's emails, keeps them in the outbox, and delivers them.

    Its entry points never raise (they run in scheduler threads and in the
    reconcile loop): failures are logged, and queued messages are retried.
    ``claim(key)`` is ``store.claim_notification(key, at=now)``: True the
    first time a key is claimed, across every daemon on the database.
    ``clock`` is the engine's (report windows, spend); ``wall`` the real one
    (the messages' dates, the cron firings), which a simulated market's is not.
    ``zone`` is the one times are shown in (``[display] timezone``).
    """

    def __init__(
        self,
        settings: EmailSettings,
        outbox: Outbox,
        transport: MessageSender,
        *,
        store: JobSource,
        clock: Clock,
        claim: Callable[[str], bool],
        reports: ReportComposer | None = None,
        wall: Clock = WALL,
        zone: tzinfo = UTC,
    ) -> None:
        self.settings = settings
        self.zone = zone
        self.outbox = outbox
        self.transport = transport
        self._store = store
        self._clock = clock
        self._claim = claim
        self._reports = reports
        self.wall = wall

    # -- Notifier -----------------------------------------------------------

    def send(
        self,
        to: Sequence[str],
        subject: str,
        text: str,
        html: str | None = None,
        images: Mapping[str, bytes] | None = None,
    ) -> None:
        """Queue a message for delivery (:class:`~spotd.core.contracts.Notifier`).

        Raises :class:`MailError` only if it cannot even be queued.
        """
        if self.queue(Composed(subject, text, html, images or {}), to) is None:
            raise MailError(f"email {subject!r} has no recipients")

    # -- building blocks ----------------------------------------------------

    def queue(self, composed: Composed, to: Sequence[str] | None = None) -> Path | None:
        """Put the message in the outbox for ``to`` (default: the configured recipients).

        Returns its file, or None when there is nobody to send it to.
        """
        recipients = list(dict.fromkeys(to if to is not None else self.settings.to))
        if not recipients:
            log.warning("email %r has no recipients; not sent", composed.subject)
            return None
        try:
            return self.outbox.put(composed.message(self.settings.sender, recipients, self.wall))
        except OSError as exc:
            raise MailError(f"could not queue email {composed.subject!r}: {exc}") from exc

    def flush(self) -> int:
        """Deliver what is due in the outbox; never raises."""
        return self.outbox.flush(self.transport)

    # -- reports --------------------------------------------------------------

    def email_report(
        self,
        *,
        since: datetime,
        until: datetime,
        job_id: str | None = None,
        subject: str | None = None,
        to: Sequence[str] | None = None,
    ) -> bool:
        """Build, queue and try to send a report now (``spotd report --email``).

        True when it was delivered; False when it waits in the outbox (the
        daemon's flushes retry it). Raises :class:`MailError` if it could not
        be composed or queued.
        """
        if self._reports is None:
            raise MailError("no report renderers are wired into the mailer")
        title = subject or f"spotd report, {_span(since, until, self.zone)}"
        composed = self._reports.compose(since=since, until=until, subject=title, job_id=job_id)
        path = self.queue(composed, to)
        if path is None:
            return False
        self.flush()
        return not path.exists()

    def scheduled_report(self, schedule: str) -> None:
        """The cron job of one ``[email.schedules]`` entry; never raises."""
        fired = self.wall.now().astimezone(UTC)
        # Several daemons on one database: the first to claim this firing sends it.
        if not self._claimed(f"report:{schedule}:{fired:%Y-%m-%dT%H:%M}"):
            return
        until = self._clock.now()
        since = until - self.settings.report_windows[schedule]
        try:
            self.email_report(
                since=since,
                until=until,
                subject=f"spotd {schedule} report, {_span(since, until, self.zone)}",
            )
        except Exception:
            log.exception("the %s report could not be composed or queued", schedule)

    # -- engine hooks -------------------------------------------------------

    def job_ended(self, job: JobRecord) -> None:
        """Engine hook for a job that reached a terminal status; never raises.

        Sends the job-end email if its spec asks, and the budget alert an
        over-budget end crossed (the job is no longer active for
        :meth:`check_budgets` to see). The engine calls it once the job's
        last attempt is billed, so both carry the job's final ledger cost.
        """
        try:
            self.check_budgets([job])
            notify = job.spec.notify
            if notify.on_end and notify.email and self._claimed(f"job-end:{job.id}"):
                self.queue(self._job_end(job), notify.email)
        except Exception:
            log.exception("job %s: the job-end email could not be queued", job.id)

    def check_budgets(self, jobs: Sequence[JobRecord] | None = None) -> int:
        """Queue the budget alerts due for ``jobs`` (default: active jobs); never raises.

        A job's spend is its ledger's (:func:`spotd.billing.ledger.spend_so_far`), the
        figure its budget is enforced against. Returns the number of alerts queued.
        """
        try:
            listed = self._store.list_jobs(ACTIVE) if jobs is None else list(jobs)
            budgeted = [j for j in listed if j.spec.budget is not None]
            if not budgeted:
                return 0
            attempts = self._store.attempts_for([j.id for j in budgeted])
            now = self._clock.now()
            alerts = budget_alerts(
                budgeted,
                lambda j: spend_so_far(
                    j, attempts.get(j.id, []), self._store.ledger(job_id=j.id), now
                ),
                self.settings.budget_thresholds,
                self._claim,
            )
            return sum(self._queue_alert(alert) for alert in alerts)
        except Exception:
            log.exception("budget check failed; the next check retries")
            return 0

    # -- helpers --------------------------------------------------------------

    def _queue_alert(self, alert: BudgetAlert) -> bool:
        to = [*alert.job.spec.notify.email, *self.settings.to]
        log.info("job %s crossed %.0f%% of its budget", alert.job.id, alert.threshold * 100)
        return self.queue(budget_email(alert), to) is not None

    def _job_end(self, job: JobRecord) -> Composed:
        """The job-end email: where the job ran and its ledger's spend and savings.

        The job's full report (roll-ups, charts) is ``spotd report --job``.
        """
        attempts = self._store.attempts_for([job.id]).get(job.id, [])
        events = self._store.events(job.id)
        return job_end_email(
            job, attempts, now=self._clock.now(), last_event=events[-1] if events else None,
            ledger=self._store.ledger(job_id=job.id), zone=self.zone,
            clock_note=clock_note(self._clock),
        )  # fmt: skip

    def _claimed(self, key: str) -> bool:
        try:
            return self._claim(key)
        except Exception:
            log.exception("could not claim notification %s; not sending it", key)
            return False


def _span(since: datetime, until: datetime, zone: tzinfo) -> str:
    return f"{shown(since, zone, Precision.MINUTE)} to {shown(until, zone, Precision.MINUTE)}"


def schedule_mail(scheduler: Any, mailer: Mailer) -> list[str]:
    """Add the mail jobs to an APScheduler 3 scheduler; return their ids.

    ``mail-flush`` every ``flush_seconds``, ``mail-budgets`` every
    ``budget_check_seconds``, and ``report-<name>`` per cron schedule.
    """
    s = mailer.settings
    common: dict[str, Any] = {"max_instances": 1, "coalesce": True}
    scheduler.add_job(
        mailer.flush,
        "interval",
        seconds=s.flush_seconds,
        id="mail-flush",
        next_run_time=mailer.wall.now(),
        **common,
    )
    scheduler.add_job(
        mailer.check_budgets,
        "interval",
        seconds=s.budget_check_seconds,
        id="mail-budgets",
        **common,
    )
    ids = ["mail-flush", "mail-budgets"]
    for name, expression in s.schedules.items():
        # A daemon that was down at 08:00 still sends the morning report within the hour.
        scheduler.add_job(
            mailer.scheduled_report,
            cron_trigger(expression),
            args=[name],
            id=f"report-{name}",
            misfire_grace_time=3600,
            **common,
        )
        ids.append(f"report-{name}")
    return ids


def build_mailer(
    settings: EmailSettings,
    data_dir: Path,
    *,
    store: JobSource,
    clock: Clock,
    claim: Callable[[str], bool],
    reports: ReportComposer | None = None,
    wall: Clock = WALL,
    zone: tzinfo = UTC,
) -> Mailer:
    """A mailer with SMTP transport and the outbox under ``<data_dir>/outbox``."""
    outbox = Outbox(
        data_dir / "outbox",
        base_delay_seconds=settings.retry_base_seconds,
        max_delay_seconds=settings.retry_max_seconds,
        clock=wall,
    )
    return Mailer(
        settings,
        outbox,
        SmtpNotifier(settings, clock=wall),
        store=store,
        clock=clock,
        claim=claim,
        reports=reports,
        wall=wall,
        zone=zone,
    )
