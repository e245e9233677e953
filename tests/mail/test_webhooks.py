"""Webhooks on job transitions: settings, payloads, signatures, and delivery to a real
HTTP server on loopback from a real store (SQLite and PostgreSQL): retries, drops, no
repeat after a restart or with two daemons, and an engine on the simulated market."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent
from engine_support import fast_settings, job_until_file, run_until, spec
from pydantic import ValidationError
from sqlalchemy import text
from webhook_support import Receiver, api

from spotd.core.clock import ManualClock
from spotd.core.spec import JobSpec
from spotd.core.states import FailureCause, JobStatus, Transition
from spotd.core.values import EventRecord, JobRecord
from spotd.daemon.config import load_settings
from spotd.daemon.wiring import build_engine
from spotd.mail.webhook_worker import (
    LOOKBACK_EVENTS,
    WebhookDispatcher,
    build_dispatcher,
    schedule_webhooks,
    settled_key,
)
from spotd.mail.webhooks import (
    DEFAULT_TRANSITIONS,
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    JobTransition,
    WebhookSettings,
    WebhookUndelivered,
    json_payload,
    post,
    signature,
    slack_payload,
)
from spotd.store import SqlStore
from spotd.store.webhook_queries import WebhookQueries

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
S = JobStatus


def make_spec(name: str = "train", team: str | None = "nlp") -> JobSpec:
    body: dict[str, object] = {
        "name": name,
        "command": ["true"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 1},
    }
    if team is not None:
        body["team"] = team
    return JobSpec.model_validate(body)


@dataclass
class StepClock:
    """The engine's clock, moved by hand."""

    at: datetime = T0

    def now(self) -> datetime:
        return self.at

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def hook(url: str, **kw: object) -> WebhookSettings:
    return WebhookSettings.model_validate({"url": url, "retry_base_seconds": 1.0, **kw})


def dispatcher(
    store: SqlStore,
    hooks: dict[str, WebhookSettings],
    clock: StepClock,
    ticker: ManualClock | None = None,
    leading: list[bool] | None = None,
) -> WebhookDispatcher:
    queries = WebhookQueries.of(store)
    assert queries is not None
    lead = leading if leading is not None else [True]
    return WebhookDispatcher(
        hooks, store, queries, clock, leading=lambda: lead[0], wall=ticker or ManualClock(T0)
    )


def move(
    store: SqlStore, clock: StepClock, job: JobRecord, new: JobStatus, cause: str, **kw: object
) -> JobRecord:
    clock.at += timedelta(minutes=1)
    change = Transition(job.id, job.status, new, cause=cause, **kw)  # type: ignore[arg-type]
    return store.compare_and_set(change, now=clock.at)


def cancelled(store: SqlStore, clock: StepClock, name: str = "train") -> JobRecord:
    job = store.create_job(make_spec(name), now=clock.at)
    return move(store, clock, job, S.CANCELLED, "cancelled by user")


# -- settings and payloads -----------------------------------------------------------


def test_settings_defaults_and_secrets_stay_secret() -> None:
    s = hook(
        "https://hooks.example.com/services/T0/B0/XYZ",
        secret="k",
        headers={"Authorization": "Bearer tok"},
    )
    assert s.format == "json" and s.transitions == DEFAULT_TRANSITIONS
    assert s.statuses == {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.RECOVERING}
    assert s.causes == {"preempted"}
    assert s.host == "hooks.example.com"
    shown = repr(s) + str(s.model_dump())
    assert "XYZ" not in shown and "tok" not in shown and "'k'" not in shown


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "ftp://x/y"}, "http:// or https://"),
        ({"url": "https:///nohost"}, "with a host"),
        ({"transitions": ["running", "exploded"]}, "unknown transitions ['exploded']"),
        ({"headers": {"x-spotd-signature": "forged"}}, "set by spotd itself"),
        ({"format": "xml"}, "'json' or 'slack'"),
        ({"colour": "red"}, "Extra inputs"),
    ],
)
def test_bad_settings_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        WebhookSettings.model_validate({"url": "https://example.com/h", **fields})


