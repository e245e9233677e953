"""``spotd report --email`` end to end: real ledger, real SMTP server on loopback, real daemon."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engine_support import fast_settings, job_until_file, run_until, spec
from smtp_support import SmtpServer
from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.core.states import JobStatus
from spotd.daemon.config import load_settings
from spotd.daemon.process import Daemon
from spotd.daemon.wiring import build_engine
from spotd.engine.reconcile import Engine

SAFETY_SECONDS = 60.0
"""How long a wait for the daemon's threads goes on before the test gives up: a safety
net, far beyond what they need on any machine."""


def wait_until(check: Callable[[], bool], seconds: float = SAFETY_SECONDS) -> None:
    """Poll ``check`` until it holds; fail the test after ``seconds``."""
    limit = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < limit, f"timed out waiting for {check}"
        time.sleep(0.02)


def preempted_once(engine: Engine, job_id: str, go: Path) -> None:
    """Run the job (of :func:`job_until_file` on ``go``) until it runs, take its node
    back, and let it end once its first attempt has: the second then succeeds."""
    run_until(engine, job_id, lambda j: j.status is JobStatus.RUNNING)
    (attempt,) = engine.store.attempts(job_id)
    engine.providers[attempt.pool.provider].reclaim(attempt.instance_ids[0])  # type: ignore[attr-defined]
    run_until(engine, job_id, lambda j: engine.store.attempts(j.id)[0].ended_at is not None)
    go.touch()


@pytest.fixture
def finished_job(tmp_path: Path) -> Path:
    """A data dir whose store holds one finished, preempted-and-resumed job and its ledger."""
    root = tmp_path / "spotd"
    engine = build_engine(fast_settings(root, up=50.0))
    try:
        go = tmp_path / "go"
        job = engine.submit(spec(job_until_file(go)))
        preempted_once(engine, job.id, go)
        run_until(engine, job.id, lambda j: j.status.terminal, timeout=60)
        assert engine.store.ledger(job_id=job.id), "the engine billed the job"
    finally:
        engine.store.close()
    return root


def config_for(root: Path, smtp_port: int, **email: object) -> Path:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in email.items())
    config = root.parent / "spotd.toml"
    config.write_text(
        f'data_dir = "{root}"\n'
        f'database_url = "sqlite:///{root / "spotd.db"}"\n'
        "[daemon]\nport = 0\ntick_seconds = 0.2\nowner = \"test\"\n"
        f'[providers.sim]\nspeed = 600\nseed = 3\nmean_up_hours = 50.0\nmean_down_hours = 1.0\n'
        "boot_seconds = 60\nepoch = 2026-03-02T00:00:00Z\n"
        f'[email]\nhost = "127.0.0.1"\nport = {smtp_port}\nsecurity = "none"\n'
        'sender = "spotd@example.com"\nto = ["ops@example.com"]\n' + extra
    )
    return config


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    server = SmtpServer()
    server.start()
    yield server
    server.stop()


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_report_email_carries_the_ledger_totals(finished_job: Path, smtp: SmtpServer) -> None:
    config = config_for(finished_job, smtp.port)
    window = ["--from", "2026-01-01", "--to", "2027-01-01", "--config", str(config)]
    as_json = json.loads(run_cli("report", "--format", "json", *window))
    run_cli("report", "--email", *window)
    # Sent before the command returned, and the server stores a message before it
    # answers: one message is all there is.
    (mail,) = smtp.received
    text = mail.message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    html = mail.message.get_body(("html",)).get_content()  # type: ignore[union-attr]
    spend = f"{as_json['totals']['spend_usd']:,.2f}"
    saved = f"{as_json['totals']['savings_usd']:,.2f}"
    for part in (text, html):
        assert spend in part and saved in part
    images = [p for p in mail.message.walk() if p.get_content_type() == "image/png"]
    assert images
    for image in images:
        assert image.get_content().startswith(b"\x89PNG\r\n\x1a\n")
        assert f"cid:{image['Content-ID'].strip('<>')}" in html
    settings = load_settings(config)
    from spotd.store import open_store

    store = open_store(settings.db_url)
    try:
        ledger_total = sum(e.usd for e in store.ledger())
    finally:
        store.close()
    assert as_json["totals"]["spend_usd"] == pytest.approx(ledger_total, abs=0.005)


def test_smtp_down_the_daemon_keeps_going_and_delivers_later(
    finished_job: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = SmtpServer()  # not started: connections are refused
    config = config_for(finished_job, server.port, flush_seconds=0.2, retry_base_seconds=0.2,
                        retry_max_seconds=0.5)  # fmt: skip
    window = ["--from", "2026-01-01", "--to", "2027-01-01", "--config", str(config)]
    daemon = Daemon(load_settings(config))
    daemon.start()
    try:
        run_cli("report", "--email", *window)  # cannot send: kept in the outbox
        outbox = finished_job / "outbox"
        assert list(outbox.glob("*.eml"))
        # The daemon's flush tries it too, fails and says so; the daemon keeps running.
        wait_until(lambda: any(json.loads(p.read_text())["attempts"] >= 2
                               for p in outbox.glob("*.json")))  # fmt: skip
        assert daemon.scheduler.running, "the daemon keeps running"
        assert any("mail" in r.name or "outbox" in r.getMessage().lower() for r in caplog.records)
        server.start()
        server.wait_for(1, timeout=SAFETY_SECONDS)
        wait_until(lambda: not list(outbox.glob("*.eml")))
    finally:
        daemon.stop()
        server.stop()
    # The outbox is empty, so no later flush can send the report again, and the server
    # stored whatever was sent before it answered: delivered exactly once.
    (mail,) = server.received
    assert "spotd" in mail.message["Subject"].lower()


def test_job_end_email_carries_the_jobs_ledger_cost(tmp_path: Path, smtp: SmtpServer) -> None:
    """A preempted-and-resumed job that asked for its job-end email: the email, sent
    once the last attempt is billed, says what the store's ledger and ``spotd report``
    say the job cost, and lists where it ran and how each attempt ended."""
    from spotd.daemon.wiring import build_mailer_for

    root = tmp_path / "spotd"
    config = config_for(root, smtp.port)
    settings = load_settings(config)
    engine = build_engine(settings)
    mailer = build_mailer_for(settings, engine)
    assert mailer is not None
    engine.on_end = mailer.job_ended
    try:
        go = tmp_path / "go"
        job = engine.submit(spec(job_until_file(go),
                                 notify={"email": ["owner@example.com"], "on_end": True}))
        preempted_once(engine, job.id, go)
        job = run_until(engine, job.id, lambda j: j.status.terminal, timeout=60)
        assert job.status is JobStatus.SUCCEEDED
        attempts = engine.store.attempts(job.id)
        ledger_total = sum(e.usd for e in engine.store.ledger(job_id=job.id))
        on_demand = sum(e.on_demand_usd for e in engine.store.ledger(job_id=job.id))
    finally:
        engine.store.close()
    assert ledger_total > 0
    mailer.flush()
    (mail,) = smtp.wait_for(1)
    assert mail.rcpt_tos == ["owner@example.com"]
    assert mail.message["Subject"] == f"spotd: job {job.name} succeeded"
    text = mail.message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    html = mail.message.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert f"Cost:        {ledger_total:.2f} USD" in text
    assert f"Saved:       {on_demand - ledger_total:.2f} USD" in text
    assert f"<td>{ledger_total:.2f} USD" in html
    assert [str(a.end_reason) for a in attempts] == ["preempted", "succeeded"]
    for a in attempts:
        assert (f"#{a.seq} {a.pool.provider} {a.pool.zone} {a.pool.instance_type} x1 "
                f"{a.market}, ") in text  # fmt: skip
        assert f"<td>{a.end_reason}</td>" in html
    as_json = json.loads(run_cli("report", "--format", "json", "--job", job.id, "--from",
                                 "2026-01-01", "--to", "2027-01-01", "--config", str(config)))
    assert as_json["totals"]["spend_usd"] == pytest.approx(ledger_total, abs=0.005)
