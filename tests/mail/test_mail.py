"""Email: message layout, SMTP against a real loopback server, the outbox, alerts, schedules."""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from functools import partial
from pathlib import Path

import matplotlib.image
import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from smtp_support import SmtpServer, make_cert, serving

from spotd.core.clock import ManualClock
from spotd.core.spec import JobSpec
from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventRecord,
    JobRecord,
    LedgerEntry,
    Market,
    Pool,
)
from spotd.mail import (
    PNG_SIGNATURE,
    Composed,
    EmailSettings,
    MailAuthError,
    Mailer,
    MailError,
    MailUnavailable,
    Outbox,
    ReportKit,
    SmtpNotifier,
    budget_alerts,
    build_message,
    cron_trigger,
    report_email,
    schedule_mail,
)

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SECRET = "hunter2-not-in-logs"


# --------------------------------------------------------------------------
# Stand-ins for spotd.billing.reports / spotd.billing.charts
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeReport:
    title: str
    spend: float


def fake_text(report: FakeReport) -> str:
    return f"{report.title}\nspend {report.spend:.2f} USD\n"


def fake_html(report: FakeReport, charts: Mapping[str, str]) -> str:
    imgs = "".join(f'<img alt="{name}" src="{ref}">' for name, ref in charts.items())
    body = f"<h1>{report.title}</h1><p>spend {report.spend:.2f} USD</p>{imgs}"
    return f"<html><body>{body}</body></html>"


def _png(values: list[float]) -> bytes:
    # No pyplot: no global figure state, like spotd.billing.charts.
    fig = Figure(figsize=(2, 1.5), dpi=50)
    FigureCanvasAgg(fig)
    fig.add_subplot().plot(values)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def fake_charts(report: FakeReport) -> dict[str, bytes]:
    return {"spend over time": _png([0, 1, report.spend]), "savings": _png([3, 2, 1])}


def fake_build(*, since: datetime, until: datetime, job_id: str | None = None) -> FakeReport:
    return FakeReport(f"Report {job_id or 'all'} {since:%Y-%m-%d}..{until:%Y-%m-%d}", 42.5)


FAKE_KIT = ReportKit(fake_build, fake_text, fake_html, fake_charts)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def settings(server: SmtpServer | None = None, **extra: object) -> EmailSettings:
    body: dict[str, object] = {
        "host": server.host if server else "127.0.0.1",
        "port": server.port if server else 1,
        "security": "none",
        "sender": "spotd@example.com",
        "to": ["ops@example.com"],
        "timeout_seconds": 30,  # a safety net: a loopback server answers at once
    }
    body.update(extra)
    return EmailSettings.model_validate(body)


SAFETY_SECONDS = 60.0
"""How long a wait for the scheduler's threads goes on before the test gives up: a
safety net, far beyond what they need on any machine."""


def wait_until(check: Callable[[], bool], seconds: float = SAFETY_SECONDS) -> None:
    """Poll ``check`` until it holds; fail the test after ``seconds``."""
    limit = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < limit, f"timed out waiting for {check}"
        time.sleep(0.02)


def parts_of(message: EmailMessage) -> dict[str, list[EmailMessage]]:
    found: dict[str, list[EmailMessage]] = {}
    for part in message.walk():
        found.setdefault(part.get_content_type(), []).append(part)  # type: ignore[arg-type]
    return found


def assert_report_message(message: EmailMessage, marker: str) -> None:
    """Text and HTML carry the report; every PNG is valid and referenced by cid."""
    assert message.get_content_type() == "multipart/alternative"
    parts = parts_of(message)
    (text,) = parts["text/plain"]
    (html,) = parts["text/html"]
    assert marker in text.get_content()
    html_body = html.get_content()
    assert marker in html_body
    assert "multipart/related" in parts
    pngs = parts["image/png"]
    assert len(pngs) == 2
    for png in pngs:
        cid = png["Content-ID"].strip("<>")
        assert f'src="cid:{cid}"' in html_body
        data = png.get_content()
        assert data.startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(io.BytesIO(data), format="png")
        assert image.shape[0] > 0 and image.shape[1] > 0


def report_message(to: tuple[str, ...] = ("ops@example.com",)) -> EmailMessage:
    report = FakeReport("Weekly spotd report", 42.5)
    composed = report_email(
        report, text=fake_text, html=fake_html, charts=fake_charts, subject="weekly"
    )
    return composed.message("spotd@example.com", to)


class FakeClock:
    def __init__(self, now: datetime = NOW) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


