"""The queue: placement by priority then age, and the teams' limits that hold jobs pending."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, run_until, spec

from spotd.core.errors import CapacityError
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptEnd,
    Instance,
    InstanceState,
    JobRecord,
    LaunchRequest,
    LedgerEntry,
)
from spotd.daemon.config import Settings
from spotd.engine.reconcile import Engine
from spotd.engine.settings import TAG_JOB, EngineSettings
from spotd.engine.teams import TeamLimits, month_start, pass_order, team_usage
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy


@dataclass
class OneSlot(FakeProvider):
    """A market with room for one node at a time: a launch while one runs is refused."""

    def launch(self, request: LaunchRequest) -> list[Instance]:
        if any(s in (InstanceState.RUNNING, InstanceState.NOTICE) for s in self.states.values()):
            raise CapacityError("no capacity left", provider=self.name)
        return super().launch(request)


def _engine(tmp_path: Path, provider: FakeProvider, **teams: TeamLimits) -> Engine:
    from spotd_sim import SimClock

    store = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    # Mid-month: at an hour a second, a test run on a month's last day would cross
    # into the next month, and the monthly budgets start again.
    clock = SimClock(tmp_path / "clock", 3600.0, sim_epoch=datetime(2026, 6, 15, tzinfo=UTC))
    settings = EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck", teams=teams)
    return Engine(store, {provider.name: provider}, CheapestPolicy(), clock, settings)


@pytest.fixture
def one_slot(tmp_path: Path) -> Iterator[tuple[Engine, OneSlot]]:
    provider = OneSlot()
    eng = _engine(tmp_path, provider)
    yield eng, provider
    eng.store.close()


def _placed(provider: FakeProvider) -> list[str]:
    """The job ids of the launches that went through, in order."""
    return [r.tags[TAG_JOB] for r in provider.launched]


def _finish(provider: FakeProvider, eng: Engine, job_id: str) -> None:
    (iid,) = eng.store.attempts(job_id)[-1].instance_ids
    provider.states[iid] = InstanceState.EXITED
    provider.exit_codes[iid] = 0


def _ended(job: JobRecord) -> bool:
    return job.status.terminal


def test_the_higher_priority_job_gets_the_one_slot(one_slot: tuple[Engine, OneSlot]) -> None:
    eng, provider = one_slot
    low = eng.submit(spec(name="low"))
    high = eng.submit(spec(name="high", priority=10))
    eng.tick()
    # Submitted later, placed first: the pass steps the higher priority before the older.
    assert _placed(provider) == [high.id]
    assert eng.store.get_job(high.id).status is JobStatus.PROVISIONING
    (refused,) = eng.store.attempts(low.id)
    assert refused.end_reason is AttemptEnd.NO_CAPACITY
    # The low one runs once the slot is free, not before.
    _finish(provider, eng, high.id)
    run_until(eng, high.id, _ended, timeout=10)
    run_until(eng, low.id, lambda j: j.status is JobStatus.RUNNING, timeout=10)
    assert _placed(provider) == [high.id, low.id]


def test_equal_priorities_go_oldest_first(one_slot: tuple[Engine, OneSlot]) -> None:
    eng, provider = one_slot
    first = eng.submit(spec(name="first", priority=5))
    second = eng.submit(spec(name="second", priority=5))
    eng.tick()
    assert _placed(provider) == [first.id]
    assert eng.store.attempts(second.id)[0].end_reason is AttemptEnd.NO_CAPACITY


def test_a_running_job_is_not_stopped_for_a_higher_one(one_slot: tuple[Engine, OneSlot]) -> None:
    eng, provider = one_slot
    low = eng.submit(spec(name="low"))
    run_until(eng, low.id, lambda j: j.status is JobStatus.RUNNING, timeout=10)
    high = eng.submit(spec(name="high", priority=100))
    for _ in range(3):
        eng.tick()
    # No preemption by priority: the low job keeps its node, the high one waits.
    assert eng.store.get_job(low.id).status is JobStatus.RUNNING
    assert _placed(provider) == [low.id]
    assert all(a.end_reason is AttemptEnd.NO_CAPACITY for a in eng.store.attempts(high.id))


def test_pass_order_is_priority_then_age(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'o.db'}")
    t0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    jobs = [
        store.create_job(spec(name=name, priority=p), now=t0 + timedelta(minutes=i))
        for i, (name, p) in enumerate([("a", 0), ("b", 3), ("c", 0), ("d", 3), ("e", -1)])
    ]
    assert [j.name for j in pass_order(jobs)] == ["b", "d", "a", "c", "e"]
    store.close()


# -- teams --------------------------------------------------------------------------


def test_team_concurrency_holds_jobs_pending(tmp_path: Path) -> None:
    provider = FakeProvider()
    eng = _engine(tmp_path, provider, ml=TeamLimits(max_running_jobs=1))
    one = eng.submit(spec(name="one", team="ml"))
    two = eng.submit(spec(name="two", team="ml"))
    other = eng.submit(spec(name="other", team="vision"))
    loner = eng.submit(spec(name="loner"))
    eng.tick()
    eng.tick()
    # One ml job at a time; a team without limits and a job without a team are not held.
    assert set(_placed(provider)) == {one.id, other.id, loner.id}
    held = eng.store.get_job(two.id)
    assert held.status is JobStatus.PENDING and held.failure is None
    events = eng.store.events(two.id)
    assert [e.cause for e in events].count("held") == 1  # said once, not every pass
    assert events[-1].to_status is JobStatus.PENDING
    assert "[teams.ml] max_running_jobs" in events[-1].detail
    # A new engine (a restart, another daemon) does not say it again either.
    again = Engine(eng.store, eng.providers, eng.policy, eng.clock, eng.settings)
    again.tick()
    assert [e.cause for e in eng.store.events(two.id)].count("held") == 1
    # Once the first one ends, the held one starts.
    _finish(provider, eng, one.id)
    run_until(eng, one.id, _ended, timeout=10)
    run_until(eng, two.id, lambda j: j.status is JobStatus.RUNNING, timeout=10)
    causes = [e.cause for e in eng.store.events(two.id)]
    assert causes.index("held") < causes.index("placed")
    eng.store.close()


def _bill(eng: Engine, job: JobRecord, usd: float, at: datetime) -> None:
    """A stored ledger line of ``usd`` for the job, starting at ``at``."""
    line = LedgerEntry(
        job_id=job.id, attempt=1, provider="fake", region="r1", zone="r1a",
        instance_type="x1.gpu", gpu="A100", gpus=1, nodes=1, fabric="ethernet",
        market="spot", kind="compute", start=at, end=at + timedelta(hours=1),
        billed_seconds=3600.0, usd=usd, on_demand_usd=usd * 3, job_status="cancelled",
    )  # fmt: skip
    eng.store.replace_ledger(job.id, [line])


def test_team_monthly_budget_holds_jobs_pending(tmp_path: Path) -> None:
    provider = FakeProvider()
    # 100 USD: room for what the job spends (1 USD/h) until the budgets' next look, 60
    # hours away on this clock (60 s at 3600x), once this month's spend is gone.
    eng = _engine(tmp_path, provider, ml=TeamLimits(monthly_budget_usd=100.0))
    now = eng.clock.now()
    spent = eng.store.create_job(spec(name="spent", team="ml"), now=now)
    eng.request_cancel(spent.id)
    eng.tick()
    _bill(eng, spent, 110.0, month_start(now) + timedelta(hours=1))
    assert team_usage(eng.store, now, ["ml"])["ml"].spent_usd == pytest.approx(110.0)
    job = eng.submit(spec(name="next", team="ml"))
    free = eng.submit(spec(name="free", team="vision"))
    eng.tick()
    assert _placed(provider) == [free.id]
    held = eng.store.get_job(job.id)
    assert held.status is JobStatus.PENDING
    last = eng.store.events(job.id)[-1]
    assert last.cause == "held"
    assert "has spent its 100.00 USD of this month ([teams.ml] monthly_budget_usd)" in last.detail
    # Last month's spend does not count: billed before the month began, the job starts.
    _bill(eng, spent, 110.0, month_start(now) - timedelta(days=2))
    assert team_usage(eng.store, now, ["ml"])["ml"].spent_usd == 0.0
    run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=10)
    eng.store.close()


def test_a_running_jobs_spend_counts_against_its_team(tmp_path: Path) -> None:
    provider = FakeProvider()
    eng = _engine(tmp_path, provider)
    job = eng.submit(spec(name="runs", team="ml"))
    run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=10)
    later = eng.clock.now() + timedelta(hours=2)
    usage = team_usage(eng.store, later, ["ml", "vision"])
    # The open attempt is priced to now at its price (1.0 USD/h in the cheapest pool).
    assert usage["ml"].running == 1
    assert usage["ml"].spent_usd >= 1.9
    assert (usage["vision"].running, usage["vision"].spent_usd) == (0, 0.0)
    eng.store.close()


def test_teams_config_is_read() -> None:
    from pydantic import ValidationError

    settings = Settings(teams={"ml": {"max_running_jobs": 4, "monthly_budget_usd": 1000}})
    assert settings.teams["ml"].max_running_jobs == 4
    assert settings.teams["ml"].monthly_budget_usd == 1000.0
    with pytest.raises(ValidationError):
        Settings(teams={"ml": {"max_jobs": 4}})
    with pytest.raises(ValidationError):
        Settings(teams={"no spaces": {}})
    with pytest.raises(ValidationError):
        spec(team="no spaces")
