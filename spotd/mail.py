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

import contextlib
import fcntl
import html as html_lib
import json
import logging
import re
import smtplib
import ssl
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default as default_policy
from email.utils import format_datetime, make_msgid
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, Protocol, TypeVar

import jinja2
from apscheduler.triggers.cron import CronTrigger
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, model_validator

from spotd.attempts import job_cost
from spotd.contracts import Clock
from spotd.domain import AttemptEnd, AttemptRecord, EventRecord, JobRecord
from spotd.errors import ConfigError, MailAuthError, MailError, MailRefused, MailUnavailable
from spotd.files import write_atomic
from spotd.spec import Email
from spotd.states import TERMINAL, FailureCause, JobStatus

log = logging.getLogger(__name__)

# Not imported from the engine: the engine may call into this module.
ACTIVE = tuple(s for s in JobStatus if s not in TERMINAL)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------

_DEFAULT_PORTS = {"starttls": 587, "tls": 465, "none": 25}
_WINDOW_RE = re.compile(r"(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?")


def parse_window(value: object) -> object:
    """``"7d"``, ``"1d12h"``, ``"2w"``, ``"90m"`` as a timedelta; other values unchanged.

    Unchanged values go on to pydantic's own timedelta parsing (seconds, ISO 8601).
    """
    if not isinstance(value, str):
        return value
    match = _WINDOW_RE.fullmatch(value.strip())
    if not value.strip() or match is None:
        raise ValueError(f'expected a duration like "1d", "7d" or "12h", got {value!r}')
    weeks, days, hours, minutes = (int(g) if g else 0 for g in match.groups())
    window = timedelta(weeks=weeks, days=days, hours=hours, minutes=minutes)
    if window <= timedelta(0):
        raise ValueError(f"must be longer than 0, got {value!r}")
    return window


Window = Annotated[timedelta, BeforeValidator(parse_window)]


def _default_schedules() -> dict[str, str]:
    return {"daily": "0 8 * * *", "weekly": "0 8 * * mon"}


def _default_windows() -> dict[str, timedelta]:
    return {"daily": timedelta(days=1), "weekly": timedelta(days=7)}


class EmailSettings(BaseModel):
    """The ``[email]`` table: SMTP server, recipients, report schedules, budget alerts.

    Email is off until ``host`` is set. The password is best given as
    ``SPOTD_EMAIL__PASSWORD`` rather than written into ``spotd.toml``.
    """

    model_config = ConfigDict(extra="forbid")

    host: str | None = None
    """SMTP server; None turns email off."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """None: 587 for starttls, 465 for tls, 25 for none."""
    security: Literal["starttls", "tls", "none"] = "starttls"
    """``starttls`` upgrades a plain connection; ``tls`` is TLS from the first byte."""
    username: str | None = None
    """Login name; no login when None."""
    password: SecretStr | None = None
    """Login password (``SPOTD_EMAIL__PASSWORD``); never logged or shown."""
    ca_file: Path | None = None
    """PEM file of the CAs to trust for the server's certificate; None: the system's."""
    sender: str = "spotd@localhost"
    """The From address, optionally with a display name (``spotd <spotd@example.com>``)."""
    to: tuple[Email, ...] = ()
    """Default recipients: scheduled reports and budget alerts."""
    timeout_seconds: float = Field(default=30.0, gt=0)
    """Socket timeout of one SMTP conversation."""
    schedules: dict[str, str] = Field(default_factory=_default_schedules)
    """Report name -> cron expression (minute hour day month weekday, UTC)."""
    report_windows: dict[str, Window] = Field(default_factory=_default_windows)
    """Report name -> how far back the report looks (``"1d"``, ``"7d"``)."""
    budget_thresholds: tuple[float, ...] = (0.8, 1.0)
    """Fractions of a job's budget whose crossing sends one alert each."""
    budget_check_seconds: float = Field(default=60.0, gt=0)
    """Real seconds between two budget checks of the active jobs."""
    flush_seconds: float = Field(default=60.0, gt=0)
    """Real seconds between two delivery rounds of the outbox."""
    retry_base_seconds: float = Field(default=60.0, gt=0)
    """Wait after a message's first failed send; doubles with every failure."""
    retry_max_seconds: float = Field(default=3600.0, gt=0)
    """Longest wait between two sends of one message."""

    @model_validator(mode="after")
    def _check(self) -> EmailSettings:
        for name, expression in self.schedules.items():
            if name not in self.report_windows:
                raise ValueError(f"schedule {name!r} has no entry in report_windows")
            try:
                cron_trigger(expression)
            except ValueError as exc:
                raise ValueError(f"schedule {name!r}: {exc}") from None
        if any(t <= 0 for t in self.budget_thresholds):
            raise ValueError("budget_thresholds must all be > 0")
        self.budget_thresholds = tuple(sorted(set(self.budget_thresholds)))
        return self

    @property
    def enabled(self) -> bool:
        """Whether email is configured at all."""
        return self.host is not None

    @property
    def effective_port(self) -> int:
        """The port to connect to, defaulted by ``security``."""
        return self.port or _DEFAULT_PORTS[self.security]