def job(
    job_id: str = "j1",
    *,
    budget: float | None = 100.0,
    status: JobStatus = JobStatus.RUNNING,
    failure: FailureCause | None = None,
    on_end: bool = False,
    emails: tuple[str, ...] = ("owner@example.com",),
) -> JobRecord:
    body: dict[str, object] = {
        "name": f"train-{job_id}",
        "command": ["python", "train.py"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 1},
        "notify": {"email": list(emails), "on_end": on_end},
    }
    if budget is not None:
        body["budget"] = {"max_usd": budget}
    return JobRecord(
        id=job_id, name=f"train-{job_id}", spec=JobSpec.model_validate(body), status=status,
        failure=failure, submitted_at=NOW - timedelta(hours=10), updated_at=NOW,
    )


def attempt(job_id: str, hours: float, price: float, *, end: AttemptEnd | None = None,
            seq: int = 1) -> AttemptRecord:
    """An attempt that has cost ``hours * price`` at NOW."""
    started = NOW - timedelta(hours=hours)
    return AttemptRecord(
        id=seq, job_id=job_id, seq=seq, pool=Pool("sim-aws", "us-east-1", "us-east-1a", "p4d"),
        market=Market.SPOT, nodes=1, price_per_node_hour=price, client_token=f"t{seq}",
        instance_ids=(f"i-{seq}",), resume_from=None, started_at=started, running_at=started,
        ended_at=NOW if end else None, end_reason=end,
    )


@dataclass
class FakeStore:
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    attempts: dict[str, list[AttemptRecord]] = field(default_factory=dict)
    claims: set[str] = field(default_factory=set)
    lines: list[LedgerEntry] = field(default_factory=list)
    """The stored ledger."""

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        return [j for j in self.jobs.values() if statuses is None or j.status in statuses]

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        return {i: list(self.attempts.get(i, [])) for i in job_ids}

    def events(self, job_id: str) -> list[EventRecord]:
        j = self.jobs[job_id]
        return [EventRecord(1, job_id, NOW, JobStatus.RUNNING, j.status, "end", "exit 0")]

    def ledger(self, *, since: datetime | None = None, until: datetime | None = None,
               job_id: str | None = None) -> list[LedgerEntry]:
        return [e for e in self.lines if job_id is None or e.job_id == job_id]

    def claim(self, key: str) -> bool:
        if key in self.claims:
            return False
        self.claims.add(key)
        return True


class RecordingSender:
    def __init__(self) -> None:
        self.sent: list[EmailMessage] = []

    def send_message(self, message: EmailMessage) -> None:
        self.sent.append(message)


def billed(a: AttemptRecord, usd: float, on_demand: float | None = None) -> LedgerEntry:
    """A stored ledger line of attempt ``a``: what the ledger billed, whatever its wall time."""
    return LedgerEntry(
        job_id=a.job_id, attempt=a.seq, provider=a.pool.provider, region=a.pool.region,
        zone=a.pool.zone, instance_type=a.pool.instance_type, gpu="A100", gpus=8, nodes=1,
        fabric="efa", market=str(a.market), kind="compute", start=a.started_at,
        end=a.ended_at or NOW, billed_seconds=3600.0, usd=usd,
        on_demand_usd=usd if on_demand is None else on_demand, job_status="running",
    )


def mailer(tmp_path: Path, store: FakeStore, sender: object = None, **extra: object) -> Mailer:
    s = settings(**extra)
    return Mailer(
        s, Outbox(tmp_path / "outbox", base_delay_seconds=0.2, max_delay_seconds=1.0),
        sender or RecordingSender(),  # type: ignore[arg-type]
        store=store, clock=FakeClock(), claim=store.claim, reports=FAKE_KIT,
    )


# --------------------------------------------------------------------------
# Message layout
# --------------------------------------------------------------------------


def test_message_is_text_and_html_with_inline_pngs() -> None:
    message = report_message()
    assert message["From"] == "spotd@example.com"
    assert message["To"] == "ops@example.com"
    assert message["Message-ID"].endswith("@example.com>")
    assert_report_message(message, "Weekly spotd report")
    related = next(p for p in message.walk() if p.get_content_type() == "multipart/related")
    assert [p.get_content_type() for p in related.iter_parts()] == [  # type: ignore[attr-defined]
        "text/html", "image/png", "image/png",
    ]