def test_a_bad_url_is_not_echoed() -> None:
    with pytest.raises(ValidationError) as caught:
        WebhookSettings.model_validate({"url": "hooks.slack.com/services/T0/B0/SECRET"})
    assert "SECRET" not in str(caught.value)


def test_webhooks_in_the_daemon_config(tmp_path: Path) -> None:
    config = tmp_path / "spotd.toml"
    config.write_text(
        '[webhooks.ops]\nurl = "https://ops.example.com/hook"\nsecret = "s"\n'
        '[webhooks.slack]\nurl = "https://hooks.slack.com/services/A/B/C"\nformat = "slack"\n'
        'transitions = ["failed", "preempted"]\nslack_blocks = true\n'
    )
    settings = load_settings(config)
    assert sorted(settings.webhooks) == ["ops", "slack"]
    assert settings.webhooks["slack"].format == "slack"
    assert settings.webhooks["slack"].statuses == {S.FAILED}
    config.write_text('[webhooks."bad name"]\nurl = "https://x.example.com"\n')
    with pytest.raises(Exception, match="webhooks"):
        load_settings(config)


def transition_of(store: SqlStore, job: JobRecord) -> JobTransition:
    event = store.events(job.id)[-1]
    return JobTransition(event, store.get_job(job.id), 12.3456789)


def test_json_payload_carries_the_transition(store: SqlStore) -> None:
    clock = StepClock()
    job = store.create_job(make_spec(), now=clock.at)
    job = move(
        store,
        clock,
        job,
        S.FAILED,
        "no capacity",
        detail="waited 2 h",
        failure=FailureCause.NO_CAPACITY,
    )
    payload = json_payload("ops", transition_of(store, job))
    event = store.events(job.id)[-1]
    assert payload == {
        "delivery_id": f"ops:{event.id}",
        "event_id": event.id,
        "job_id": job.id,
        "job_name": "train",
        "team": "nlp",
        "from_status": "pending",
        "to_status": "failed",
        "cause": "no capacity",
        "detail": "waited 2 h",
        "failure": "no-capacity",
        "terminal": True,
        "at": (T0 + timedelta(minutes=1)).isoformat(),
        "cost_usd": 12.345679,
    }


def test_slack_payload_is_text_and_optionally_blocks() -> None:
    job = JobRecord("j-1", "train", make_spec(), S.RECOVERING, None, T0, T0)
    event = EventRecord(
        7, "j-1", T0, S.RUNNING, S.RECOVERING, "preempted", "sim-aws/us-east-1a/p4d <notice> & gone"
    )
    t = JobTransition(event, job, 1234.5)
    plain = slack_payload(t)
    assert set(plain) == {"text"}
    assert plain["text"].startswith("spotd: job *train* (`j-1`) running → recovering: preempted")
    assert "&lt;notice&gt; &amp; gone" in plain["text"], "no Slack markup from a detail"
    assert "Cost so far: 1,234.50 USD" in plain["text"]
    blocks = slack_payload(t, blocks=True)
    assert blocks["text"] == plain["text"]
    assert [b["type"] for b in blocks["blocks"]] == ["section", "context"]
    assert "team nlp" in blocks["blocks"][1]["elements"][0]["text"]


