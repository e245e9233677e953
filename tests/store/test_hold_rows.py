"""The holds part of the store: a failed attempt's kept nodes, read by owner, ended once;
and what a retry writes on the job's attempts, in its transition's transaction."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotd.core.errors import NothingHeld
from spotd.core.intents import IntentKind, IntentOutcome
from spotd.core.spec import JobSpec
from spotd.core.states import FailureCause, JobStatus, Transition
from spotd.core.values import (
    AttemptClose,
    AttemptEnd,
    EventCause,
    Market,
    NewAttempt,
    Pool,
)
from spotd.store import SqlStore

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
POOL = Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
SPEC = JobSpec.model_validate(
    {"name": "t", "command": ["true"], "resources": {"gpus": ["A100"], "gpus_per_node": 1}}
)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def failed_and_held(store: SqlStore, owner: str, held_until: datetime | None) -> str:
    """A job held by ``owner`` whose one attempt failed it, its nodes kept until
    ``held_until``."""
    job = store.create_job(SPEC, now=T0)
    store.claim_jobs(owner, now=T0, lease_seconds=60)
    new = NewAttempt(pool=POOL, market=Market.SPOT, nodes=1, price_per_node_hour=1.0,
                     resume_from=None)
    placed = Transition(job.id, JobStatus.PENDING, JobStatus.PROVISIONING,
                        cause=EventCause.PLACED, open_attempt=new)
    store.compare_and_set(placed, now=at(1))
    (attempt,) = store.attempts(job.id)
    store.set_attempt_instances(attempt.id, ["i-1"])
    close = AttemptClose(attempt.id, AttemptEnd.USER_FAILED, exit_code=3, held_until=held_until)
    store.compare_and_set(Transition(job.id, JobStatus.PROVISIONING, JobStatus.FAILED,
                                     cause=AttemptEnd.USER_FAILED,
                                     failure=FailureCause.USER_COMMAND_FAILED,
                                     close_attempt=close), now=at(10))  # fmt: skip
    return job.id


def test_a_hold_is_kept_with_the_failure_and_read_by_owner(store: SqlStore) -> None:
    mine = failed_and_held(store, "one", at(40))
    failed_and_held(store, "two", at(30))
    failed_and_held(store, "one", None)  # stopped at once: no hold
    (held,) = store.held_attempts(["one"])
    assert (held.job_id, held.held_until, held.released_at) == (mine, at(40), None)
    assert held.ended_at == at(10), "closed with the failure, whatever the hold"
    assert [a.held_until for a in store.held_attempts(["one", "two"])] == [at(30), at(40)]
    assert store.held_attempts(["three"]) == []


def test_a_hold_ends_once_with_its_event_and_its_release_settled(store: SqlStore) -> None:
    job_id = failed_and_held(store, "one", at(40))
    asked = store.request_intent(job_id, IntentKind.RELEASE, at=at(12))
    version = store.get_job(job_id).version
    (held,) = store.held_attempts(["one"])
    assert store.end_hold(held.id, at=at(13), detail="1 node(s) stopped")
    (attempt,) = store.attempts(job_id)
    assert (attempt.held_until, attempt.released_at) == (None, at(13))
    last = store.events(job_id)[-1]
    assert (last.cause, last.from_status, last.to_status, last.detail) == (
        EventCause.RELEASED, JobStatus.FAILED, JobStatus.FAILED, "1 node(s) stopped",
    )  # fmt: skip
    (settled,) = store.intents(job_id)
    assert (settled.id, settled.outcome, settled.settled_at) == (
        asked.id, IntentOutcome.APPLIED, at(13),
    )  # fmt: skip
    assert store.get_job(job_id).version == version + 1, "its daemon reads it anew"
    events = store.events(job_id)
    assert not store.end_hold(held.id, at=at(14), detail="again"), "ended already"
    assert store.events(job_id) == events and store.held_attempts(["one"]) == []
    with pytest.raises(NothingHeld):
        store.request_intent(job_id, IntentKind.RELEASE, at=at(15))


def test_a_retry_cuts_the_hold_and_leaves_the_attempts_out_of_the_bounds(
    store: SqlStore,
) -> None:
    job_id = failed_and_held(store, "one", at(40))
    retried = store.compare_and_set(
        Transition(job_id, JobStatus.FAILED, JobStatus.RECOVERING, cause=EventCause.RETRIED),
        now=at(20),
    )
    assert (retried.status, retried.failure) == (JobStatus.RECOVERING, None)
    (attempt,) = store.attempts(job_id)
    assert attempt.before_retry
    assert attempt.held_until == at(20), "runs out now: the keeper stops the nodes next"
    assert store.held_attempts(["one"]) == [attempt]
