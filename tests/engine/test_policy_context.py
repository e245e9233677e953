"""spotd.engine.context: one context for the engine, `spotd plan`, the demo and the simulator."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, fast_settings, run_until, spec

from spotd.core.contracts import Policy
from spotd.core.errors import CapacityError, SpotdError
from spotd.core.progress import job_done_hours
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    Decision,
    ExclusionKind,
    Market,
    Offering,
    PlacementContext,
    Pool,
)
from spotd.daemon import planning
from spotd.daemon.reader import Planner
from spotd.daemon.wiring import build_engine, build_reader
from spotd.engine.context import JobPosition, placement_context, position_of
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
A = Pool("sim-aws", "us-east-1", "us-east-1a", "p5.48xlarge")
A2 = replace(A, zone="us-east-1b")
B = Pool("sim-aws", "us-west-2", "us-west-2a", "p5.48xlarge")


def attempt(seq: int, pool: Pool, *, ended: AttemptEnd | None, running: bool) -> AttemptRecord:
    start = NOW - timedelta(hours=3 - seq)
    return AttemptRecord(
        id=seq, job_id="j-1", seq=seq, pool=pool, market=Market.SPOT, nodes=1,
        price_per_node_hour=2.0, client_token=f"t{seq}", instance_ids=(f"i-{seq}",),
        resume_from=None, started_at=start,
        running_at=start + timedelta(minutes=5) if running else None,
        ended_at=start + timedelta(minutes=30) if ended else None, end_reason=ended,
        work_per_hour=1.0,
    )  # fmt: skip


def test_without_attempts_the_job_is_new() -> None:
    job = spec(deadline={"compute_hours": 4.0})
    ctx = placement_context("j-1", job, NOW, pools=[A, B], cooldown_hours=1.0,
                            changeover_hours=0.3, spent_usd=1.5)  # fmt: skip
    assert ctx == PlacementContext(job_id="j-1", spec=job, now=NOW, spent_usd=1.5,
                                   changeover_hours=0.3)  # fmt: skip


def test_attempts_give_the_cooldowns_the_placement_and_the_progress() -> None:
    job = spec(deadline={"compute_hours": 4.0})
    attempts = [
        attempt(1, A, ended=AttemptEnd.PREEMPTED, running=True),
        attempt(2, B, ended=None, running=True),
    ]
    ctx = placement_context("j-1", job, NOW, attempts=attempts, pools=[A, A2, B],
                            cooldown_hours=10.0, changeover_hours=0.3)  # fmt: skip
    # A preemption cools its whole region for that instance type, zones not yet tried too.
    assert set(ctx.cooldown) == {A, A2}
    assert ctx.cooldown[A].startswith("preempted in us-east-1a (1x in us-east-1), until ")
    assert (ctx.current, ctx.current_market) == (B, Market.SPOT)
    assert ctx.done_hours == job_done_hours(job, attempts, None, NOW) > 0
    assert ctx.checkpoint_at == B
    # Once the cooldown is over, nothing cools.
    later = placement_context("j-1", job, NOW + timedelta(hours=20), attempts=attempts,
                              pools=[A, A2, B], cooldown_hours=10.0, changeover_hours=0.3)
    assert later.cooldown == {}


def test_a_booting_attempt_runs_nowhere_yet() -> None:
    attempts = [attempt(1, A, ended=None, running=False)]
    where = position_of(spec(), attempts, [], NOW)
    assert where == JobPosition(current=None, current_market=None, done_hours=0.0)


def test_a_position_given_stands_for_the_attempts() -> None:
    # The simulator follows the job itself: its position wins, the rest still applies.
    attempts = [attempt(1, A, ended=AttemptEnd.NO_CAPACITY, running=False)]
    here = JobPosition(current=B, current_market=Market.ON_DEMAND, done_hours=2.5)
    ctx = placement_context("j-1", spec(), NOW, attempts=attempts, pools=[A],
                            cooldown_hours=5.0, changeover_hours=0.1, position=here)
    assert (ctx.current, ctx.current_market, ctx.done_hours) == (B, Market.ON_DEMAND, 2.5)
    assert set(ctx.cooldown) == {A}


@dataclass
class Recorder:
    """A policy that keeps the context it was shown."""

    inner: Policy = field(default_factory=CheapestPolicy)
    seen: list[PlacementContext] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        self.seen.append(ctx)
        return self.inner.place(ctx, offerings)


def test_a_new_job_gets_the_same_context_from_the_engine_and_from_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = fast_settings(tmp_path, cooldown_hours=2.0, changeover_hours=0.4)
    engine = build_engine(settings)
    try:
        engine.market.refresh_all()
        job = engine.store.create_job(spec(), now=engine.clock.now())
        recorder = Recorder()
        monkeypatch.setattr(planning, "load_policy", lambda _name: recorder)
        planning.plan_job(job.spec, settings)
        (from_file,) = recorder.seen
        from_engine = engine.context(job)
    finally:
        engine.store.close()
    assert from_file.stats is not None and from_engine.stats is not None
    # The job's id and the instant aside (and the stats' own object), one context.
    assert replace(from_file, job_id=job.id, now=from_engine.now, stats=from_engine.stats) == (
        from_engine
    )
    assert from_engine.changeover_hours == 0.4


class FrozenClock:
    """A clock that stands still, so two contexts of one job can be compared whole."""

    def now(self) -> datetime:
        return NOW

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider, Recorder]]:
    provider = FakeProvider()
    recorder = Recorder()
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    engine = Engine(store, {"fake": provider}, recorder, FrozenClock(),
                    EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    yield engine, provider, recorder
    store.close()


def test_plan_of_a_submitted_job_is_the_engines_question(
    frozen: tuple[Engine, FakeProvider, Recorder],
) -> None:
    engine, provider, recorder = frozen
    provider.launch_errors.append(CapacityError("no room", provider="fake"))
    job = engine.submit(spec())
    job = run_until(engine, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=10)
    first, second = engine.store.attempts(job.id)
    assert first.end_reason is AttemptEnd.NO_CAPACITY and second.pool.region == "r2"
    recorder.seen.clear()
    # The daemon's planner, with the recording policy: it asks what the loop would.
    planner = Planner(engine.policy, engine.store, engine.market, engine.clock, engine.settings)
    view = planning.plan_submitted(planner, job)
    (asked,) = recorder.seen
    # The same context the engine places with; its statistics are the planner's own
    # reader of the same history (a HistoryStats of its own: the loop's is the loop's).
    loop_asks = engine.context(job)
    assert replace(asked, stats=None) == replace(loop_asks, stats=None)
    assert type(asked.stats) is type(loop_asks.stats)
    assert asked.current == second.pool and asked.cooldown
    spot = {c.zone: c for c in view.candidates if c.market == "spot"}
    for zone in ("r1a", "r1b"):
        assert spot[zone].excluded_kind is ExclusionKind.COOLING_DOWN
        assert (spot[zone].excluded or "").startswith("pool cooling down: no-capacity in r1a")
    assert view.choice is not None and view.choice.zone == second.pool.zone
    assert view.policy == "cheapest"


def test_plan_of_an_ended_job_is_refused(frozen: tuple[Engine, FakeProvider, Recorder]) -> None:
    engine, _, _ = frozen
    submitted = engine.submit(spec())
    engine.request_cancel(submitted.id)
    engine.tick()
    job = engine.store.get_job(submitted.id)
    assert job.status is JobStatus.CANCELLED
    with pytest.raises(SpotdError, match="has ended"):
        planning.plan_submitted(build_reader(engine).planner, job)