def test_post_signs_and_refuses_non_2xx(receiver: Receiver) -> None:
    s = hook(receiver.url, secret="sekrit", headers={"Authorization": "Bearer t"})
    from spotd.mail.webhooks import request_headers

    content = b'{"a":1}'
    headers = request_headers(s, "ops:3", content, now=T0)
    post(s, content, headers)
    (got,) = receiver.wait_for(1)
    assert got.body == content and got.headers["Authorization"] == "Bearer t"
    assert got.headers[DELIVERY_HEADER] == "ops:3"
    stamp = got.headers[TIMESTAMP_HEADER]
    expected = hmac.new(b"sekrit", f"{stamp}.".encode() + content, hashlib.sha256).hexdigest()
    assert got.headers[SIGNATURE_HEADER] == f"sha256={expected}"
    assert signature("sekrit", int(stamp), content) == f"sha256={expected}"
    receiver.fail_next, receiver.fail_status = 1, 400
    with pytest.raises(WebhookUndelivered, match="HTTP 400: unavailable"):
        post(s, content, headers)
    receiver.stop()
    with pytest.raises(WebhookUndelivered, match="ConnectError") as caught:
        post(s, content, headers)
    assert receiver.url not in str(caught.value)


# -- delivery from the store -------------------------------------------------------------


def test_each_chosen_transition_is_posted_once_in_order(
    store: SqlStore, receiver: Receiver
) -> None:
    clock = StepClock()
    d = dispatcher(store, {"ops": hook(receiver.url)}, clock)
    d.prepare()
    job = store.create_job(make_spec(), now=clock.at)
    job = move(store, clock, job, S.PENDING, "held", detail="team limit")  # not chosen
    other = cancelled(store, clock, "other")
    job = move(store, clock, job, S.FAILED, "over budget", failure=FailureCause.OVER_BUDGET)
    assert d.run() == 2
    assert d.run() == 0, "nothing twice"
    bodies = receiver.bodies()
    assert [(b["job_id"], b["to_status"]) for b in bodies] == [
        (other.id, "cancelled"),
        (job.id, "failed"),
    ]
    assert bodies[1]["failure"] == "over-budget" and bodies[1]["cause"] == "over budget"
    assert bodies[0]["event_id"] < bodies[1]["event_id"]
    for b in bodies:
        assert store.claim_notification(settled_key("ops", b["event_id"]), at=T0) is False


def test_a_waiting_reason_is_sent_only_to_a_hook_that_asks_for_it(
    store: SqlStore, receiver: Receiver
) -> None:
    clock = StepClock()
    hooks = {"ops": hook(receiver.url, transitions=["pending", "recovering"]),
             "why": hook(receiver.url, transitions=["waiting"])}  # fmt: skip
    d = dispatcher(store, hooks, clock)
    d.prepare()
    job = store.create_job(make_spec(), now=clock.at)
    clock.at += timedelta(minutes=1)
    assert store.set_waiting(job.id, S.PENDING, "no spot capacity in the 3 pools that fit",
                             now=clock.at)  # fmt: skip
    assert d.run() == 2
    bodies = receiver.bodies()
    # The submission goes to the hook of pending, the new reason to the hook of waiting
    # alone: it stays in its status, a transition into pending it is not.
    assert sorted((b["cause"], b["to_status"]) for b in bodies) == [
        ("submitted", "pending"), ("waiting", "pending"),
    ]  # fmt: skip
    assert next(b for b in bodies if b["cause"] == "waiting")["detail"] == (
        "no spot capacity in the 3 pools that fit"
    )
    with pytest.raises(ValidationError, match="'preempted' or 'waiting'"):
        hook(receiver.url, transitions=["waits"])