def test_message_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="recipient"):
        build_message("s", "t", None, {}, sender="a@example.com", to=[])
    with pytest.raises(ValueError, match="not a PNG"):
        build_message("s", "t", "<p>x</p>", {"a@x": b"GIF89a"}, sender="a@example.com",
                      to=["b@example.com"])
    with pytest.raises(ValueError, match="HTML"):
        build_message("s", "t", None, {"a@x": PNG_SIGNATURE}, sender="a@example.com",
                      to=["b@example.com"])


def test_text_only_message_when_no_html() -> None:
    message = build_message("s", "just text", None, {}, sender="a@example.com",
                            to=["b@example.com"])
    assert message.get_content_type() == "text/plain"


def test_failing_chart_renderer_still_sends_the_report() -> None:
    def broken(_: FakeReport) -> dict[str, bytes]:
        raise RuntimeError("matplotlib exploded")

    composed = report_email(FakeReport("R", 1.0), text=fake_text, html=fake_html,
                            charts=broken, subject="s")
    assert composed.images == {}
    assert "R" in composed.text and "<h1>R</h1>" in (composed.html or "")


# --------------------------------------------------------------------------
# SMTP against aiosmtpd
# --------------------------------------------------------------------------


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    """A plain SMTP server (no TLS, no login) on loopback."""
    with serving() as server:
        yield server


def test_send_delivers_one_message_with_text_html_and_charts(smtp_server: SmtpServer) -> None:
    notifier = SmtpNotifier(settings(smtp_server))
    notifier.send_message(report_message(("ops@example.com", "cfo@example.com")))
    # The server stores a message before it answers the DATA command, and the send
    # returned: whatever was sent is there now, so one message is all there is.
    (received,) = smtp_server.received
    assert received.mail_from == "spotd@example.com"
    assert received.rcpt_tos == ["ops@example.com", "cfo@example.com"]
    assert_report_message(received.message, "Weekly spotd report")


def test_notifier_send_builds_the_message(smtp_server: SmtpServer) -> None:
    SmtpNotifier(settings(smtp_server)).send(
        ["ops@example.com"], "hello", "plain body", "<p>html body</p>"
    )
    (received,) = smtp_server.wait_for(1)
    parts = parts_of(received.message)
    assert parts["text/plain"][0].get_content().strip() == "plain body"
    assert "html body" in parts["text/html"][0].get_content()


def test_starttls_and_login_keep_the_password_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cert = make_cert(tmp_path / "tls")
    server = SmtpServer(starttls=cert.server_context(), login=("spotd", SECRET))
    server.start()
    try:
        good = settings(server, security="starttls", ca_file=cert.cert, username="spotd",
                        password=SECRET)
        notifier = SmtpNotifier(good)
        notifier.send_message(report_message())
        (received,) = server.wait_for(1)
        assert received.authenticated_as == "spotd"
        assert_report_message(received.message, "Weekly spotd report")

        bad = SmtpNotifier(good.model_copy(update={"password": None, "username": "spotd"}))
        with pytest.raises(MailAuthError) as refused:
            bad.send_message(report_message())
        wrong = settings(server, security="starttls", ca_file=cert.cert, username="spotd",
                         password=SECRET + "x")
        with pytest.raises(MailAuthError) as refused_wrong:
            SmtpNotifier(wrong).send_message(report_message())
        outbox = Outbox(tmp_path / "outbox")
        outbox.put(report_message())
        assert outbox.flush(SmtpNotifier(wrong)) == 0
    finally:
        server.stop()
    # Our log lines, not the test server's own (aiosmtpd logs the AUTH exchange).
    ours = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("mail.log"))
    assert "login refused" in ours  # the outbox logged the failure, without the password
    assert all(SECRET not in f.read_text() for f in (tmp_path / "outbox").iterdir())
    shown = [repr(good), str(good), repr(notifier), good.model_dump_json(),
             str(good.model_dump()), str(refused.value), str(refused_wrong.value), ours]
    for text in shown:
        assert SECRET not in text
    assert "**********" in repr(good)


def test_starttls_refuses_an_unknown_certificate(tmp_path: Path) -> None:
    cert = make_cert(tmp_path / "tls")
    server = SmtpServer(starttls=cert.server_context())
    server.start()
    try:
        # No ca_file: the system CAs do not know the self-signed certificate.
        with pytest.raises(MailError, match="TLS") as exc:
            SmtpNotifier(settings(server, security="starttls")).send_message(report_message())
        assert not exc.value.retryable
    finally:
        server.stop()
    assert server.received == []


