"""A node's progress in its report: when it last moved, on the daemon's clock, on every
store backend (spotd.store.history's merge, fed by spotd.engine.reports)."""

from __future__ import annotations

from datetime import UTC, datetime

from spotd.core.agent_wire import HeartbeatReport
from spotd.core.clock import ManualClock
from spotd.core.ranks import RankReading, RankState, ranks_of
from spotd.engine.reports import StoreReports
from spotd.store import SqlStore

T0 = datetime(2026, 5, 1, tzinfo=UTC)
JOB = "j-0123456789"


def beat(step: int | None, *ranks: RankReading) -> HeartbeatReport:
    return HeartbeatReport(job_id=JOB, attempt=1, instance_id="i-1", provider="sim", at=T0,
                           step=step, ranks=ranks)  # fmt: skip


def test_progress_at_moves_only_when_the_progress_does(store: SqlStore) -> None:
    clock = ManualClock(T0)
    reports = StoreReports(store, clock)
    rank1 = RankReading(rank=1, step=7, pid=42, state=RankState.RUNNING)
    reports.heartbeat(beat(7, rank1))
    clock.advance(30)
    reports.heartbeat(beat(7, rank1.model_copy(update={"state": RankState.STOPPED})))
    (report,) = store.reports(JOB)
    assert report.progress_at == T0, "the same steps: the progress did not move"
    assert report.heard_at == clock.now()
    assert ranks_of(report.ranks)[0].state is RankState.STOPPED, "the last readings are kept"
    moved = clock.advance(30)
    reports.heartbeat(beat(7, rank1.model_copy(update={"step": 8})))
    (report,) = store.reports(JOB)
    assert report.progress_at == report.heard_at == moved, "one rank's step moved"


def test_a_heartbeat_without_progress_leaves_it_alone(store: SqlStore) -> None:
    clock = ManualClock(T0)
    reports = StoreReports(store, clock)
    reports.heartbeat(beat(3))
    clock.advance(60)
    reports.heartbeat(beat(None))
    (report,) = store.reports(JOB)
    assert (report.progress_at, report.heard_at, report.step) == (T0, T0, 3)
    assert report.ranks is None


def test_without_the_engines_clock_nothing_is_timed(store: SqlStore) -> None:
    StoreReports(store).heartbeat(beat(3))
    (report,) = store.reports(JOB)
    assert report.step == 3 and report.progress_at is None and report.progress_key is None