def test_cost_so_far_is_the_jobs_ledger_spend(
    tmp_path: Path, receiver: Receiver, store_url: str
) -> None:
    """An engine on the simulated market: a job is preempted, recovers and succeeds;
    the webhooks see both, in both formats, with the ledger's cost."""
    slack = Receiver().start()
    engine = build_engine(fast_settings(tmp_path / "spotd", db_url=store_url))
    try:
        assert isinstance(engine.store, SqlStore)
        hooks = {
            "ops": hook(receiver.url),
            "chat": hook(slack.url, format="slack", slack_blocks=True),
        }
        d = build_dispatcher(hooks, engine.store, engine.clock, leading=lambda: True)
        assert d is not None
        d.prepare()
        go = tmp_path / "go"  # each attempt runs until the test lets it end
        job = engine.submit(spec(job_until_file(go)))
        job = run_until(engine, job.id, lambda j: j.status is S.RUNNING)
        (attempt,) = engine.store.attempts(job.id)
        engine.providers[attempt.pool.provider].reclaim(attempt.instance_ids[0])  # type: ignore[attr-defined]
        run_until(
            engine,
            job.id,
            lambda j: any(e.to_status is S.RECOVERING for e in engine.store.events(j.id)),
        )
        assert d.run() == 2, "the recovery, to both webhooks"
        go.touch()
        job = run_until(engine, job.id, lambda j: j.status.terminal, timeout=60)
        assert job.status is S.SUCCEEDED
        assert d.run() == 2
        bodies = receiver.bodies()
        # The notice may be seen first (running -> checkpointing): not chosen by default.
        assert [(b["to_status"], b["cause"]) for b in bodies] == [
            ("recovering", "preempted"),
            ("succeeded", "succeeded"),
        ], bodies
        final = bodies[-1]
        ledger = engine.store.ledger(job_id=job.id)
        assert final["cost_usd"] == pytest.approx(sum(e.usd for e in ledger), abs=1e-6)
        assert final["cost_usd"] > bodies[0]["cost_usd"] > 0
        texts = [b["text"] for b in slack.bodies()]
        assert len(texts) == 2 and "recovering: preempted" in texts[0]
        assert f"{final['cost_usd']:,.2f} USD" in texts[1]
        assert all(b["blocks"][0]["text"]["text"] == b["text"] for b in slack.bodies())
    finally:
        slack.stop()
        engine.store.close()