# ---------------------------------------------------------------------------
# Cron
# ---------------------------------------------------------------------------

_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DAY_ORDER = (1, 2, 3, 4, 5, 6, 0)


def cron_trigger(expression: str, timezone: str = "UTC") -> Any:
    """An APScheduler trigger for a five-field crontab expression, with crontab's weekdays.

    APScheduler 3 numbers weekdays from Monday = 0 while crontab uses Sunday
    = 0 (and 7); its ``from_crontab`` keeps the numbers, so ``0 8 * * 1``
    would fire on Tuesdays. The weekday field is therefore rewritten as day
    names. Crontab fires when *either* restricted day field matches and
    APScheduler when both do, so restricting both is refused rather than
    silently read differently.
    """
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 cron fields (minute hour day month weekday): {expression!r}")
    minute, hour, day, month, weekday = fields
    if day != "*" and weekday != "*":
        raise ValueError(f"restrict the day of month or the weekday, not both: {expression!r}")
    return CronTrigger(
        minute=minute, hour=hour, day=day, month=month,
        day_of_week=_crontab_weekdays(weekday), timezone=timezone,
    )


def _crontab_weekdays(spec: str) -> str:
    """Crontab's weekday field as a list of APScheduler day names."""
    if spec == "*":
        return "*"
    days: set[int] = set()
    for item in spec.lower().split(","):
        days.update(_weekday_item(item))
    return ",".join(_DAY_NAMES[d] for d in _DAY_ORDER if d in days)


def _weekday_item(item: str) -> set[int]:
    base, slash, step_text = item.partition("/")
    step = int(step_text) if slash and step_text.isdigit() else 1
    if slash and (not step_text.isdigit() or step < 1):
        raise ValueError(f"bad weekday step in {item!r}")
    if base == "*":
        low, high = 0, 6
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _weekday_value(first), _weekday_value(last)
    else:
        low = _weekday_value(base)
        high = 6 if slash else low
    if low > high:
        raise ValueError(f"weekday range runs backwards in {item!r}")
    return {d % 7 for d in range(low, high + 1, step)}


def _weekday_value(text: str) -> int:
    if text.isdigit() and int(text) <= 7:
        return int(text)
    if text[:3] in _DAY_NAMES and len(text) == 3:
        return _DAY_NAMES.index(text)
    raise ValueError(f"bad weekday {text!r} (0-7 or sun..sat)")


# ---------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------


def build_message(
    subject: str,
    text: str,
    html: str | None,
    images: Mapping[str, bytes],
    *,
    sender: str,
    to: Sequence[str],
) -> EmailMessage:
    """A multipart/alternative email: plain text, and HTML with its PNGs inline.

    ``images`` maps a Content-ID (without angle brackets) to PNG bytes; the
    HTML refers to each as ``cid:<content-id>``. The HTML part becomes a
    multipart/related part carrying the images, the layout mail clients
    expect for inline pictures.
    """
    if not to:
        raise ValueError("an email needs at least one recipient")
    if images and html is None:
        raise ValueError("inline images need an HTML part")
    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = sender
    message["To"] = ", ".join(to)
    message["Date"] = format_datetime(datetime.now(UTC))
    # An explicit domain: make_msgid's default asks DNS for our FQDN, which can stall.
    message["Message-ID"] = make_msgid(domain=_domain_of(sender))
    message.set_content(text)
    if html is not None:
        message.add_alternative(html, subtype="html")
        _attach_images(message, html, images)
    return message


