"""Intents in the store, on SQLite and PostgreSQL: asked once, waking the job, settled
with the transaction that ends it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotd.core.errors import IllegalTransition, JobNotFound
from spotd.core.intents import IntentKind, IntentOutcome
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus, Transition
from spotd.core.values import EventCause, EventFacts
from spotd.store import SqlStore

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def job_spec(priority: int = 0) -> JobSpec:
    return JobSpec.model_validate({
        "name": "asked", "command": "true", "priority": priority,
        "resources": {"gpus": ["A100"], "gpus_per_node": 1},
    })  # fmt: skip


def test_a_request_is_stored_open_and_wakes_the_job(store: SqlStore) -> None:
    job = store.create_job(job_spec(), now=T0)
    intent = store.request_intent(job.id, IntentKind.CANCEL, at=T0 + timedelta(minutes=1))
    assert intent.open and intent.kind is IntentKind.CANCEL and intent.job_id == job.id
    assert intent.requested_at == T0 + timedelta(minutes=1)
    assert store.get_job(job.id).version == job.version + 1, "the holder's pass steps it"
    assert store.open_intents() == {job.id: [intent]}
    assert store.open_intents([job.id, "j-other"]) == {job.id: [intent]}
    assert store.open_intents(["j-other"]) == {}


def test_asking_again_what_is_asked_stores_nothing_new(store: SqlStore) -> None:
    job = store.create_job(job_spec(), now=T0)
    first = store.request_intent(job.id, IntentKind.CANCEL, at=T0)
    again = store.request_intent(job.id, IntentKind.CANCEL, at=T0 + timedelta(seconds=5))
    assert again.id == first.id
    asked = store.request_intent(job.id, IntentKind.PRIORITY, at=T0, priority=3)
    changed = store.request_intent(job.id, IntentKind.PRIORITY, at=T0, priority=7)
    assert changed.id == asked.id and changed.priority == 7, "the latest figure wins"
    assert [i.kind for i in store.intents(job.id)] == [IntentKind.CANCEL, IntentKind.PRIORITY]


def test_an_unknown_or_ended_job_is_refused(store: SqlStore) -> None:
    with pytest.raises(JobNotFound):
        store.request_intent("j-none", IntentKind.CANCEL, at=T0)
    job = store.create_job(job_spec(), now=T0)
    store.compare_and_set(
        Transition(job.id, JobStatus.PENDING, JobStatus.CANCELLED, EventCause.CANCELLED), now=T0
    )
    with pytest.raises(IllegalTransition, match="already cancelled"):
        store.request_intent(job.id, IntentKind.CANCEL, at=T0)
    assert store.intents(job.id) == []


@pytest.mark.parametrize(
    ("ended", "outcome"),
    [(JobStatus.CANCELLED, IntentOutcome.APPLIED), (JobStatus.FAILED, IntentOutcome.MOOT)],
)
def test_the_transition_that_ends_a_job_settles_its_intents(
    store: SqlStore, ended: JobStatus, outcome: IntentOutcome
) -> None:
    job = store.create_job(job_spec(), now=T0)
    store.request_intent(job.id, IntentKind.CANCEL, at=T0)
    store.request_intent(job.id, IntentKind.PRIORITY, at=T0, priority=2)
    done = T0 + timedelta(minutes=3)
    store.compare_and_set(Transition(job.id, JobStatus.PENDING, ended, EventCause.CANCELLED),
                          now=done)  # fmt: skip
    cancel, priority = store.intents(job.id)
    assert (cancel.outcome, cancel.settled_at) == (outcome, done)
    assert (priority.outcome, priority.settled_at) == (IntentOutcome.MOOT, done)
    assert store.open_intents() == {}


def test_a_transition_that_does_not_end_the_job_leaves_its_intents_open(store: SqlStore) -> None:
    job = store.create_job(job_spec(), now=T0)
    intent = store.request_intent(job.id, IntentKind.CANCEL, at=T0)
    store.compare_and_set(
        Transition(job.id, JobStatus.PENDING, JobStatus.PENDING, EventCause.HELD), now=T0
    )
    assert store.open_intents() == {job.id: [intent]}


def test_a_priority_is_applied_with_an_event_and_settled(store: SqlStore) -> None:
    job = store.create_job(job_spec(priority=1), now=T0)
    intent = store.request_intent(job.id, IntentKind.PRIORITY, at=T0, priority=9)
    before = store.get_job(job.id).version
    moved = store.apply_priority(intent, at=T0 + timedelta(minutes=2))
    assert moved.spec.priority == 9 and moved.status is JobStatus.PENDING
    assert moved.version == before + 1
    last = store.events(job.id)[-1]
    assert (last.from_status, last.to_status) == (JobStatus.PENDING, JobStatus.PENDING)
    assert last.cause == EventCause.PRIORITY and last.detail == "priority 1 -> 9"
    (settled,) = store.intents(job.id)
    assert settled.outcome is IntentOutcome.APPLIED and not settled.open
    assert store.get_job(job.id).spec == job.spec.model_copy(update={"priority": 9})


def test_a_drill_keeps_its_node_and_is_settled_with_its_event(store: SqlStore) -> None:
    job = store.create_job(job_spec(), now=T0)
    first = store.request_intent(job.id, IntentKind.DRILL, at=T0, node=1)
    again = store.request_intent(job.id, IntentKind.DRILL, at=T0, node=2)
    assert again.id == first.id and again.node == 2, "the latest node wins"
    assert store.open_intents([job.id])[job.id][0].node == 2
    facts = EventFacts(node="i-2", rank=2, provider="fake")
    store.settle_intent(again, IntentOutcome.APPLIED, at=T0 + timedelta(seconds=1),
                        cause=EventCause.DRILL, detail="node 2 preempted", facts=facts)  # fmt: skip
    (settled,) = store.intents(job.id)
    assert (settled.outcome, settled.node) == (IntentOutcome.APPLIED, 2)
    assert store.open_intents([job.id]) == {}
    event = store.events(job.id)[-1]
    assert (event.cause, event.from_status, event.to_status) == (
        EventCause.DRILL, JobStatus.PENDING, JobStatus.PENDING)  # fmt: skip
    assert event.facts == facts and event.detail == "node 2 preempted"


def test_an_intent_settled_without_a_cause_writes_no_event(store: SqlStore) -> None:
    job = store.create_job(job_spec(), now=T0)
    intent = store.request_intent(job.id, IntentKind.DRILL, at=T0, node=0)
    events = len(store.events(job.id))
    store.settle_intent(intent, IntentOutcome.MOOT, at=T0)
    assert len(store.events(job.id)) == events
    assert store.intents(job.id)[0].outcome is IntentOutcome.MOOT
