"""Intents as the loop carries them out: a cancel or a priority asked from another
thread or daemon is stored, and the pass of the daemon that holds the job acts on it.

On a scripted provider and a fake clock: every step is one call to ``tick``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from engine_support import FakeProvider, spec

from spotd.core.clock import ManualClock
from spotd.core.intents import IntentKind, IntentOutcome
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, EventCause, InstanceState, JobRecord
from spotd.engine.asked import judge_intents
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.engine.verdicts import End, Reprioritise
from spotd.store import SqlStore, open_store
from spotd_policies.cheapest import CheapestPolicy

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _engine(store: SqlStore, provider: FakeProvider, clock: ManualClock, owner: str,
            tmp_path: Path) -> Engine:  # fmt: skip
    return Engine(store, {"fake": provider}, CheapestPolicy(), clock,
                  EngineSettings(owner=owner, checkpoints_dir=tmp_path / "ck"))  # fmt: skip


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider]]:
    store = open_store(f"sqlite:///{tmp_path / 'i.db'}")
    provider = FakeProvider()
    yield _engine(store, provider, ManualClock(T0), "one", tmp_path), provider
    store.close()


def _running(eng: Engine) -> JobRecord:
    job = eng.submit(spec())
    for _ in range(5):
        eng.tick()
    running = eng.store.get_job(job.id)
    assert running.status is JobStatus.RUNNING
    return running


def test_a_cancel_asked_of_a_quiet_running_job_is_carried_out_by_the_next_pass(
    loop: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = loop
    job = _running(eng)
    for _ in range(3):
        eng.tick()  # quiet: nothing changes, nothing is stepped
    intent = eng.request_cancel(job.id)
    assert eng.store.get_job(job.id).status is JobStatus.RUNNING, "asked, not done"
    eng.tick()
    ended = eng.store.get_job(job.id)
    assert ended.status is JobStatus.CANCELLED
    (attempt,) = eng.store.attempts(job.id)
    assert attempt.end_reason is AttemptEnd.CANCELLED
    assert all(provider.states[i] is InstanceState.TERMINATED for i in attempt.instance_ids)
    (settled,) = eng.store.intents(job.id)
    assert (settled.id, settled.outcome) == (intent.id, IntentOutcome.APPLIED)
    assert eng.store.events(job.id)[-1].cause == EventCause.CANCELLED


def test_a_cancel_of_a_pending_job_comes_before_its_placement(
    loop: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = loop
    job = eng.submit(spec())
    eng.request_cancel(job.id)
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.CANCELLED
    assert provider.launched == [] and eng.store.attempts(job.id) == []


def test_a_priority_asked_is_given_by_the_next_pass(loop: tuple[Engine, FakeProvider]) -> None:
    eng, _ = loop
    job = _running(eng)
    eng.store.request_intent(job.id, IntentKind.PRIORITY, at=eng.clock.now(), priority=50)
    eng.tick()
    now = eng.store.get_job(job.id)
    assert now.spec.priority == 50 and now.status is JobStatus.RUNNING
    assert eng.store.open_intents() == {}
    assert eng.store.events(job.id)[-1].detail == "priority 0 -> 50"


def test_only_the_daemon_holding_the_job_carries_out_its_intent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    one_store, two_store = open_store(url), open_store(url)
    provider, clock = FakeProvider(), ManualClock(T0)
    one = _engine(one_store, provider, clock, "one", tmp_path)
    two = _engine(two_store, provider, clock, "two", tmp_path)
    try:
        job = _running(one)
        two.request_cancel(job.id)  # asked through the other daemon's API
        two.tick()
        assert two.store.get_job(job.id).status is JobStatus.RUNNING, "not its job"
        one.tick()
        assert one.store.get_job(job.id).status is JobStatus.CANCELLED
    finally:
        one_store.close()
        two_store.close()


def test_the_judgement_of_intents_puts_a_cancel_first(loop: tuple[Engine, FakeProvider]) -> None:
    eng, _ = loop
    job = _running(eng)
    (attempt,) = eng.store.attempts(job.id)
    priority = eng.store.request_intent(job.id, IntentKind.PRIORITY, at=eng.clock.now(),
                                        priority=5)  # fmt: skip
    assert judge_intents([priority], attempt) == Reprioritise(priority)
    cancel = eng.request_cancel(job.id)
    verdict = judge_intents([priority, cancel], attempt)
    assert isinstance(verdict, End)
    assert (verdict.status, verdict.end, verdict.attempt) == (
        JobStatus.CANCELLED, AttemptEnd.CANCELLED, attempt,
    )  # fmt: skip
    assert judge_intents([], attempt) is None