def _attach_images(message: EmailMessage, html: str, images: Mapping[str, bytes]) -> None:
    html_part = next(p for p in message.iter_parts() if p.get_content_type() == "text/html")
    for cid, png in images.items():
        if not png.startswith(PNG_SIGNATURE):
            raise ValueError(f"image {cid!r} is not a PNG")
        if f"cid:{cid}" not in html:
            log.warning("image %s is not referenced by the HTML part", cid)
        html_part.add_related(
            png, maintype="image", subtype="png", cid=f"<{cid}>",
            disposition="inline", filename=f"{cid.partition('@')[0]}.png",
        )


def _domain_of(address: str) -> str:
    domain = address.rpartition("@")[2].strip(" >")
    return domain or "spotd.local"


@dataclass(frozen=True, slots=True)
class Composed:
    """An email's content, before it has a sender and recipients."""

    subject: str
    text: str
    html: str | None = None
    images: Mapping[str, bytes] = field(default_factory=dict)
    """Content-ID -> PNG bytes, referenced in ``html`` as ``cid:<content-id>``."""

    def message(self, sender: str, to: Sequence[str]) -> EmailMessage:
        """The complete message."""
        return build_message(
            self.subject, self.text, self.html, self.images, sender=sender, to=to
        )


# ---------------------------------------------------------------------------
# SMTP
# ---------------------------------------------------------------------------


class MessageSender(Protocol):
    """Anything that can deliver a finished message (SMTP, or a test double)."""

    def send_message(self, message: EmailMessage) -> None:
        """Deliver the message or raise :class:`MailError`."""
        ...