def test_implicit_tls(tmp_path: Path) -> None:
    cert = make_cert(tmp_path / "tls")
    server = SmtpServer(implicit_tls=cert.server_context())
    server.start()
    try:
        SmtpNotifier(settings(server, security="tls", ca_file=cert.cert)).send_message(
            report_message()
        )
        (received,) = server.wait_for(1)
    finally:
        server.stop()
    assert_report_message(received.message, "Weekly spotd report")


def test_password_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    class Main(BaseSettings):  # the shape of spotd.daemon.config.Settings
        model_config = SettingsConfigDict(env_prefix="SPOTD_", env_nested_delimiter="__")
        email: EmailSettings = EmailSettings()

    monkeypatch.setenv("SPOTD_EMAIL__PASSWORD", SECRET)
    monkeypatch.setenv("SPOTD_EMAIL__HOST", "smtp.example.com")
    loaded = Main().email
    assert loaded.password is not None and loaded.password.get_secret_value() == SECRET
    assert loaded.effective_port == 587
    assert SECRET not in repr(Main())


# --------------------------------------------------------------------------
# Outbox
# --------------------------------------------------------------------------


def test_outbox_keeps_the_message_while_the_server_is_down_and_sends_it_once_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = SmtpServer()  # not started: connection refused
    notifier = SmtpNotifier(settings(server))
    outbox = Outbox(tmp_path / "outbox", base_delay_seconds=60, max_delay_seconds=600)
    path = outbox.put(report_message(), now=NOW)
    assert path.name.endswith(".eml") and path.name.startswith("20260302T120000")

    with caplog.at_level(logging.WARNING, logger="spotd.mail"):
        assert outbox.flush(notifier, now=NOW) == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "next try in 60 s" in warnings[0].getMessage()
    (pending,) = outbox.pending()
    assert pending.path == path and path.exists()
    assert pending.attempts == 1 and pending.next_attempt_at == NOW + timedelta(seconds=60)

    server.start()
    try:
        caplog.clear()
        # Backing off: the server is back, but the message is not due yet.
        assert outbox.flush(notifier, now=NOW + timedelta(seconds=30)) == 0
        assert server.received == [] and caplog.records == []
        # A restarted daemon reads the same state from the folder.
        again = Outbox(tmp_path / "outbox", base_delay_seconds=60, max_delay_seconds=600)
        assert again.flush(notifier, now=NOW + timedelta(seconds=61)) == 1
        assert again.flush(notifier, now=NOW + timedelta(seconds=200)) == 0
        # The flushes sent synchronously, and the server stores a message before it
        # answers: one message is all there is.
        (received,) = server.received
    finally:
        server.stop()
    assert_report_message(received.message, "Weekly spotd report")
    assert outbox.pending() == []
    assert sorted(p.name for p in (tmp_path / "outbox").iterdir()) == [".lock"]


def test_outbox_backoff_doubles_and_is_capped(tmp_path: Path) -> None:
    class Down:
        def send_message(self, message: EmailMessage) -> None:
            raise MailUnavailable("down")

    outbox = Outbox(tmp_path, base_delay_seconds=10, max_delay_seconds=25)
    outbox.put(report_message(), now=NOW)
    at = NOW
    delays = []
    for _ in range(4):
        outbox.flush(Down(), now=at)
        (pending,) = outbox.pending()
        assert pending.next_attempt_at is not None
        delays.append((pending.next_attempt_at - at).total_seconds())
        at = pending.next_attempt_at
    assert delays == [10, 20, 25, 25]
    assert pending.attempts == 4 and pending.last_error == "MailUnavailable: down"