def test_a_failed_post_is_retried_with_backoff_then_delivered_once(
    store: SqlStore, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    clock, ticker = StepClock(), ManualClock(T0)
    d = dispatcher(store, {"ops": hook(receiver.url, retry_base_seconds=10.0)}, clock, ticker)
    d.prepare()
    first, second = cancelled(store, clock, "a"), cancelled(store, clock, "b")
    receiver.fail_next = 2
    with caplog.at_level(logging.WARNING, logger="spotd.mail.webhook_worker"):
        assert d.run() == 0
        assert len(receiver.requests) == 1, "the endpoint fails: the second event waits untried"
        assert d.run() == 0 and len(receiver.requests) == 1, "backing off"
        ticker.advance(10)
        assert d.run() == 0 and len(receiver.requests) == 2
        ticker.advance(19)
        assert d.run() == 0, "the wait doubled: 20 s"
        ticker.advance(1)
        assert d.run() == 2
    assert "not delivered (try 1 of 8), again in 10 s: HTTP 503" in caplog.text
    assert "again in 20 s" in caplog.text
    delivered = [r.headers[DELIVERY_HEADER] for r in receiver.requests]
    events = [store.events(j.id)[-1].id for j in (first, first, first, second)]
    assert delivered == [f"ops:{e}" for e in events], "every try of one event says the same"
    assert receiver.requests[0].body == receiver.requests[2].body, "the same bytes again"
    assert d.pending() == {"ops": 0}


def test_an_event_is_dropped_after_its_tries_and_never_sent_again(
    store: SqlStore, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    clock, ticker = StepClock(), ManualClock(T0)
    d = dispatcher(store, {"ops": hook(receiver.url, max_tries=3)}, clock, ticker)
    d.prepare()
    job = cancelled(store, clock)
    receiver.stop()  # connections refused
    with caplog.at_level(logging.WARNING, logger="spotd.mail.webhook_worker"):
        for _ in range(3):
            d.run()
            ticker.advance(1000)
    assert f"dropped event {store.events(job.id)[-1].id} of job {job.id}" in caplog.text
    assert "after 3 tries: ConnectError" in caplog.text
    assert d.pending() == {"ops": 0}
    receiver.start()
    again = dispatcher(store, {"ops": hook(receiver.url, max_tries=3)}, clock)
    assert again.run() == 0 and receiver.requests == [], "settled in the store"


def test_no_repeat_after_a_restart(store: SqlStore, receiver: Receiver) -> None:
    clock = StepClock()
    hooks = {"ops": hook(receiver.url)}
    first = dispatcher(store, hooks, clock)
    first.prepare()
    cancelled(store, clock, "a")
    assert first.run() == 1
    restarted = dispatcher(store, hooks, clock)
    restarted.prepare()
    assert restarted.run() == 0
    cancelled(store, clock, "b")
    assert restarted.run() == 1
    assert [b["job_name"] for b in receiver.bodies()] == ["a", "b"]


def test_an_event_failing_when_the_daemon_stops_is_sent_by_the_next_start(
    store: SqlStore, receiver: Receiver
) -> None:
    clock = StepClock()
    hooks = {"ops": hook(receiver.url)}
    first = dispatcher(store, hooks, clock)
    first.prepare()
    cancelled(store, clock)
    receiver.fail_next = 1
    assert first.run() == 0
    restarted = dispatcher(store, hooks, clock)  # the first daemon is gone
    assert restarted.run() == 1
    assert [r.headers[DELIVERY_HEADER] for r in receiver.requests] == [
        receiver.requests[0].headers[DELIVERY_HEADER]
    ] * 2


def test_only_the_leader_sends_and_a_new_leader_repeats_nothing(
    store: SqlStore, receiver: Receiver
) -> None:
    clock = StepClock()
    hooks = {"ops": hook(receiver.url)}
    one_leads, two_leads = [True], [False]
    one = dispatcher(store, hooks, clock, leading=one_leads)
    two = dispatcher(store, hooks, clock, leading=two_leads)
    one.prepare()
    two.prepare()
    cancelled(store, clock, "a")
    assert two.run() == 0 and one.run() == 1
    assert two.run() == 0
    one_leads[0], two_leads[0] = False, True  # the leader died; the other took over
    cancelled(store, clock, "b")
    assert one.run() == 0
    assert two.run() == 1
    assert [b["job_name"] for b in receiver.bodies()] == ["a", "b"]


def test_a_webhook_sends_from_when_it_was_first_seen(store: SqlStore, receiver: Receiver) -> None:
    clock = StepClock()
    cancelled(store, clock, "before")
    clock.at += timedelta(seconds=1)
    d = dispatcher(store, {"ops": hook(receiver.url)}, clock)
    d.prepare()
    cancelled(store, clock, "after")
    assert d.run() == 1
    assert [b["job_name"] for b in receiver.bodies()] == ["after"]


def test_transitions_choose_what_is_sent(store: SqlStore, receiver: Receiver) -> None:
    clock = StepClock()
    hooks = {
        "runs": hook(receiver.url, transitions=["running"]),
        "preemptions": hook(receiver.url, transitions=["preempted"]),
    }
    d = dispatcher(store, hooks, clock)
    d.prepare()
    job = store.create_job(make_spec(), now=clock.at)
    job = move(store, clock, job, S.PROVISIONING, "placed")
    job = move(store, clock, job, S.RUNNING, "all nodes running")
    job = move(store, clock, job, S.RECOVERING, "preempted")
    job = move(store, clock, job, S.CANCELLED, "cancelled by user")
    assert d.run() == 2
    got = sorted(
        (r.headers[DELIVERY_HEADER].split(":")[0], r.json()["to_status"]) for r in receiver.requests
    )
    assert got == [("preemptions", "recovering"), ("runs", "running")]


def test_a_late_commit_below_the_last_id_seen_is_still_sent(
    store: SqlStore, receiver: Receiver
) -> None:
    """On PostgreSQL an event can commit after one with a higher id was read."""
    clock = StepClock()
    d = dispatcher(store, {"ops": hook(receiver.url)}, clock)
    d.prepare()
    late, seen = cancelled(store, clock, "late"), cancelled(store, clock, "seen")
    (late_event,) = [e for e in store.events(late.id) if e.to_status is S.CANCELLED]
    with store.engine.begin() as conn:  # "not committed yet"
        conn.execute(text("DELETE FROM events WHERE id = :id"), {"id": late_event.id})
    assert d.run() == 1
    for i in range(5):  # more events after it, fewer than the lookback
        cancelled(store, clock, f"more{i}")
    assert LOOKBACK_EVENTS > 10
    with store.engine.begin() as conn:  # now it commits, with its old id
        conn.execute(
            text(
                "INSERT INTO events (id, job_id, at, from_status, to_status, cause, detail)"
                " VALUES (:id, :job, :at, 'pending', 'cancelled', 'cancelled by user', '')"
            ),
            {"id": late_event.id, "job": late.id, "at": late_event.at},
        )
    assert d.run() == 6
    assert sorted(b["job_name"] for b in receiver.bodies()) == sorted(
        ["seen", "late", *(f"more{i}" for i in range(5))]
    )
    assert seen.id in {b["job_id"] for b in receiver.bodies()}


def test_a_store_that_fails_never_raises(
    store: SqlStore, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    clock = StepClock()
    d = dispatcher(store, {"ops": hook(receiver.url)}, clock)
    d.prepare()
    cancelled(store, clock)
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE notifications"))
    with caplog.at_level(logging.ERROR, logger="spotd.mail.webhook_worker"):
        assert d.run() == 0
    assert "webhook ops: round failed" in caplog.text


def test_schedule_webhooks_adds_one_job(store: SqlStore, receiver: Receiver) -> None:
    from apscheduler.schedulers.background import BackgroundScheduler

    scheduler = BackgroundScheduler(timezone="UTC")
    d = dispatcher(store, {"ops": hook(receiver.url)}, StepClock())
    assert schedule_webhooks(scheduler, d, seconds=0.5) == "webhooks"
    (job,) = scheduler.get_jobs()
    assert job.id == "webhooks" and job.max_instances == 1
    assert WebhookQueries.of(store) is not None
    assert store.claim_notification("webhook-start:ops", at=T0) is False, "prepared"


def test_no_dispatcher_without_webhooks_or_sql(store: SqlStore) -> None:
    assert build_dispatcher({}, store, StepClock(), leading=lambda: True) is None
    fake = object()
    hooks = {"ops": hook("https://example.com/h")}
    assert build_dispatcher(hooks, fake, StepClock(), leading=lambda: True) is None  # type: ignore[arg-type]


# -- a daemon ------------------------------------------------------------------------------


class Rounds:
    """Counts the webhook rounds a daemon's scheduler has finished (its job "webhooks")."""

    def __init__(self) -> None:
        self._done = 0
        self._changed = threading.Condition()

    def __call__(self, event: JobExecutionEvent) -> None:
        if event.job_id == "webhooks":
            with self._changed:
                self._done += 1
                self._changed.notify_all()

    def wait_for_more(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` more rounds have finished; fail the test after ``timeout``
        seconds, a safety net (a round comes every tick, a tenth of a second)."""
        with self._changed:
            target = self._done + count
            assert self._changed.wait_for(lambda: self._done >= target, timeout), (
                f"{target - self._done} webhook round(s) still to come"
            )


def test_a_daemon_posts_job_transitions_and_a_restart_repeats_none(
    tmp_path: Path, store_url: str, receiver: Receiver
) -> None:
    """The daemon as run: the API takes a job, the webhook job POSTs its end off the
    reconcile loop; a second start on the same database sends only what is new."""
    from spotd.daemon.process import Daemon

    settings = fast_settings(tmp_path / "spotd", db_url=store_url).model_copy(
        update={
            "webhooks": {
                "ops": hook(receiver.url),
                "chat": hook(receiver.url, format="slack", transitions=["succeeded"]),
            },
        }
    )

    def run_one(name: str, requests: int) -> str:
        daemon = Daemon(settings)
        rounds = Rounds()
        daemon.scheduler.add_listener(rounds, EVENT_JOB_EXECUTED)
        daemon.start()
        try:
            token = settings.token_file.read_text().strip()
            body = {
                "spec": spec("print('hi')")
                .model_copy(update={"name": name})
                .model_dump(mode="json")
            }
            job_id: str = api(daemon.port, token, "POST", "/v1/jobs", body)["id"]
            receiver.wait_for(requests, timeout=60)  # its end, to both webhooks
            # Two whole rounds more (the one under way may have begun before): nothing
            # else is due, and a round that sent something again would be counted below.
            rounds.wait_for_more(3)
            return job_id
        finally:
            daemon.stop()

    first = run_one("first", 2)
    after_first = list(receiver.requests)
    assert [r.json().get("to_status") for r in after_first if "text" not in r.json()] == [
        "succeeded"
    ]
    slack = [r.json()["text"] for r in after_first if "text" in r.json()]
    assert len(slack) == 1 and "*first*" in slack[0] and "→ succeeded" in slack[0]

    second = run_one("second", 4)
    deliveries = [r.headers[DELIVERY_HEADER] for r in receiver.requests]
    assert len(deliveries) == len(set(deliveries)) == 4, "nothing sent twice"
    json_jobs = [r.json()["job_id"] for r in receiver.requests if "job_id" in r.json()]
    assert json_jobs == [first, second]


def test_a_sender_that_raises_anything_is_backed_off_and_dropped(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    clock, ticker = StepClock(), ManualClock(T0)
    calls: list[bytes] = []

    def broken(settings: WebhookSettings, content: bytes, headers: dict[str, str]) -> None:
        calls.append(content)
        raise UnicodeEncodeError("ascii", "é", 0, 1, "a header")

    queries = WebhookQueries.of(store)
    assert queries is not None
    hooks = {"ops": hook("https://example.invalid/h", max_tries=2)}
    d = WebhookDispatcher(hooks, store, queries, clock, sender=broken, wall=ticker)
    d.prepare()
    cancelled(store, clock)
    with caplog.at_level(logging.WARNING, logger="spotd.mail.webhook_worker"):
        assert d.run() == 0
        assert d.run() == 0 and len(calls) == 1, "backed off"
        ticker.advance(100)
        assert d.run() == 0 and len(calls) == 2
    assert "after 2 tries: UnicodeEncodeError" in caplog.text
    assert d.pending() == {"ops": 0}


def test_two_daemons_on_postgresql_send_each_event_once(pg_url: str, receiver: Receiver) -> None:
    """Two daemons' dispatchers on one database, led by the real leader lock: one sends;
    when it goes, the other takes over and sends only what is new."""
    from spotd.store import open_store
    from spotd.store.base import make_engine
    from spotd.store.coordination import Coordinator

    stores = [open_store(pg_url), open_store(pg_url)]
    coordinators = [Coordinator(make_engine(pg_url)) for _ in stores]
    try:
        clock = StepClock()
        hooks = {"ops": hook(receiver.url)}
        dispatchers = [
            WebhookDispatcher(hooks, s, WebhookQueries(s.engine), clock, leading=c.try_lead)
            for s, c in zip(stores, coordinators, strict=True)
        ]
        for d in dispatchers:
            d.prepare()
        cancelled(stores[0], clock, "a")
        cancelled(stores[1], clock, "b")
        sent = [d.run() for d in dispatchers]
        assert sorted(sent) == [0, 2], "the leader sends both, the other none"
        leader = sent.index(2)
        coordinators[leader].release()  # the leader is gone
        cancelled(stores[leader], clock, "c")
        other = dispatchers[1 - leader]
        assert other.run() == 1
        assert [b["job_name"] for b in receiver.bodies()] == ["a", "b", "c"]
    finally:
        for c in coordinators:
            c.release()
        for s in stores:
            s.close()
