"""Email: settings, message building, SMTP delivery, a durable outbox, and what spotd sends.

Everything spotd emails goes through the :class:`Outbox` first: a message is a
file under ``<data_dir>/outbox`` until an SMTP server accepted it. A failed
send is logged and retried with exponential backoff on later flushes, so an
SMTP outage never stops the daemon and never loses a report.

What is sent:

* scheduled reports (cron expressions in ``[email.schedules]``), built by the
  report renderers (text, HTML, inline PNG charts);
* a job-end email when the job's spec asks (``notify.on_end``);
* budget alerts, once per (job, threshold), deduplicated through the store's
  notification claims so several daemons on one database send one email.

The SMTP password comes from configuration or ``SPOTD_EMAIL__PASSWORD`` and
is a :class:`~pydantic.SecretStr`: it appears in no log line and no repr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.errors import MailAuthError, MailError, MailRefused, MailUnavailable
from spotd.core.lazy import lazy_exports
from spotd.mail.settings import EmailSettings, Window, cron_trigger, parse_window

if TYPE_CHECKING:
    from spotd.core.contracts import Notifier
    from spotd.mail.alerts import (
        BudgetAlert,
        budget_alerts,
        budget_email,
        budget_key,
        job_end_email,
    )
    from spotd.mail.common import PNG_SIGNATURE
    from spotd.mail.compose import BuildReport, ReportComposer, ReportKit, report_email
    from spotd.mail.mailer import Mailer, build_mailer, schedule_mail
    from spotd.mail.message import Composed, build_message
    from spotd.mail.outbox import Outbox, Pending
    from spotd.mail.smtp import MessageSender, SmtpNotifier

    # Nothing takes a Notifier yet: this makes mypy check that both fit the contract.
    _NOTIFIERS: tuple[type[Notifier], ...] = (SmtpNotifier, Mailer)

# The daemon's config needs only the settings; the rest (templates, charts,
# the scheduler) loads when a daemon builds its mailer, not for every command.
_LAZY = {
    **dict.fromkeys(
        ("BudgetAlert", "budget_alerts", "budget_email", "budget_key", "job_end_email"),
        ".alerts",
    ),
    "PNG_SIGNATURE": ".common",
    **dict.fromkeys(("BuildReport", "ReportComposer", "ReportKit", "report_email"), ".compose"),
    **dict.fromkeys(("Mailer", "build_mailer", "schedule_mail"), ".mailer"),
    **dict.fromkeys(("Composed", "build_message"), ".message"),
    **dict.fromkeys(("Outbox", "Pending"), ".outbox"),
    **dict.fromkeys(("MessageSender", "SmtpNotifier"), ".smtp"),
}

__getattr__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "PNG_SIGNATURE",
    "BudgetAlert",
    "BuildReport",
    "Composed",
    "EmailSettings",
    "MailAuthError",
    "MailError",
    "MailRefused",
    "MailUnavailable",
    "Mailer",
    "MessageSender",
    "Outbox",
    "Pending",
    "ReportComposer",
    "ReportKit",
    "SmtpNotifier",
    "Window",
    "budget_alerts",
    "budget_email",
    "budget_key",
    "build_mailer",
    "build_message",
    "cron_trigger",
    "job_end_email",
    "parse_window",
    "report_email",
    "schedule_mail",
]
