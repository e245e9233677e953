"""``spotd retry``: a failed or cancelled job runs again under its id, from its last
complete checkpoint, keeping its attempts and its ledger; and when it may not.

The resume runs on the in-process simulated market (:mod:`spotd_sim.inprocess`) on a
:class:`ManualClock`: nodes train, checkpoint and report as the test moves the clock.
The bounds and refusals run on the scripted provider.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from engine_support import FakeProvider, memory_checkpoints, spec, ticks_until

from spotd import checkpoints
from spotd.core.clock import ManualClock
from spotd.core.errors import LostTransition, ProviderError, RetryRefused
from spotd.core.spec import JobSpec
from spotd.core.states import FailureCause, JobStatus, Transition, transition
from spotd.core.values import AttemptEnd, EventCause, InstanceState, JobRecord, LedgerEntry
from spotd.engine.reconcile import Engine
from spotd.engine.reports import StoreReports
from spotd.engine.retrying import retry
from spotd.engine.settings import EngineSettings
from spotd.store import SqlStore, open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import TrainingPlan, TrainingWorkload, build_inprocess_providers

EPOCH = datetime(2026, 3, 2, tzinfo=UTC)
TICK_SECONDS = 15 * 60.0


# -- the resume, on the in-process market ---------------------------------------------


@pytest.fixture
def uri() -> Iterator[str]:
    with memory_checkpoints("retry") as where:
        yield where


def _market_engine(store: SqlStore, clock: ManualClock) -> Engine:
    """An engine on a calm in-process market whose nodes train a minute per step."""
    aws, *_ = build_inprocess_providers(
        clock, seed=1, mean_up_hours=500.0, mean_down_hours=0.5, boot_seconds=300,
        reports=StoreReports(store),
        workloads=TrainingWorkload.factory(TrainingPlan(step_seconds=60.0,
                                                        heartbeat_seconds=300.0)),
    )  # fmt: skip
    settings = EngineSettings(owner="test", cooldown_hours=0.05, replan_seconds=1e9,
                              price_history_seconds=3600)  # fmt: skip
    return Engine(store, {aws.name: aws}, CheapestPolicy(), clock, settings)


def test_a_cancelled_job_retried_resumes_from_its_checkpoint_under_its_id(uri: str) -> None:
    clock = ManualClock(EPOCH)
    store = open_store("sqlite://")
    try:
        eng = _market_engine(store, clock)
        job = eng.submit(JobSpec.model_validate({
            "name": "resumable", "command": ["python", "train.py"],
            "resources": {"gpus": ["V100"], "gpus_per_node": 1},
            "market": {"type": "spot", "providers": ["sim-aws"]},
            "checkpoint": {"uri": uri, "interval": "20m"},
            "env": {"SPOTD_SIM_WORK_HOURS": "3"},
        }))  # fmt: skip

        def checkpointed(j: JobRecord) -> bool:
            latest = checkpoints.latest_complete(uri)
            return j.status is JobStatus.RUNNING and latest is not None and latest.step > 0

        ticks_until(eng, clock, job.id, checkpointed)
        eng.request_cancel(job.id)
        eng.tick()
        assert store.get_job(job.id).status is JobStatus.CANCELLED
        latest = checkpoints.latest_complete(uri)
        assert latest is not None and latest.step > 0
        billed_before = store.ledger(job_id=job.id)
        assert {e.attempt for e in billed_before} == {1}

        retried = retry(store, job.id, now=clock.now())
        assert (retried.id, retried.status) == (job.id, JobStatus.RECOVERING)
        ended = ticks_until(eng, clock, job.id, lambda j: j.status.terminal)

        assert ended.status is JobStatus.SUCCEEDED
        first, second = store.attempts(job.id)
        assert first.end_reason is AttemptEnd.CANCELLED and first.before_retry
        assert second.resume_from == latest.uri and not second.before_retry
        # The new attempt's node resumed from that step, not from 0.
        resumed = [r for r in store.reports(job.id) if r.attempt == second.seq]
        assert resumed and all(r.step is not None and r.step > latest.step for r in resumed)
        placed = [e for e in store.events(job.id) if e.cause == EventCause.PLACED]
        assert f"resume from step {latest.step}" in placed[-1].detail
        retry_event = next(e for e in store.events(job.id) if e.cause == EventCause.RETRIED)
        assert (retry_event.from_status, retry_event.to_status) == (
            JobStatus.CANCELLED, JobStatus.RECOVERING,
        )  # fmt: skip
        # The ledger keeps the first attempt's lines as they were, beside the second's.
        billed = store.ledger(job_id=job.id)
        assert {e.attempt for e in billed} == {1, 2}
        assert _lines(e for e in billed if e.attempt == 1) == _lines(billed_before)
    finally:
        store.close()


def _lines(entries: Iterable[LedgerEntry]) -> list[tuple[str, datetime, datetime, float]]:
    """What a ledger line bills (its ``job_status`` says how the job stands now)."""
    return [(e.kind, e.start, e.end, round(e.usd, 9)) for e in entries]


# -- bounds and refusals, on the scripted provider ------------------------------------


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider, ManualClock]]:
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    provider = FakeProvider()
    clock = ManualClock(EPOCH)
    settings = EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck", cooldown_hours=0.0)
    yield Engine(store, {"fake": provider}, CheapestPolicy(), clock, settings), provider, clock
    store.close()


def _ticks(eng: Engine, job_id: str, n: int = 6) -> JobRecord:
    for _ in range(n):
        eng.tick()
    return eng.store.get_job(job_id)


def _failed_launch() -> ProviderError:
    return ProviderError("the image is not there", provider="fake", code="ImageNotFound")


def test_a_retry_starts_the_retry_bounds_afresh(
    fake: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, provider, clock = fake
    provider.launch_errors = [_failed_launch(), _failed_launch()]
    job = eng.submit(spec(retry={"launch_failures": 1, "launch_failures_per_pool": 100}))
    failed = _ticks(eng, job.id)
    assert failed.failure is FailureCause.LAUNCH_FAILED
    # Counted over the job's life, two failed launches would fail it at the next one.
    provider.launch_errors = [_failed_launch()]
    retry(eng.store, job.id, now=clock.now())
    running = _ticks(eng, job.id)
    assert running.status is JobStatus.RUNNING and running.failure is None
    ends = [(a.end_reason, a.before_retry) for a in eng.store.attempts(job.id)]
    assert ends == [
        (AttemptEnd.LAUNCH_FAILED, True), (AttemptEnd.LAUNCH_FAILED, True),
        (AttemptEnd.LAUNCH_FAILED, False), (None, False),
    ]  # fmt: skip


def test_only_a_failed_or_cancelled_job_is_retried(
    fake: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, provider, clock = fake
    job = eng.submit(spec())
    with pytest.raises(RetryRefused, match="is pending, not ended"):
        retry(eng.store, job.id, now=clock.now())
    running = _ticks(eng, job.id)
    with pytest.raises(RetryRefused, match="is running, not ended"):
        retry(eng.store, job.id, now=clock.now())
    (iid,) = eng.store.attempts(job.id)[0].instance_ids
    provider.states[iid] = InstanceState.EXITED
    provider.exit_codes[iid] = 0
    assert _ticks(eng, running.id, 1).status is JobStatus.SUCCEEDED
    with pytest.raises(RetryRefused, match="succeeded: only a failed or cancelled job"):
        retry(eng.store, job.id, now=clock.now())
    assert eng.store.events(job.id)[-1].to_status is JobStatus.SUCCEEDED, "nothing written"


def test_a_job_that_spent_its_budget_is_refused_a_retry(
    fake: tuple[Engine, FakeProvider, ManualClock],
) -> None:
    eng, _, clock = fake
    job = eng.submit(spec(budget={"max_usd": 1.0}))
    _ticks(eng, job.id)
    clock.advance(2 * 3600)
    failed = _ticks(eng, job.id, 1)
    assert failed.failure is FailureCause.OVER_BUDGET
    with pytest.raises(RetryRefused, match=r"spent 2\.00 of its 1\.00 USD budget") as refused:
        retry(eng.store, job.id, now=clock.now())
    assert refused.value.job_id == job.id and refused.value.error_code == "retry-refused"
    assert eng.store.get_job(job.id).status is JobStatus.FAILED


def test_of_two_racing_retries_one_wins(fake: tuple[Engine, FakeProvider, ManualClock]) -> None:
    eng, _, clock = fake
    job = eng.submit(spec())
    eng.request_cancel(job.id)
    cancelled = _ticks(eng, job.id, 1)
    assert cancelled.status is JobStatus.CANCELLED
    retry(eng.store, job.id, now=clock.now())
    # The other read the job cancelled too: its compare-and-set finds it recovering.
    late = Transition(job.id, JobStatus.CANCELLED, JobStatus.RECOVERING, cause=EventCause.RETRIED)
    with pytest.raises(LostTransition):
        transition(eng.store, late, now=clock.now())
    assert [e.cause for e in eng.store.events(job.id)].count(EventCause.RETRIED) == 1
    assert _ticks(eng, job.id).status is JobStatus.RUNNING
