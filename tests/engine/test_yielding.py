"""Team limits acting on running jobs: a higher-priority job takes a lower one's place,
and a team's budget stops its running jobs before it is spent; each by the notice a
spot preemption gives, on a clock that moves only when the test says."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engine_support import EPOCH, FakeProvider, StepClock, spec

from spotd.core.intents import IntentKind, IntentOutcome, IntentRecord
from spotd.core.orders import OrdersAsk, StopReason
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventCause,
    InstanceState,
    JobRecord,
    Market,
    Pool,
)
from spotd.daemon.orders import DaemonOrders
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.engine.teams import TeamLimits
from spotd.engine.verdicts import End, Stay, Yield
from spotd.engine.yielding import RunningCost, budget_stops, give_way, make_way_for, open_stop
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy

T0 = datetime(2026, 6, 15, tzinfo=UTC)


def job(name: str, priority: int, minutes: int = 0) -> JobRecord:
    return JobRecord(id=f"j-{name}", name=name, spec=spec(name=name, priority=priority),
                     status=JobStatus.RUNNING, failure=None,
                     submitted_at=T0 + timedelta(minutes=minutes), updated_at=T0)  # fmt: skip


# -- the choices, pure ----------------------------------------------------------------


def test_the_lowest_priority_below_gives_way_the_newest_first() -> None:
    running = [job("a", 0, 1), job("b", 0, 5), job("c", 3), job("d", 9)]
    assert make_way_for(job("new", 5), running, leaving=set()) == running[1]
    assert make_way_for(job("new", 5), running, leaving={"j-b"}) == running[0]
    assert make_way_for(job("new", 0), running, leaving=set()) is None  # none lower
    assert make_way_for(job("new", 5), running, leaving={"j-a", "j-b", "j-c"}) is None


def test_a_budget_stops_the_lowest_priorities_until_the_rest_fit() -> None:
    low, mid, high = job("low", 0), job("mid", 5), job("high", 9)
    running = [RunningCost(j, 10.0, 1.0) for j in (high, mid, low)]
    assert budget_stops(100.0, 50.0, running, leaving=set()) == []  # 50 + 30 + 3 < 100
    assert budget_stops(100.0, 70.0, running, leaving=set()) == [low]  # 103, then 93
    assert budget_stops(100.0, 85.0, running, leaving=set()) == [low, mid]
    assert budget_stops(100.0, 85.0, running, leaving={"j-low"}) == [mid]
    # Spent already: every running job stops.
    assert budget_stops(100.0, 100.0, running, leaving=set()) == [low, mid, high]


def intent(kind: IntentKind, at: datetime) -> IntentRecord:
    return IntentRecord(id=1, job_id="j-x", kind=kind, requested_at=at)


# -- the engine, on a clock the test moves --------------------------------------------------


def team_engine(tmp_path: Path, ml: TeamLimits) -> Iterator[tuple[Engine, FakeProvider, StepClock]]:
    """An engine whose team ``ml`` has the limits ``ml``, on a clock the test moves."""
    provider, clock = FakeProvider(), StepClock()
    clock.at = T0
    store = open_store(f"sqlite:///{tmp_path / 'y.db'}")
    settings = EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck", teams={"ml": ml})
    engine = Engine(store, {"fake": provider}, CheapestPolicy(), clock, settings)  # type: ignore[arg-type]
    yield engine, provider, clock
    store.close()


@pytest.fixture
def team(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider, StepClock]]:
    yield from team_engine(tmp_path, TeamLimits(max_running_jobs=1, monthly_budget_usd=50.0))


@pytest.fixture
def budget_team(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider, StepClock]]:
    """A team with a monthly budget and no cap on its running jobs."""
    yield from team_engine(tmp_path, TeamLimits(monthly_budget_usd=50.0))


def tick(engine: Engine, clock: StepClock, n: int = 1) -> None:
    for _ in range(n):
        engine.tick()
        clock.at += timedelta(seconds=1)


def status(engine: Engine, job_id: str) -> JobStatus:
    return engine.store.get_job(job_id).status


def nodes(engine: Engine, job_id: str) -> tuple[str, ...]:
    return engine.store.attempts(job_id)[-1].instance_ids


def test_a_higher_priority_job_takes_a_running_ones_place_by_a_notice(
    team: tuple[Engine, FakeProvider, StepClock],
) -> None:
    engine, provider, clock = team
    low = engine.submit(spec(name="low", team="ml"))
    tick(engine, clock, 2)
    assert status(engine, low.id) is JobStatus.RUNNING
    high = engine.submit(spec(name="high", team="ml", priority=10))
    tick(engine, clock)
    # The high one is held by the team's one slot, and the low one told to make way.
    held = engine.store.get_job(high.id)
    assert held.status is JobStatus.PENDING and held.waiting is not None
    assert f"{low.id} (priority 0) is told to make way" in held.waiting
    (asked,) = engine.store.open_intents([low.id])[low.id]
    assert asked.kind is IntentKind.YIELD_PRIORITY
    tick(engine, clock)
    assert status(engine, low.id) is JobStatus.CHECKPOINTING
    yielding = engine.store.events(low.id)[-1]
    assert yielding.cause is EventCause.YIELDING and "higher priority" in yielding.detail
    # Its nodes hear it as a preemption notice: the agent's report makes the node's
    # state NOTICE, and the job's exit after its checkpoint a preemption.
    orders = DaemonOrders(engine.store, clock)  # type: ignore[arg-type]
    (node,) = nodes(engine, low.id)
    ask = OrdersAsk(job_id=low.id, attempt=1, instance_id=node, provider="fake", at=clock.at)
    stop = orders.orders(ask).stop
    assert stop is not None and stop.reason is StopReason.PRIORITY and stop.notice_seconds >= 30
    assert orders.orders(ask.model_copy(update={"attempt": 2})).stop is None
    provider.states[node], provider.exit_codes[node] = InstanceState.PREEMPTED, 143
    tick(engine, clock)
    (gave,) = engine.store.attempts(low.id)
    assert gave.end_reason is AttemptEnd.YIELDED and status(engine, low.id) is JobStatus.RECOVERING
    assert engine.store.intents(low.id)[-1].outcome is IntentOutcome.APPLIED
    tick(engine, clock, 2)
    # The high one runs; the low one waits for the team's slot, with the reason shown.
    assert status(engine, high.id) is JobStatus.RUNNING
    waiting = engine.store.get_job(low.id)
    assert waiting.status is JobStatus.RECOVERING and waiting.waiting is not None
    assert "max_running_jobs" in waiting.waiting
    # When the high one ends, the low one starts again (from its checkpoint).
    (hnode,) = nodes(engine, high.id)
    provider.states[hnode], provider.exit_codes[hnode] = InstanceState.EXITED, 0
    tick(engine, clock, 3)
    assert status(engine, high.id) is JobStatus.SUCCEEDED
    assert status(engine, low.id) in (JobStatus.PROVISIONING, JobStatus.RUNNING)
    assert len(engine.store.attempts(low.id)) == 2


def test_a_job_whose_notice_runs_out_is_stopped_all_the_same(
    team: tuple[Engine, FakeProvider, StepClock],
) -> None:
    engine, provider, clock = team
    low = engine.submit(spec(name="low", team="ml"))
    tick(engine, clock, 2)
    engine.submit(spec(name="high", team="ml", priority=10))
    tick(engine, clock, 2)
    assert status(engine, low.id) is JobStatus.CHECKPOINTING
    (node,) = nodes(engine, low.id)
    clock.at += timedelta(minutes=10)  # its nodes never left: past the notice and the grace
    tick(engine, clock)
    (gave,) = engine.store.attempts(low.id)
    assert gave.end_reason is AttemptEnd.YIELDED
    assert node in provider.terminated


def test_a_team_budget_stops_its_running_job_before_it_is_spent(
    team: tuple[Engine, FakeProvider, StepClock],
) -> None:
    engine, _, clock = team
    low = engine.submit(spec(name="low", team="ml"))
    tick(engine, clock, 2)
    assert status(engine, low.id) is JobStatus.RUNNING
    # At 1 USD an hour, half a minute short of the team's 50 USD: less than the job
    # would spend until the next look (a minute), so it stops now, not after.
    clock.at += timedelta(hours=49, minutes=59, seconds=30)
    tick(engine, clock, 2)
    assert engine.executor.bills.spent(engine.store.get_job(low.id), engine.store.attempts(low.id),
                                       clock.at) < 50.0  # fmt: skip
    asked = engine.store.intents(low.id)
    assert [i.kind for i in asked] == [IntentKind.YIELD_BUDGET]
    assert status(engine, low.id) is JobStatus.CHECKPOINTING
    assert "monthly budget" in engine.store.events(low.id)[-1].detail
    (node,) = nodes(engine, low.id)
    provider = engine.providers["fake"]
    assert isinstance(provider, FakeProvider)
    provider.states[node], provider.exit_codes[node] = InstanceState.PREEMPTED, 143
    tick(engine, clock, 3)
    # It gave way, and is not started again to be stopped at once: held, with the reason.
    (gave,) = engine.store.attempts(low.id)
    assert gave.end_reason is AttemptEnd.YIELDED
    held = engine.store.get_job(low.id)
    assert held.status is JobStatus.RECOVERING and held.waiting is not None
    assert "would spend its 50.00 USD" in held.waiting


def test_a_stop_asked_before_the_attempt_began_is_about_another() -> None:
    attempt = AttemptRecord(
        id=1, job_id="j-x", seq=1, pool=Pool("fake", "r1", "r1a", "x1.gpu"),
        market=Market.SPOT, nodes=1, price_per_node_hour=1.0, client_token="t",
        instance_ids=("i-1",), resume_from=None, started_at=EPOCH, running_at=EPOCH,
        ended_at=None, end_reason=None,
    )  # fmt: skip
    stale = intent(IntentKind.YIELD_PRIORITY, EPOCH - timedelta(minutes=1))
    fresh = intent(IntentKind.YIELD_BUDGET, EPOCH + timedelta(minutes=1))
    assert open_stop([stale], attempt) is None
    assert open_stop([stale, fresh], attempt) == fresh
    assert open_stop([fresh], None) is None
    assert isinstance(give_way(job("x", 0), attempt, fresh, Stay(), now=EPOCH,
                               notice_hours=1.0), Yield)  # fmt: skip
    done = End(JobStatus.SUCCEEDED, AttemptEnd.SUCCEEDED, "exit 0", attempt=attempt,
               end=AttemptEnd.SUCCEEDED)  # fmt: skip
    checkpointing = replace(job("x", 0), status=JobStatus.CHECKPOINTING)
    assert give_way(checkpointing, attempt, fresh, done, now=EPOCH, notice_hours=1.0) is done


def nearly_spent(engine: Engine, clock: StepClock) -> JobRecord:
    """The team's low job, run until it has spent all but 1.5 minutes of the budget: at
    1 USD an hour each, one job fits until the next look (a minute), two do not."""
    low = engine.submit(spec(name="low", team="ml"))
    tick(engine, clock, 2)
    clock.at += timedelta(hours=49, minutes=58, seconds=30)
    tick(engine, clock)
    assert status(engine, low.id) is JobStatus.RUNNING and not engine.store.intents(low.id)
    return low


def test_a_higher_priority_job_takes_the_budget_a_lower_one_would_spend(
    budget_team: tuple[Engine, FakeProvider, StepClock],
) -> None:
    engine, provider, clock = budget_team
    low = nearly_spent(engine, clock)
    high = engine.submit(spec(name="high", team="ml", priority=10))
    tick(engine, clock, 3)
    # The team's budget goes to the higher priority: the low job is told to stop.
    assert [i.kind for i in engine.store.intents(low.id)] == [IntentKind.YIELD_BUDGET]
    assert status(engine, low.id) is JobStatus.CHECKPOINTING
    assert not engine.store.intents(high.id)
    (node,) = nodes(engine, low.id)
    provider.states[node], provider.exit_codes[node] = InstanceState.PREEMPTED, 143
    tick(engine, clock, 3)
    assert engine.store.attempts(low.id)[-1].end_reason is AttemptEnd.YIELDED
    assert status(engine, high.id) is JobStatus.RUNNING
    assert engine.store.get_job(low.id).status is JobStatus.RECOVERING


def test_a_job_no_higher_than_those_filling_the_budget_waits_rather_than_start_to_stop(
    budget_team: tuple[Engine, FakeProvider, StepClock],
) -> None:
    engine, _, clock = budget_team
    low = nearly_spent(engine, clock)
    peer = engine.submit(spec(name="peer", team="ml"))
    tick(engine, clock, 3)
    held = engine.store.get_job(peer.id)
    assert held.status is JobStatus.PENDING and held.waiting is not None
    assert "would spend its 50.00 USD" in held.waiting
    assert status(engine, low.id) is JobStatus.RUNNING and not engine.store.intents(low.id)
