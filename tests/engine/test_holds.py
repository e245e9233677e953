"""Debug holds: the nodes of the attempt that failed a job, kept for inspection, billed,
and stopped at the hold's end, on ``spotd release`` or on a retry.

On a scripted provider whose nodes stay up after the job's command exits (a cloud
VM's agent reports the exit; the VM runs on) and a fake clock: every step is one
call to ``tick``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, spec

from spotd.billing.ledger import ledger_so_far, spend_so_far
from spotd.core.clock import ManualClock
from spotd.core.errors import NothingHeld
from spotd.core.intents import IntentKind, IntentOutcome
from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import EventCause, InstanceReport, InstanceState, JobRecord
from spotd.daemon.views import job_view
from spotd.engine.reconcile import Engine
from spotd.engine.retrying import retry
from spotd.engine.settings import EngineSettings
from spotd.store import SqlStore, open_store
from spotd_policies.cheapest import CheapestPolicy

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
KEEP = {"keep_on_failure": "30m"}


def _engine(store: SqlStore, provider: FakeProvider, clock: ManualClock, owner: str,
            tmp_path: Path) -> Engine:  # fmt: skip
    return Engine(store, {"fake": provider}, CheapestPolicy(), clock,
                  EngineSettings(owner=owner, checkpoints_dir=tmp_path / "ck"))  # fmt: skip


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider, ManualClock]]:
    store = open_store(f"sqlite:///{tmp_path / 'h.db'}")
    provider = FakeProvider()
    clock = ManualClock(T0)
    yield _engine(store, provider, clock, "one", tmp_path), provider, clock
    store.close()


def _running(eng: Engine, clock: ManualClock, **extra: object) -> JobRecord:
    job = eng.submit(spec(**extra))
    for _ in range(5):
        eng.tick()
    running = eng.store.get_job(job.id)
    assert running.status is JobStatus.RUNNING
    clock.advance(600)  # ten minutes of running
    return running


def _fail(eng: Engine, job: JobRecord, code: int = 3) -> tuple[JobRecord, str]:
    """The job's command exits with ``code`` on its node, which its agent reports; the
    VM stays up, as a cloud's does. The failed job and its node's id."""
    (attempt,) = eng.store.attempts(job.id)
    (iid,) = attempt.instance_ids
    eng.store.save_report(InstanceReport(iid, "fake", job.id, attempt.seq, exit_code=code,
                                         address="10.0.0.7"))  # fmt: skip
    eng.tick()
    failed = eng.store.get_job(job.id)
    assert failed.status is JobStatus.FAILED and failed.failure is FailureCause.USER_COMMAND_FAILED
    return failed, iid


def test_a_failed_job_keeps_its_nodes_until_the_hold_runs_out(
    loop: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, provider, clock = loop
    job = _running(eng, clock, **KEEP)
    failed_at = clock.now()
    job, iid = _fail(eng, job)
    (attempt,) = eng.store.attempts(job.id)
    assert attempt.held_until == failed_at + timedelta(minutes=30)
    assert iid not in provider.terminated and provider.states[iid] is InstanceState.RUNNING
    assert "kept for inspection for 30 min" in eng.store.events(job.id)[-1].detail
    # Not an orphan: the reaper leaves a kept node to the hold's keeper.
    assert eng.reap() == 0 and provider.states[iid] is InstanceState.RUNNING

    view = job_view(job, eng.store.attempts(job.id), clock.now(), eng.store.reports(job.id),
                    ledger=eng.store.ledger(job_id=job.id))  # fmt: skip
    assert view.held is not None
    assert (view.held.attempt, view.held.instance_ids, view.held.addresses) == (
        1, [iid], ["10.0.0.7"],
    )  # fmt: skip
    assert view.held.until == failed_at + timedelta(minutes=30)

    # Billed as any node while kept: the cost grows with the hold.
    at_failure = _spend(eng, job)
    clock.advance(29 * 60)
    eng.tick()
    assert provider.states[iid] is InstanceState.RUNNING, "not run out yet"
    assert _spend(eng, job) == pytest.approx(at_failure + 29 / 60)  # 1 USD an hour

    clock.advance(2 * 60)
    eng.tick()
    assert provider.states[iid] is InstanceState.TERMINATED
    (attempt,) = eng.store.attempts(job.id)
    assert (attempt.held_until, attempt.released_at) == (None, clock.now())
    last = eng.store.events(job.id)[-1]
    assert (last.cause, last.from_status, last.to_status) == (
        EventCause.RELEASED, JobStatus.FAILED, JobStatus.FAILED,
    )  # fmt: skip
    assert "1 node(s) stopped, keep_on_failure ran out" in last.detail
    # The stored ledger now covers the node's whole life, hold included: 10 min + 31 min.
    billed = eng.store.ledger(job_id=job.id)
    assert max(e.end for e in billed) == clock.now()
    assert sum(e.usd for e in billed) == pytest.approx(41 / 60)
    assert eng.store.get_job(job.id).status is JobStatus.FAILED, "the job's end stands"


def _spend(eng: Engine, job: JobRecord) -> float:
    attempts = eng.store.attempts(job.id)
    billed = eng.store.ledger(job_id=job.id)
    now = eng.clock.now()
    assert sum(e.usd for e in ledger_so_far(job, attempts, billed, now)) == pytest.approx(
        spend_so_far(job, attempts, billed, now)
    ), "one cost, however it is summed"
    return spend_so_far(job, attempts, billed, now)


def test_release_stops_the_kept_nodes_in_the_next_pass(
    loop: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, provider, clock = loop
    job, iid = _fail(eng, _running(eng, clock, **KEEP))
    asked = eng.store.request_intent(job.id, IntentKind.RELEASE, at=clock.now())
    assert provider.states[iid] is InstanceState.RUNNING, "asked, not done"
    clock.advance(60)
    eng.tick()
    assert provider.states[iid] is InstanceState.TERMINATED
    (settled,) = eng.store.intents(job.id)
    assert (settled.id, settled.outcome) == (asked.id, IntentOutcome.APPLIED)
    assert "released by `spotd release`" in eng.store.events(job.id)[-1].detail
    with pytest.raises(NothingHeld, match=job.id):
        eng.store.request_intent(job.id, IntentKind.RELEASE, at=clock.now())


def test_a_release_of_a_job_that_keeps_nothing_is_refused(
    loop: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, provider, clock = loop
    job, iid = _fail(eng, _running(eng, clock))  # no keep_on_failure
    assert provider.states[iid] is InstanceState.TERMINATED, "stopped at once"
    assert eng.store.attempts(job.id)[0].held_until is None
    with pytest.raises(NothingHeld):
        eng.store.request_intent(job.id, IntentKind.RELEASE, at=clock.now())
    running = _running(eng, clock)
    with pytest.raises(NothingHeld):
        eng.store.request_intent(running.id, IntentKind.RELEASE, at=clock.now())


def test_a_job_failed_over_its_budget_keeps_nothing(
    loop: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, provider, clock = loop
    job = _running(eng, clock, budget={"max_usd": 1.0}, **KEEP)
    clock.advance(3600)
    eng.tick()
    failed = eng.store.get_job(job.id)
    assert failed.failure is FailureCause.OVER_BUDGET
    (attempt,) = eng.store.attempts(job.id)
    assert attempt.held_until is None
    assert all(provider.states[i] is InstanceState.TERMINATED for i in attempt.instance_ids)


def test_a_retry_stops_the_kept_nodes_and_runs_anew(
    loop: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, provider, clock = loop
    job, iid = _fail(eng, _running(eng, clock, **KEEP))
    retried = retry(eng.store, job.id, now=clock.now())
    assert retried.status is JobStatus.RECOVERING
    (attempt,) = eng.store.attempts(job.id)
    assert attempt.held_until == clock.now(), "the hold runs out now: a retry reuses no node"
    eng.tick()
    assert provider.states[iid] is InstanceState.TERMINATED
    released = [e for e in eng.store.events(job.id) if e.cause == EventCause.RELEASED]
    assert "the job was retried" in released[0].detail
    for _ in range(3):
        eng.tick()
    first, second = eng.store.attempts(job.id)
    assert eng.store.get_job(job.id).status is JobStatus.RUNNING
    assert (first.released_at, second.instance_ids[0] != iid) == (clock.now(), True)


def test_the_leader_ends_a_dead_daemons_hold_at_its_expiry(
    loop: tuple[Engine, FakeProvider, ManualClock], tmp_path: Path
) -> None:
    eng, provider, clock = loop
    job, iid = _fail(eng, _running(eng, clock, **KEEP))
    # Daemon "one" is gone; "two" leads and reaps for every owner.
    leader = _engine(eng.store, provider, clock, "two", tmp_path)
    leader.reap(["one", "two"])
    assert provider.states[iid] is InstanceState.RUNNING
    clock.advance(31 * 60)
    leader.tick()  # its own pass keeps only its own jobs' holds
    assert provider.states[iid] is InstanceState.RUNNING
    leader.reap(["one", "two"])
    assert provider.states[iid] is InstanceState.TERMINATED
    assert eng.store.attempts(job.id)[0].released_at == clock.now()
