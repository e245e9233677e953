"""A steady pass steps no running job that nothing changed for, and wakes each one
whose version, agents' reports, instances, budget or re-planning time calls for it
(spotd.engine.watch)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, StepClock, count_job_loads, run_until, spec

from spotd.core.contracts import Clock
from spotd.core.states import JobStatus, Transition, transition
from spotd.core.values import (
    AttemptEnd,
    Decision,
    InstanceReport,
    InstanceState,
    JobRecord,
    Offering,
    PlacementContext,
)
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy


class CountingPolicy(CheapestPolicy):
    """The cheapest policy, counting how often it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def place(self, ctx: PlacementContext, offerings: list[Offering]) -> Decision:  # type: ignore[override]
        self.asked += 1
        return super().place(ctx, offerings)


Quiet = tuple[Engine, FakeProvider, list[list[str]]]


@pytest.fixture
def quiet(tmp_path: Path) -> Iterator[Quiet]:
    """An engine on the scripted provider; the third item lists each read of job records."""
    from spotd_sim import SimClock

    yield from _quiet(tmp_path, SimClock(tmp_path / "c", 3600.0))


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[Quiet]:
    """As ``quiet``, on a clock that moves only when the test moves it (by minutes a
    pass: re-plans, due each real minute of the clock, are set a day apart)."""
    yield from _quiet(tmp_path, StepClock(), replan_seconds=86400.0)


def _quiet(tmp_path: Path, clock: Clock, replan_seconds: float = 60.0) -> Iterator[Quiet]:
    provider = FakeProvider()
    store = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    settings = EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck",
                              replan_seconds=replan_seconds)  # fmt: skip
    eng = Engine(store, {"fake": provider}, CountingPolicy(), clock, settings)
    loads = count_job_loads(store)
    yield eng, provider, loads
    store.close()


def _running(eng: Engine, n: int = 1) -> list[JobRecord]:
    jobs = [eng.submit(spec()) for _ in range(n)]
    for job in jobs:
        run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=5)
    return [eng.store.get_job(j.id) for j in jobs]


def test_a_steady_pass_reads_and_steps_no_running_job(
    quiet: Quiet,
) -> None:
    eng, _, loads = quiet
    _running(eng, 3)
    eng.tick()
    policy = eng.policy
    assert isinstance(policy, CountingPolicy)
    asked, loads[:] = policy.asked, []
    for _ in range(3):
        eng.tick()
    assert loads == [], "every job is quiet: no record read, none stepped"
    assert policy.asked == asked, "placing counted as the first plan: no re-plan yet"


def test_a_notice_on_the_provider_wakes_the_job(
    quiet: Quiet,
) -> None:
    eng, provider, loads = quiet
    job, other = _running(eng, 2)
    eng.tick()
    (attempt,) = eng.store.attempts(job.id)
    loads.clear()
    provider.states[attempt.instance_ids[0]] = InstanceState.NOTICE
    eng.tick()
    assert loads == [[job.id]], "only the job whose node changed"
    assert eng.store.get_job(job.id).status is JobStatus.CHECKPOINTING
    assert eng.store.get_job(other.id).status is JobStatus.RUNNING


def test_a_report_wakes_the_job_and_a_heartbeat_does_not(
    quiet: Quiet,
) -> None:
    eng, _, loads = quiet
    (job,) = _running(eng)
    eng.tick()
    (attempt,) = eng.store.attempts(job.id)
    iid = attempt.instance_ids[0]
    loads.clear()
    beat = InstanceReport(iid, "fake", job.id, attempt.seq, heartbeat_at=eng.clock.now(), step=5)
    eng.store.save_report(beat)
    eng.tick()
    assert loads == [], "progress alone is nothing a step acts on"
    eng.store.save_report(InstanceReport(iid, "fake", job.id, attempt.seq, exit_code=0))
    eng.tick()
    assert loads == [[job.id]]
    assert eng.store.get_job(job.id).status is JobStatus.SUCCEEDED


def test_a_change_made_elsewhere_wakes_the_job(
    quiet: Quiet,
) -> None:
    eng, provider, _ = quiet
    (job,) = _running(eng)
    eng.tick()
    (_attempt,) = eng.store.attempts(job.id)
    # Another daemon's API cancels it: the version moves, the job is no longer active.
    change = Transition(job.id, JobStatus.RUNNING, JobStatus.CANCELLED, "cancelled by user")
    transition(eng.store, change, now=eng.clock.now())
    eng.tick()
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.CANCELLED
    # A second job, whose instance the provider loses: counted missing, then lost.
    (again,) = _running(eng)
    (placed,) = eng.store.attempts(again.id)
    del provider.states[placed.instance_ids[0]]
    run_until(eng, again.id, lambda j: j.status is not JobStatus.RUNNING, timeout=5)
    assert eng.store.attempts(again.id)[0].end_reason is AttemptEnd.LOST


def test_a_quiet_job_still_stops_at_its_budget(stepped: Quiet) -> None:
    """The budget is weighed again when the spend could reach it, not on every pass:
    the job fails as over budget all the same, at the first pass past it."""
    eng, _, loads = stepped
    clock = eng.clock
    assert isinstance(clock, StepClock)
    # 1.0 USD an hour, and two minutes a pass: 3 USD in 90 passes. (A clock of its
    # own: on the shared fast one, a slow machine's passes would be too few to count.)
    job = eng.submit(spec(budget={"max_usd": 3.0}))
    run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=5)
    started = clock.now()
    loads.clear()
    passes = 0
    while eng.store.get_job(job.id).status is JobStatus.RUNNING:
        assert passes < 200, "never stopped at its budget"
        clock.at += timedelta(minutes=2)
        eng.tick()
        passes += 1
    done = eng.store.get_job(job.id)
    assert done.status is JobStatus.FAILED and done.failure is not None
    assert str(done.failure) == "over-budget"
    assert clock.now() - started <= timedelta(hours=3, minutes=4), "at the first pass past it"
    assert len(loads) < passes / 2, (len(loads), passes)
