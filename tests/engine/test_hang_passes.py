"""The hang watch in the reconcile loop: heartbeats alone wake no job, but a quiet
running job is looked at when its hang check is due, and a gang whose steps stopped
ends ``hung`` and is placed again (spotd.engine.hang, spotd.engine.memory)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, StepClock, count_job_loads, run_until, spec

from spotd.core.agent_wire import HeartbeatReport
from spotd.core.ranks import RankReading, RankState
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, EventCause
from spotd.engine.reconcile import Engine
from spotd.engine.reports import StoreReports
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy

Loop = tuple[Engine, StepClock, list[list[str]]]


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    """An engine on the scripted provider and a clock the test moves (re-plans a day
    apart); the third item lists each read of job records (a job stepped)."""
    clock = StepClock()
    store = open_store(f"sqlite:///{tmp_path / 'h.db'}")
    settings = EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck",
                              replan_seconds=86400.0)  # fmt: skip
    eng = Engine(store, {"fake": FakeProvider()}, CheapestPolicy(), clock, settings)
    loads = count_job_loads(store)
    yield eng, clock, loads
    store.close()


def beat(reports: StoreReports, a: AttemptRecord, step: int, state: RankState) -> None:
    """A heartbeat from the node of ``a``: two ranks at ``step``, rank 1 in ``state``."""
    ranks = (RankReading(rank=0, step=step, pid=100, state=RankState.RUNNING),
             RankReading(rank=1, step=step, pid=101, state=state))  # fmt: skip
    (iid,) = a.instance_ids
    reports.heartbeat(HeartbeatReport(job_id=a.job_id, attempt=a.seq, instance_id=iid,
                                      provider="fake", at=a.started_at, step=step,
                                      ranks=ranks))  # fmt: skip


def test_a_stalled_gang_is_found_on_its_check_and_placed_again(loop: Loop) -> None:
    eng, clock, loads = loop
    job = eng.submit(spec(gang={"hang_timeout": "10m"}))
    run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=5)
    (first,) = eng.store.attempts(job.id)
    reports = StoreReports(eng.store, clock)
    eng.tick()
    # Training: a step every minute for half an hour. Heartbeats wake no job: only its
    # hang check does, about once per timeout.
    loads.clear()
    for step in range(1, 31):
        clock.at += timedelta(minutes=1)
        beat(reports, first, step, RankState.RUNNING)
        eng.tick()
    assert 1 <= len(loads) <= 4, loads
    assert eng.store.get_job(job.id).status is JobStatus.RUNNING
    # Rank 1 stops; rank 0 waits for it. Nine minutes: not yet.
    for _ in range(9):
        clock.at += timedelta(minutes=1)
        beat(reports, first, 30, RankState.STOPPED)
        eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.RUNNING
    # The tenth: the check comes due, a heartbeat says the steps still stand.
    clock.at += timedelta(minutes=1, seconds=1)
    beat(reports, first, 30, RankState.STOPPED)
    loads.clear()
    eng.tick()
    assert loads == [[job.id]], "woken by its hang check alone"
    ended = eng.store.attempts(job.id)[0]
    assert ended.end_reason is AttemptEnd.HUNG
    assert eng.store.get_job(job.id).status is JobStatus.RECOVERING
    hang = [e for e in eng.store.events(job.id) if e.cause is EventCause.HANG]
    assert len(hang) == 1
    assert hang[0].facts.process_ranks == (1,) and hang[0].facts.node == first.instance_ids[0]
    assert "rank 1 (pid 101, stopped, step 30)" in hang[0].detail
    # Placed again, as after a preemption.
    run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=5)
    assert len(eng.store.attempts(job.id)) == 2