class SmtpNotifier:
    """Delivers email over SMTP (smtplib), one connection per message.

    Implements :class:`~spotd.contracts.Notifier` and :class:`MessageSender`.
    Every failure is raised as a :class:`MailError` subclass.
    """

    def __init__(self, settings: EmailSettings, *, ssl_context: ssl.SSLContext | None = None):
        if settings.host is None:
            raise ConfigError("email.host is not set: email is off")
        self._settings = settings
        self._host = settings.host
        self._ssl_context = ssl_context

    def __repr__(self) -> str:
        s = self._settings
        return (
            f"SmtpNotifier(host={s.host!r}, port={s.effective_port}, security={s.security!r}, "
            f"username={s.username!r})"
        )

    def send(
        self,
        to: Sequence[str],
        subject: str,
        text: str,
        html: str | None = None,
        images: Mapping[str, bytes] | None = None,
    ) -> None:
        """Build the message and deliver it now."""
        message = build_message(
            subject, text, html, images or {}, sender=self._settings.sender, to=to
        )
        self.send_message(message)

    def send_message(self, message: EmailMessage) -> None:
        """Deliver a finished message now."""
        try:
            with self._connect() as smtp:
                self._login(smtp)
                refused = smtp.send_message(message)
        except smtplib.SMTPAuthenticationError as exc:
            raise MailAuthError(f"{self._where()}: login refused: {_reply(exc)}") from None
        except smtplib.SMTPResponseException as exc:
            kind = MailUnavailable if 400 <= exc.smtp_code < 500 else MailRefused
            raise kind(f"{self._where()}: {_reply(exc)}") from None
        except smtplib.SMTPRecipientsRefused as exc:
            refused = exc.recipients
            raise MailRefused(f"{self._where()}: every recipient refused: {refused}") from None
        except smtplib.SMTPNotSupportedError as exc:
            raise MailRefused(f"{self._where()}: {exc}") from None
        except ssl.SSLError as exc:
            raise MailRefused(f"{self._where()}: TLS failed: {exc}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise MailUnavailable(f"{self._where()}: {type(exc).__name__}: {exc}") from None
        if refused:
            # Some recipients took it: a retry would send it to them twice.
            log.warning("%s refused %d recipient(s): %s", self._where(), len(refused), refused)

    def _connect(self) -> smtplib.SMTP:
        s = self._settings
        if s.security == "tls":
            return smtplib.SMTP_SSL(
                self._host, s.effective_port, timeout=s.timeout_seconds, context=self._context()
            )
        smtp = smtplib.SMTP(self._host, s.effective_port, timeout=s.timeout_seconds)
        if s.security == "starttls":
            try:
                smtp.starttls(context=self._context())
                smtp.ehlo()
            except BaseException:
                smtp.close()
                raise
        return smtp

    def _login(self, smtp: smtplib.SMTP) -> None:
        s = self._settings
        if s.username is None:
            return
        password = s.password.get_secret_value() if s.password is not None else ""
        smtp.login(s.username, password)

    def _context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            ca = self._settings.ca_file
            self._ssl_context = ssl.create_default_context(cafile=str(ca) if ca else None)
        return self._ssl_context

    def _where(self) -> str:
        return f"SMTP {self._host}:{self._settings.effective_port}"


def _reply(exc: smtplib.SMTPResponseException) -> str:
    detail = exc.smtp_error
    text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
    return f"{exc.smtp_code} {text}"


# ---------------------------------------------------------------------------
# Outbox
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pending:
    """A message waiting in the outbox, with its delivery history."""

    path: Path
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_error: str | None = None

    @property
    def meta_path(self) -> Path:
        """The JSON file beside the message that holds the retry state."""
        return self.path.with_suffix(".json")


class _Outcome(Enum):
    SENT = "sent"
    FAILED = "failed"
    STOP = "stop"


class Outbox:
    """A durable queue of outgoing messages: one ``.eml`` file each, written atomically.

    Files are named ``<UTC timestamp>-<uuid>.eml`` so that name order is
    age order. A message is deleted only after a successful send; a failed
    one gets a ``.json`` file beside it with its attempts and next-attempt
    time (exponential backoff). Flushes are serialised within a process by a
    lock and across processes (the daemon and ``spotd report --email``) by
    ``flock`` on ``.lock`` in the folder.
    """

    def __init__(
        self, folder: Path, *, base_delay_seconds: float = 60.0, max_delay_seconds: float = 3600.0
    ) -> None:
        self.folder = folder
        self._base = base_delay_seconds
        self._max = max_delay_seconds
        self._lock = threading.Lock()

    def put(self, message: EmailMessage, *, now: datetime | None = None) -> Path:
        """Keep ``message`` for delivery; raises OSError if it cannot be written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        at = now or datetime.now(UTC)
        path = self.folder / f"{at.astimezone(UTC):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex}.eml"
        write_atomic(path, bytes(message))
        log.info("queued email %r to %s", message["Subject"], message["To"])
        return path

    def pending(self) -> list[Pending]:
        """The waiting messages, oldest first."""
        if not self.folder.is_dir():
            return []
        return [self._read_meta(p) for p in sorted(self.folder.glob("*.eml"))]

    def flush(self, sender: MessageSender, *, now: datetime | None = None) -> int:
        """Try to send every due message, oldest first; return how many were sent.

        Never raises: failures are logged and retried on a later flush. After
        a temporary failure (server unreachable) the round stops, since the
        next messages would only wait for the same timeout.
        """
        at = now or datetime.now(UTC)
        try:
            with self._lock, self._folder_lock() as locked:
                return self._send_due(sender, at) if locked else 0
        except Exception:
            log.exception("outbox flush failed; the messages stay queued")
            return 0

    def _send_due(self, sender: MessageSender, now: datetime) -> int:
        sent = 0
        for item in self.pending():
            if item.next_attempt_at is not None and item.next_attempt_at > now:
                continue
            outcome = self._try(item, sender, now)
            if outcome is _Outcome.SENT:
                sent += 1
            elif outcome is _Outcome.STOP:
                break
        return sent

    def _try(self, item: Pending, sender: MessageSender, now: datetime) -> _Outcome:
        try:
            message = BytesParser(policy=default_policy).parsebytes(item.path.read_bytes())
        except FileNotFoundError:
            return _Outcome.FAILED  # another flush sent it meanwhile
        except OSError as exc:
            log.warning("cannot read queued email %s: %s", item.path.name, exc)
            return _Outcome.FAILED
        try:
            sender.send_message(message)
        except MailError as exc:
            self._failed(item, message, exc, now)
            return _Outcome.STOP if exc.retryable else _Outcome.FAILED
        except Exception as exc:  # a bug in a sender must not lose the message either
            self._failed(item, message, exc, now)
            return _Outcome.STOP
        self._remove(item)
        log.info("sent email %r to %s", message["Subject"], message["To"])
        return _Outcome.SENT

    def _failed(self, item: Pending, message: EmailMessage, exc: Exception, now: datetime) -> None:
        attempts = item.attempts + 1
        delay = min(self._max, self._base * 2 ** (attempts - 1))
        retry_at = now + timedelta(seconds=delay)
        log.warning(
            "could not send email %r (attempt %d, next try in %.0f s): %s: %s",
            message["Subject"], attempts, delay, type(exc).__name__, exc,
        )
        meta = {"attempts": attempts, "next_attempt_at": retry_at.isoformat(),
                "last_error": f"{type(exc).__name__}: {exc}"}
        try:
            write_atomic(item.meta_path, json.dumps(meta).encode())
        except OSError as err:
            log.warning("could not record the retry state of %s: %s", item.path.name, err)

    def _remove(self, item: Pending) -> None:
        try:
            item.path.unlink(missing_ok=True)
            item.meta_path.unlink(missing_ok=True)
        except OSError as exc:
            log.error("sent %s but could not remove it; it may be sent again: %s", item.path, exc)

    def _read_meta(self, path: Path) -> Pending:
        meta_path = path.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text())
            return Pending(
                path, int(meta["attempts"]), datetime.fromisoformat(meta["next_attempt_at"]),
                meta.get("last_error"),
            )
        except FileNotFoundError:
            return Pending(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Unreadable retry state: try the message now rather than never.
            log.warning("ignoring bad retry state %s: %s", meta_path.name, exc)
            return Pending(path)

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[bool]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / ".lock").open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False  # another process is flushing; it sends what is due
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class BuildReport(Protocol[R_co]):
    """The shape of ``spotd.reports.build_report`` with its store bound."""

    def __call__(
        self, *, since: datetime, until: datetime, job_id: str | None = None
    ) -> R_co: ...


def report_email(
    report: R,
    *,
    text: Callable[[R], str],
    html: Callable[[R, Mapping[str, str]], str],
    charts: Callable[[R], Mapping[str, bytes]],
    subject: str,
) -> Composed:
    """The report as an email: its text, its HTML, and its charts inline.

    ``html`` receives chart name -> ``cid:`` reference for every chart that
    rendered. A failing chart renderer costs the charts, not the email.
    """
    images, refs = _inline_charts(report, charts)
    return Composed(subject, text(report), html(report, refs), images)


def _inline_charts(
    report: R, charts: Callable[[R], Mapping[str, bytes]]
) -> tuple[dict[str, bytes], dict[str, str]]:
    try:
        rendered = charts(report)
    except Exception:
        log.exception("rendering the report's charts failed; sending it without them")
        return {}, {}
    images: dict[str, bytes] = {}
    refs: dict[str, str] = {}
    for name, png in rendered.items():
        cid = f"{_slug(name)}.{uuid.uuid4().hex[:12]}@spotd"
        images[cid] = png
        refs[name] = f"cid:{cid}"
    return images, refs


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "chart"


@dataclass(frozen=True, slots=True)
class ReportKit(Generic[R]):
    """The report builder and renderers, bundled for :class:`Mailer`.

    Wire with the real ones: ``ReportKit(partial(reports.build_report, store),
    reports.render_text, reports.render_html, charts.render_charts)``.
    """

    build: BuildReport[R]
    text: Callable[[R], str]
    html: Callable[[R, Mapping[str, str]], str]
    charts: Callable[[R], Mapping[str, bytes]]

    def compose(
        self, *, since: datetime, until: datetime, subject: str, job_id: str | None = None
    ) -> Composed:
        """Build the report for the window and render it as an email."""
        report = self.build(since=since, until=until, job_id=job_id)
        return report_email(
            report, text=self.text, html=self.html, charts=self.charts, subject=subject
        )


class ReportComposer(Protocol):
    """What :class:`Mailer` needs of the reports: :class:`ReportKit` fits."""

    def compose(
        self, *, since: datetime, until: datetime, subject: str, job_id: str | None = None
    ) -> Composed:
        """Build and render the report for the window (and one job, if given)."""
        ...


# ---------------------------------------------------------------------------
# Budget alerts and job-end emails
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BudgetAlert:
    """A job's spend crossed a fraction of its budget."""

    job: JobRecord
    threshold: float
    spent_usd: float
    budget_usd: float

    @property
    def key(self) -> str:
        """The notification claim key of this (job, threshold)."""
        return budget_key(self.job.id, self.threshold)


def budget_key(job_id: str, threshold: float) -> str:
    """Claim key that makes one (job, threshold) alert fire once."""
    return f"budget:{job_id}:{threshold:g}"


def budget_alerts(
    jobs: Collection[JobRecord],
    spend_of: Callable[[JobRecord], float],
    thresholds: Sequence[float],
    claim: Callable[[str], bool],
) -> list[BudgetAlert]:
    """The alerts due now: at most one per job, for the highest threshold newly crossed.

    ``claim(key)`` is True only the first time a key is claimed (the store's
    notification claims), so a threshold fires once however many ticks see
    the spend above it. Lower thresholds crossed in the same jump are
    claimed silently: a job going from 70 % to 105 % gets one email, not two.
    """
    alerts: list[BudgetAlert] = []
    for job in jobs:
        if job.spec.budget is None:
            continue
        alert = _job_alert(job, spend_of(job), job.spec.budget.max_usd, thresholds, claim)
        if alert is not None:
            alerts.append(alert)
    return alerts


def _job_alert(
    job: JobRecord,
    spent: float,
    budget: float,
    thresholds: Sequence[float],
    claim: Callable[[str], bool],
) -> BudgetAlert | None:
    crossed = [t for t in sorted(thresholds) if spent >= t * budget]
    newly = [t for t in crossed if claim(budget_key(job.id, t))]
    if not newly:
        return None
    return BudgetAlert(job, max(newly), spent, budget)


def budget_email(alert: BudgetAlert) -> Composed:
    """The email of one budget alert."""
    job = alert.job
    share = alert.spent_usd / alert.budget_usd
    subject = f"spotd: job {job.name} reached {alert.threshold:.0%} of its budget"
    text = (
        f"Job {job.name} ({job.id}) has spent {alert.spent_usd:,.2f} USD, "
        f"{share:.0%} of its budget of {alert.budget_usd:,.2f} USD.\n"
        f"Status: {job.status}.\n"
    )
    if alert.threshold >= 1.0:
        text += "The daemon stops a job when its spend reaches the budget.\n"
    html = f"<html><body><p>{html_lib.escape(text).replace(chr(10), '<br>')}</p></body></html>"
    return Composed(subject, text, html)


_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("spotd", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)


def job_end_email(
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    *,
    now: datetime,
    last_event: EventRecord | None = None,
) -> Composed:
    """The summary email of a job that ended, from the job-end templates."""
    ended = job.updated_at if job.status.terminal else now
    context = {
        "job": job,
        "status": str(job.status),
        "failure": str(job.failure) if job.failure else None,
        "detail": last_event.detail if last_event else "",
        "cost_usd": job_cost(attempts, now),
        "attempts": len(attempts),
        "preemptions": sum(a.end_reason is AttemptEnd.PREEMPTED for a in attempts),
        "submitted_at": f"{job.submitted_at:%Y-%m-%d %H:%M} UTC",
        "ended_at": f"{ended:%Y-%m-%d %H:%M} UTC",
        "elapsed": _hours(ended - job.submitted_at),
    }
    subject = f"spotd: job {job.name} {job.status}"
    if job.failure is FailureCause.OVER_BUDGET:
        subject += " (over budget)"
    text = _templates.get_template("job_end.txt.j2").render(context)
    html = _templates.get_template("job_end.html.j2").render(context)
    return Composed(subject, text, html)


def _hours(delta: timedelta) -> str:
    hours = max(0.0, delta.total_seconds() / 3600)
    return f"{hours:.1f} h"


# ---------------------------------------------------------------------------
# The mailer: what the daemon, the engine and the CLI call
# ---------------------------------------------------------------------------


class JobSource(Protocol):
    """The part of :class:`~spotd.contracts.Store` the mailer reads."""

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``statuses``."""
        ...

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        """The attempts of many jobs at once, by job id."""
        ...

    def events(self, job_id: str) -> list[EventRecord]:
        """All events of a job in order."""
        ...


class Mailer:
    """Composes spotd's emails, keeps them in the outbox, and delivers them.

    Its entry points never raise (they run in scheduler threads and in the
    reconcile loop): failures are logged, and queued messages are retried.
    ``claim(key)`` is ``store.claim_notification(key, at=now)``: True the
    first time a key is claimed, across every daemon on the database.
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
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.outbox = outbox
        self.transport = transport
        self._store = store
        self._clock = clock
        self._claim = claim
        self._reports = reports
        self._wall = wall_clock

    # -- Notifier -----------------------------------------------------------

    def send(
        self,
        to: Sequence[str],
        subject: str,
        text: str,
        html: str | None = None,
        images: Mapping[str, bytes] | None = None,
    ) -> None:
        """Queue a message for delivery (:class:`~spotd.contracts.Notifier`).

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
            return self.outbox.put(composed.message(self.settings.sender, recipients))
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
        title = subject or f"spotd report, {_span(since, until)}"
        composed = self._reports.compose(since=since, until=until, subject=title, job_id=job_id)
        path = self.queue(composed, to)
        if path is None:
            return False
        self.flush()
        return not path.exists()

    def scheduled_report(self, schedule: str) -> None:
        """The cron job of one ``[email.schedules]`` entry; never raises."""
        fired = self._wall().astimezone(UTC)
        # Several daemons on one database: the first to claim this firing sends it.
        if not self._claimed(f"report:{schedule}:{fired:%Y-%m-%dT%H:%M}"):
            return
        until = self._clock.now()
        since = until - self.settings.report_windows[schedule]
        try:
            self.email_report(
                since=since, until=until,
                subject=f"spotd {schedule} report, {_span(since, until)}",
            )
        except Exception:
            log.exception("the %s report could not be composed or queued", schedule)

    # -- engine hooks -------------------------------------------------------

    def job_ended(self, job: JobRecord) -> None:
        """Engine hook for a job that reached a terminal status; never raises.

        Sends the job-end email if its spec asks, and the budget alert an
        over-budget end crossed (the job is no longer active for
        :meth:`check_budgets` to see).
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

        Returns the number of alerts queued.
        """
        try:
            listed = self._store.list_jobs(ACTIVE) if jobs is None else list(jobs)
            budgeted = [j for j in listed if j.spec.budget is not None]
            if not budgeted:
                return 0
            attempts = self._store.attempts_for([j.id for j in budgeted])
            now = self._clock.now()
            alerts = budget_alerts(
                budgeted, lambda j: job_cost(attempts.get(j.id, []), now),
                self.settings.budget_thresholds, self._claim,
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
        now = self._clock.now()
        if self._reports is not None:
            subject = f"spotd: job {job.name} {job.status}"
            try:
                return self._reports.compose(
                    since=job.submitted_at, until=now, subject=subject, job_id=job.id
                )
            except Exception:
                # The claim is taken: send the summary rather than nothing.
                log.exception("job %s: its report failed; sending the summary", job.id)
        attempts = self._store.attempts_for([job.id]).get(job.id, [])
        events = self._store.events(job.id)
        return job_end_email(job, attempts, now=now, last_event=events[-1] if events else None)

    def _claimed(self, key: str) -> bool:
        try:
            return self._claim(key)
        except Exception:
            log.exception("could not claim notification %s; not sending it", key)
            return False


def _span(since: datetime, until: datetime) -> str:
    return f"{since.astimezone(UTC):%Y-%m-%d %H:%M} to {until.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def schedule_mail(scheduler: Any, mailer: Mailer) -> list[str]:
    """Add the mail jobs to an APScheduler 3 scheduler; return their ids.

    ``mail-flush`` every ``flush_seconds``, ``mail-budgets`` every
    ``budget_check_seconds``, and ``report-<name>`` per cron schedule.
    """
    s = mailer.settings
    common: dict[str, Any] = {"max_instances": 1, "coalesce": True}
    scheduler.add_job(
        mailer.flush, "interval", seconds=s.flush_seconds, id="mail-flush",
        next_run_time=datetime.now(UTC), **common,
    )
    scheduler.add_job(
        mailer.check_budgets, "interval", seconds=s.budget_check_seconds, id="mail-budgets",
        **common,
    )
    ids = ["mail-flush", "mail-budgets"]
    for name, expression in s.schedules.items():
        # A daemon that was down at 08:00 still sends the morning report within the hour.
        scheduler.add_job(
            mailer.scheduled_report, cron_trigger(expression), args=[name], id=f"report-{name}",
            misfire_grace_time=3600, **common,
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
) -> Mailer:
    """A mailer with SMTP transport and the outbox under ``<data_dir>/outbox``."""
    outbox = Outbox(
        data_dir / "outbox",
        base_delay_seconds=settings.retry_base_seconds,
        max_delay_seconds=settings.retry_max_seconds,
    )
    return Mailer(
        settings, outbox, SmtpNotifier(settings), store=store, clock=clock, claim=claim,
        reports=reports,
    )