def test_outbox_sends_oldest_first_and_survives_a_sender_bug(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    for i in range(3):
        outbox.put(Composed(f"m{i}", "t").message("a@example.com", ["b@example.com"]),
                   now=NOW + timedelta(seconds=i))

    class Buggy:
        def send_message(self, message: EmailMessage) -> None:
            raise KeyError("bug")

    assert outbox.flush(Buggy(), now=NOW) == 0  # never raises
    assert len(outbox.pending()) == 3
    sender = RecordingSender()
    assert outbox.flush(sender, now=NOW + timedelta(hours=1)) == 3
    assert [m["Subject"] for m in sender.sent] == ["m0", "m1", "m2"]


def test_refused_message_does_not_block_the_next(tmp_path: Path) -> None:
    from spotd.core.errors import MailRefused

    outbox = Outbox(tmp_path)
    for name in ("bad", "good"):
        outbox.put(Composed(name, "t").message("a@example.com", ["b@example.com"]), now=NOW)

    class RefusesBad(RecordingSender):
        def send_message(self, message: EmailMessage) -> None:
            if message["Subject"] == "bad":
                raise MailRefused("550 no such user")
            super().send_message(message)

    sender = RefusesBad()
    # Names sort by time then uuid, so either may come first: both are tried.
    assert outbox.flush(sender, now=NOW) == 1
    assert [m["Subject"] for m in sender.sent] == ["good"]
    (left,) = outbox.pending()
    assert left.attempts == 1


def test_outbox_put_is_atomic(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.put(report_message())
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 1 and names[0].endswith(".eml")  # no temporary file left


def test_daemon_scheduler_survives_an_outage_and_delivers_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = SmtpServer()
    store = FakeStore()
    s = settings(server, flush_seconds=0.2, retry_base_seconds=0.2, retry_max_seconds=0.4,
                 budget_check_seconds=0.2, schedules={})
    mail = Mailer(
        s, Outbox(tmp_path / "outbox", base_delay_seconds=0.2, max_delay_seconds=0.4),
        SmtpNotifier(s), store=store, clock=FakeClock(), claim=store.claim, reports=FAKE_KIT,
    )
    scheduler = BackgroundScheduler(timezone="UTC")
    heartbeat = threading.Event()
    scheduler.add_job(heartbeat.set, "interval", seconds=0.1, id="reconcile")
    assert schedule_mail(scheduler, mail) == ["mail-flush", "mail-budgets"]
    scheduler.start()
    try:
        with caplog.at_level(logging.WARNING, logger="spotd.mail"):
            mail.scheduled_report("daily")
            assert len(mail.outbox.pending()) == 1
            wait_until(
                lambda: any("could not send email" in r.getMessage() for r in caplog.records)
            )
        heartbeat.clear()
        assert heartbeat.wait(SAFETY_SECONDS), "the scheduler stopped running jobs"
        assert scheduler.running
        server.start()
        server.wait_for(1, timeout=SAFETY_SECONDS)
        wait_until(lambda: mail.outbox.pending() == [])
    finally:
        scheduler.shutdown(wait=True)
        server.stop()
    # Every flush has ended and the outbox is empty: no later one can send it again, and
    # the server stored whatever was sent before it answered. Exactly one was.
    (received,) = server.received
    assert received.message["Subject"].startswith("spotd daily report, 2026-03-01 12:00")
    assert_report_message(received.message, "Report all 2026-03-01..2026-03-02")
    assert mail.outbox.pending() == []


# --------------------------------------------------------------------------
# Budget alerts
# --------------------------------------------------------------------------


def test_budget_alert_fires_once_per_threshold() -> None:
    claims: set[str] = set()

    def claim(key: str) -> bool:
        fresh = key not in claims
        claims.add(key)
        return fresh

    j = job(budget=100.0)
    spend = {"j1": 50.0}

    def tick(spent: float) -> list[float]:
        spend["j1"] = spent
        alerts = budget_alerts([j], lambda r: spend[r.id], [0.8, 1.0], claim)
        return [a.threshold for a in alerts]

    assert tick(50.0) == []
    assert tick(80.0) == [0.8]
    assert tick(85.0) == []
    assert tick(95.0) == []
    assert tick(100.0) == [1.0]
    assert tick(120.0) == []
    assert claims == {"budget:j1:0.8", "budget:j1:1"}


def test_budget_jump_past_two_thresholds_sends_one_alert() -> None:
    claims: set[str] = set()

    def claim(key: str) -> bool:
        fresh = key not in claims
        claims.add(key)
        return fresh

    jobs = [job("a", budget=10.0), job("b", budget=None)]
    alerts = budget_alerts(jobs, lambda r: 10.5, [1.0, 0.8], claim)
    assert [(a.job.id, a.threshold, a.spent_usd) for a in alerts] == [("a", 1.0, 10.5)]
    assert budget_alerts(jobs, lambda r: 11.0, [0.8, 1.0], claim) == []


def test_mailer_budget_checks_queue_one_email_per_threshold(tmp_path: Path) -> None:
    store = FakeStore(jobs={"j1": job()}, attempts={"j1": [attempt("j1", 8.2, 10.0)]})
    mail = mailer(tmp_path, store)
    assert mail.check_budgets() == 1
    assert mail.check_budgets() == 0
    store.attempts["j1"] = [attempt("j1", 10.0, 10.0)]
    assert mail.check_budgets() == 1
    assert mail.flush() == 2
    sent = mail.transport.sent  # type: ignore[attr-defined]
    assert [m["Subject"] for m in sent] == [
        "spotd: job train-j1 reached 80% of its budget",
        "spotd: job train-j1 reached 100% of its budget",
    ]
    assert sent[0]["To"] == "owner@example.com, ops@example.com"
    assert "82.00 USD" in parts_of(sent[0])["text/plain"][0].get_content()


def test_budget_alerts_count_the_ledger_not_price_times_time(tmp_path: Path) -> None:
    # Attempt 1 ran 4 h at 10 USD/h (40 by price x time) and was billed 50 (say, at the
    # prices in force); attempt 2 has run 3.5 h. By the ledger 85 of 100: the 80 % alert.
    # Price x wall time says 75, under the threshold.
    first = replace(attempt("j1", 7.5, 10.0, end=AttemptEnd.PREEMPTED),
                    ended_at=NOW - timedelta(hours=3.5))
    second = attempt("j1", 3.5, 10.0, seq=2)
    store = FakeStore(jobs={"j1": job()}, attempts={"j1": [first, second]},
                      lines=[billed(first, 50.0)])
    mail = mailer(tmp_path, store)
    assert mail.check_budgets() == 1
    assert mail.flush() == 1
    (sent,) = mail.transport.sent  # type: ignore[attr-defined]
    assert sent["Subject"] == "spotd: job train-j1 reached 80% of its budget"
    assert "has spent 85.00 USD, 85% of its budget" in parts_of(sent)["text/plain"][0].get_content()


def test_over_budget_end_sends_the_100_percent_alert_once(tmp_path: Path) -> None:
    ended = job(status=JobStatus.FAILED, failure=FailureCause.OVER_BUDGET)
    store = FakeStore(jobs={"j1": ended},
                      attempts={"j1": [attempt("j1", 10.0, 10.0, end=AttemptEnd.OVER_BUDGET)]})
    mail = mailer(tmp_path, store)
    assert mail.check_budgets() == 0  # not active any more
    mail.job_ended(ended)
    mail.job_ended(ended)
    assert mail.flush() == 1
    (sent,) = mail.transport.sent  # type: ignore[attr-defined]
    assert "100% of its budget" in sent["Subject"]


def test_broken_claims_never_reach_the_caller(tmp_path: Path) -> None:
    store = FakeStore(jobs={"j1": job()}, attempts={"j1": [attempt("j1", 9.0, 10.0)]})
    mail = mailer(tmp_path, store)

    def broken(key: str) -> bool:
        raise RuntimeError("database gone")

    mail._claim = broken
    assert mail.check_budgets() == 0
    mail.job_ended(job(on_end=True, status=JobStatus.SUCCEEDED))
    mail.scheduled_report("daily")
    assert mail.outbox.pending() == []


# --------------------------------------------------------------------------
# Job-end emails
# --------------------------------------------------------------------------


def test_job_end_email_when_the_spec_asks(tmp_path: Path) -> None:
    done = job(status=JobStatus.SUCCEEDED, on_end=True, budget=None,
               emails=("a@example.com", "b@example.com"))
    store = FakeStore(jobs={"j1": done},
                      attempts={"j1": [attempt("j1", 2.0, 3.0, end=AttemptEnd.PREEMPTED),
                                       attempt("j1", 1.0, 3.0, end=AttemptEnd.SUCCEEDED, seq=2)]})
    mail = mailer(tmp_path, store)
    mail._reports = None  # the template summary, not a full report
    mail.job_ended(done)
    mail.job_ended(done)  # a second hook call for the same job sends nothing
    mail.job_ended(job("j2", status=JobStatus.SUCCEEDED, on_end=False))
    assert mail.flush() == 1
    (sent,) = mail.transport.sent  # type: ignore[attr-defined]
    assert sent["Subject"] == "spotd: job train-j1 succeeded"
    assert sent["To"] == "a@example.com, b@example.com"
    text = parts_of(sent)["text/plain"][0].get_content()
    assert "Cost:        9.00 USD" in text and "Preemptions: 1" in text and "exit 0" in text
    assert "#1 sim-aws us-east-1a p4d x1 spot, 2.0 h, preempted, 6.00 USD" in text
    assert "#2 sim-aws us-east-1a p4d x1 spot, 1.0 h, succeeded, 3.00 USD" in text
    html_body = parts_of(sent)["text/html"][0].get_content()
    assert '<th align="left">Attempts</th><td>2</td>' in html_body
    assert "<td>preempted</td>" in html_body and "<td>succeeded</td>" in html_body


def test_job_end_email_escapes_html(tmp_path: Path) -> None:
    from spotd.mail import job_end_email

    composed = job_end_email(
        job(status=JobStatus.FAILED), [], now=NOW,
        last_event=EventRecord(1, "j1", NOW, None, JobStatus.FAILED, "x", "<script>x</script>"),
    )
    assert "<script>" not in (composed.html or "")
    assert "<script>x</script>" in composed.text


def test_job_end_email_carries_the_stored_ledger_and_its_savings(tmp_path: Path) -> None:
    # Billed 7.25 and 2.75 (minimums, prices in force) where price x time says 6 and 3;
    # on-demand would have cost 20 and 10. The report renderers wired in change nothing:
    # the job-end email is the job's ledger summary.
    done = job(status=JobStatus.SUCCEEDED, on_end=True, budget=None)
    first = attempt("j1", 2.0, 3.0, end=AttemptEnd.PREEMPTED)
    second = attempt("j1", 1.0, 3.0, end=AttemptEnd.SUCCEEDED, seq=2)
    store = FakeStore(jobs={"j1": done}, attempts={"j1": [first, second]},
                      lines=[billed(first, 7.25, 20.0), billed(second, 2.75, 10.0)])
    mail = mailer(tmp_path, store)
    mail.job_ended(done)
    assert mail.flush() == 1
    (sent,) = mail.transport.sent  # type: ignore[attr-defined]
    assert sent["Subject"] == "spotd: job train-j1 succeeded"
    text = parts_of(sent)["text/plain"][0].get_content()
    assert "Cost:        10.00 USD" in text
    assert "On-demand:   30.00 USD" in text and "Saved:       20.00 USD (67 %)" in text
    assert "preempted, 7.25 USD" in text and "succeeded, 2.75 USD" in text
    html_body = parts_of(sent)["text/html"][0].get_content()
    assert "<td>10.00 USD</td>" in html_body and "20.00 USD (67 %)" in html_body


def test_a_failed_jobs_end_email_says_why_and_shows_its_spend_with_no_saving() -> None:
    from dataclasses import replace

    from spotd.core.values import EventFacts, ExitCause
    from spotd.mail import job_end_email

    failed = replace(job(status=JobStatus.FAILED, failure=FailureCause.USER_COMMAND_FAILED),
                     failure_facts=EventFacts(exit_code=127, exit_cause=ExitCause.NOT_FOUND))
    ran = attempt("j1", 1.0, 3.0, end=AttemptEnd.USER_FAILED)
    composed = job_end_email(failed, [ran], now=NOW, ledger=[billed(ran, 3.0, 10.0)])
    assert "failed: command not found (exit 127)." in composed.text
    assert "Cost:        3.00 USD" in composed.text
    assert "Saved" not in composed.text and "On-demand" not in composed.text
    assert "Saved" not in (composed.html or "")


# --------------------------------------------------------------------------
# Scheduled reports and settings
# --------------------------------------------------------------------------


def test_scheduled_report_is_sent_once_per_firing(tmp_path: Path) -> None:
    store = FakeStore()
    mail = mailer(tmp_path, store)
    mail.wall = ManualClock(NOW)
    mail.scheduled_report("weekly")
    mail.scheduled_report("weekly")  # another daemon on the same database, same minute
    (sent,) = mail.transport.sent  # type: ignore[attr-defined]
    assert sent["Subject"] == "spotd weekly report, 2026-02-23 12:00Z to 2026-03-02 12:00Z"
    assert sent["To"] == "ops@example.com"
    assert store.claims == {"report:weekly:2026-03-02T12:00"}


def test_email_report_tells_whether_it_was_delivered(tmp_path: Path) -> None:
    store = FakeStore()

    class Down:
        def send_message(self, message: EmailMessage) -> None:
            raise MailUnavailable("connection refused")

    up = mailer(tmp_path / "up", store)
    assert up.email_report(since=NOW - timedelta(days=1), until=NOW) is True
    down = mailer(tmp_path / "down", store, sender=Down())
    day = {"since": NOW - timedelta(days=1), "until": NOW}
    assert down.email_report(**day, to=["x@example.com"]) is False
    assert len(down.outbox.pending()) == 1


def test_cron_weekdays_follow_crontab() -> None:
    monday = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
    assert monday.weekday() == 0

    def next_fire(expression: str) -> datetime:
        return cron_trigger(expression).get_next_fire_time(None, monday)  # type: ignore[no-any-return]

    assert next_fire("0 8 * * 1") == datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    assert next_fire("0 8 * * mon") == datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    assert next_fire("0 8 * * 0") == datetime(2026, 3, 8, 8, 0, tzinfo=UTC)
    assert next_fire("0 8 * * 7") == datetime(2026, 3, 8, 8, 0, tzinfo=UTC)
    assert next_fire("0 8 * * 2-4") == datetime(2026, 3, 3, 8, 0, tzinfo=UTC)
    assert next_fire("30 6 * * *") == datetime(2026, 3, 2, 6, 30, tzinfo=UTC)
    for bad in ("0 8 * *", "0 8 1 * mon", "0 8 * * funday", "0 8 * * 5-2", "61 8 * * *"):
        with pytest.raises(ValueError):
            cron_trigger(bad)


def test_settings_validate_schedules_and_windows() -> None:
    s = EmailSettings()
    assert not s.enabled
    assert s.report_windows["weekly"] == timedelta(days=7)
    assert s.budget_thresholds == (0.8, 1.0)
    custom = EmailSettings.model_validate({
        "host": "smtp.example.com", "security": "tls",
        "schedules": {"hourly": "0 * * * *"}, "report_windows": {"hourly": "1h"},
        "budget_thresholds": [1.0, 0.5, 0.5],
    })
    assert custom.effective_port == 465
    assert custom.report_windows["hourly"] == timedelta(hours=1)
    assert custom.budget_thresholds == (0.5, 1.0)
    with pytest.raises(ValidationError, match="no entry in report_windows"):
        EmailSettings.model_validate({"schedules": {"monthly": "0 8 1 * *"}})
    with pytest.raises(ValidationError, match="schedule 'daily'"):
        EmailSettings.model_validate({"schedules": {"daily": "0 8 * * someday"}})
    with pytest.raises(ValidationError, match="duration"):
        EmailSettings.model_validate({"report_windows": {"daily": "1 day"}})
    with pytest.raises(ValidationError, match="email address"):
        EmailSettings.model_validate({"to": ["not-an-address"]})
    with pytest.raises(ValidationError):
        EmailSettings.model_validate({"smtp": "typo"})


# --------------------------------------------------------------------------
# With the real reports and charts
# --------------------------------------------------------------------------


def test_real_report_email_over_smtp(tmp_path: Path, smtp_server: SmtpServer) -> None:
    from spotd.billing import charts, reports
    from spotd.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'spotd.db'}")
    try:
        kit = ReportKit(partial(reports.build_report, store), reports.render_text,
                        reports.render_html, charts.render_charts)
        composed = kit.compose(since=NOW - timedelta(days=1), until=NOW, subject="real report")
        SmtpNotifier(settings(smtp_server)).send_message(
            composed.message("spotd@example.com", ["ops@example.com"])
        )
    finally:
        store.close()
    (received,) = smtp_server.wait_for(1)
    parts = parts_of(received.message)
    assert len(parts["text/plain"]) == 1 and len(parts["text/html"]) == 1
    html_body = parts["text/html"][0].get_content()
    pngs = parts["image/png"]
    assert len(pngs) == len(reports.CHART_NAMES)
    for png in pngs:
        assert png.get_content().startswith(PNG_SIGNATURE)
        assert f"cid:{png['Content-ID'].strip('<>')}" in html_body
        matplotlib.image.imread(io.BytesIO(png.get_content()), format="png")


def test_job_end_email_shows_times_in_the_display_zone_and_a_fast_clock() -> None:
    from spotd.core.timefmt import zone_named
    from spotd.mail import job_end_email

    ended = job(status=JobStatus.SUCCEEDED)
    composed = job_end_email(ended, [], now=NOW, zone=zone_named("Asia/Tokyo"),
                             clock_note="simulated clock, 60x real time")  # fmt: skip
    submitted = ended.submitted_at.astimezone(zone_named("Asia/Tokyo"))
    assert f"Submitted:   {submitted:%Y-%m-%d %H:%M}+09:00" in composed.text, composed.text
    assert "Times:       on the simulated clock, 60x real time" in composed.text
    assert "on the simulated clock, 60x real time" in (composed.html or "")
    plain = job_end_email(ended, [], now=NOW)
    assert f"Submitted:   {ended.submitted_at:%Y-%m-%d %H:%M}Z" in plain.text
    assert "Times:" not in plain.text
