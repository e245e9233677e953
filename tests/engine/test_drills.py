"""Drills (``spotd drill``): the loop has the provider preempt one node of a running job,
writes a ``drill`` event naming it, and the ordinary path takes over from the notice.

The whole path on the in-process simulated market with a clock the test moves; the
refusals, the moot and the failed drill on a scripted provider.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, memory_checkpoints, spec, ticks_until

from spotd.core.clock import ManualClock
from spotd.core.errors import DrillRefused, NotFoundError, RequestInvalid, ThrottledError
from spotd.core.intents import IntentKind, IntentOutcome, IntentRecord
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptEnd,
    EventCause,
    EventFacts,
    EventRecord,
    JobRecord,
    Market,
)
from spotd.daemon.rejoin import DaemonRejoin
from spotd.engine.asked import judge_intents
from spotd.engine.drills import judge_drill, with_drill_fact
from spotd.engine.reconcile import Engine
from spotd.engine.reports import StoreReports
from spotd.engine.settings import EngineSettings
from spotd.engine.verdicts import Checkpoint, Drill, End, Moot, Reprioritise
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import TrainingPlan, TrainingWorkload, build_inprocess_providers

EPOCH = datetime(2026, 3, 2, tzinfo=UTC)


# -- the whole path, on the in-process market --------------------------------------------


@pytest.fixture
def uri() -> Iterator[str]:
    with memory_checkpoints("drill") as where:
        yield where


def test_a_drill_of_node_1_preempts_it_and_the_job_resumes(uri: str) -> None:
    clock = ManualClock(EPOCH)
    store = open_store("sqlite://")
    try:
        aws, *_ = build_inprocess_providers(
            clock, seed=2, mean_up_hours=10_000, mean_down_hours=0.1, boot_seconds=120,
            reports=StoreReports(store), rejoin=DaemonRejoin(store, "daemon-token").next_step,
            workloads=TrainingWorkload.factory(TrainingPlan(step_seconds=60,
                                                            heartbeat_seconds=60)),
        )  # fmt: skip
        settings = EngineSettings(owner="test", replan_seconds=1e9, price_history_seconds=3600)
        eng = Engine(store, {aws.name: aws}, CheapestPolicy(), clock, settings)
        job = eng.submit(spec(
            resources={"gpus": ["V100"], "gpus_per_node": 1, "nodes": 2, "min_gbps_per_gpu": 1},
            market={"type": "spot", "providers": ["sim-aws"]},
            checkpoint={"uri": uri, "interval": "10m"}, env={"SPOTD_SIM_WORK_HOURS": "1"},
        ))  # fmt: skip
        ticks_until(eng, clock, job.id, lambda j: j.status is JobStatus.RUNNING)
        clock.advance(20 * 60)  # checkpoints at 10 and 20 min
        (first,) = store.attempts(job.id)

        intent = eng.request_drill(job.id, node=1)
        assert intent.kind is IntentKind.DRILL and intent.node == 1
        eng.tick()
        (drill,) = [e for e in store.events(job.id) if e.cause is EventCause.DRILL]
        assert (drill.facts.node, drill.facts.rank) == (first.instance_ids[1], 1)
        assert drill.from_status is drill.to_status is JobStatus.RUNNING
        assert drill.facts.provider == "sim-aws"
        (settled,) = store.intents(job.id)
        assert settled.outcome is IntentOutcome.APPLIED

        job_now = ticks_until(eng, clock, job.id, lambda j: j.status.terminal)
        assert job_now.status is JobStatus.SUCCEEDED
        before, *after = store.attempts(job.id)
        assert before.end_reason is AttemptEnd.PREEMPTED
        assert after and after[0].resume_from is not None
        # Node repair: node 0 kept at its rank, one new node for rank 1, nothing else.
        assert after[0].instance_ids[0] == first.instance_ids[0]
        assert after[0].instance_ids[1] != first.instance_ids[1]
        assert len({i for a in store.attempts(job.id) for i in a.instance_ids}) == 3
        events = store.events(job.id)
        noticed = [e for e in events if e.cause is EventCause.NOTICE]
        ended = [e for e in events if e.cause is AttemptEnd.PREEMPTED]
        assert [e.facts.drill for e in noticed + ended] == [True] * len(noticed + ended)
        assert ended and ended[0].facts.node == first.instance_ids[1]
        # Billed like any attempt: the drilled one has its ledger lines.
        assert any(e.attempt == before.seq and e.usd > 0 for e in store.ledger(job_id=job.id))
    finally:
        store.close()


# -- asking, refusing, settling: on a scripted provider ------------------------------------


@dataclass
class DrillingFake(FakeProvider):
    """A scripted provider that takes drills: it records them, or raises the error queued."""

    drilled: list[str] = field(default_factory=list)
    drill_errors: list[Exception] = field(default_factory=list)

    def drill(self, instance_id: str) -> None:
        if self.drill_errors:
            raise self.drill_errors.pop(0)
        self.drilled.append(instance_id)


T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _loop(tmp_path: Path, provider: FakeProvider) -> Engine:
    store = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    return Engine(store, {"fake": provider}, CheapestPolicy(), ManualClock(T0),
                  EngineSettings(owner="one", checkpoints_dir=tmp_path / "ck"))  # fmt: skip


def _running(eng: Engine, **extra: object) -> JobRecord:
    job = eng.submit(spec(**extra))
    for _ in range(5):
        eng.tick()
    running = eng.store.get_job(job.id)
    assert running.status is JobStatus.RUNNING
    return running


def test_a_drill_is_sent_once_by_the_next_pass(tmp_path: Path) -> None:
    fake = DrillingFake()
    eng = _loop(tmp_path, fake)
    job = _running(eng)
    eng.request_drill(job.id)
    eng.tick()
    eng.tick()
    (attempt,) = eng.store.attempts(job.id)
    assert fake.drilled == [attempt.instance_ids[0]]
    assert eng.store.open_intents([job.id]) == {}
    (drill,) = [e for e in eng.store.events(job.id) if e.cause is EventCause.DRILL]
    assert drill.facts.node == attempt.instance_ids[0]
    eng.store.close()


def test_a_drill_the_provider_refuses_is_said_and_settled_as_failed(tmp_path: Path) -> None:
    fake = DrillingFake(drill_errors=[NotFoundError("gone", provider="fake", code="Gone")])
    eng = _loop(tmp_path, fake)
    job = _running(eng)
    eng.request_drill(job.id)
    eng.tick()
    (failed,) = [e for e in eng.store.events(job.id) if e.cause is EventCause.DRILL_FAILED]
    assert failed.facts.error_class == "NotFoundError" and failed.facts.provider_code == "Gone"
    (intent,) = eng.store.intents(job.id)
    assert intent.outcome is IntentOutcome.FAILED
    assert eng.store.get_job(job.id).status is JobStatus.RUNNING
    eng.store.close()


def test_a_throttled_drill_stays_asked_and_is_sent_by_a_later_pass(tmp_path: Path) -> None:
    fake = DrillingFake(drill_errors=[ThrottledError("slow down", provider="fake")])
    eng = _loop(tmp_path, fake)
    job = _running(eng)
    eng.request_drill(job.id)
    eng.tick()
    assert fake.drilled == [] and eng.store.open_intents([job.id])
    eng.tick()
    assert len(fake.drilled) == 1 and eng.store.open_intents([job.id]) == {}
    eng.store.close()


def test_a_drill_is_refused_unless_a_spot_node_of_a_running_job_can_have_one(
    tmp_path: Path,
) -> None:
    eng = _loop(tmp_path, DrillingFake())
    pending = eng.submit(spec())
    with pytest.raises(DrillRefused, match="only a running job"):
        eng.request_drill(pending.id)
    job = _running(eng)
    with pytest.raises(RequestInvalid) as bad:
        eng.request_drill(job.id, node=1)
    assert bad.value.field == "node" and bad.value.bad_input
    assert eng.store.open_intents([job.id]) == {}
    eng.store.close()


def test_a_drill_of_an_on_demand_job_is_refused(tmp_path: Path) -> None:
    eng = _loop(tmp_path, DrillingFake())
    job = _running(eng, market={"type": "on-demand"})
    assert eng.store.attempts(job.id)[-1].market is Market.ON_DEMAND
    with pytest.raises(DrillRefused, match="on-demand"):
        eng.request_drill(job.id)
    eng.store.close()


def test_a_provider_without_drills_refuses_them(tmp_path: Path) -> None:
    eng = _loop(tmp_path, FakeProvider())
    job = _running(eng)
    with pytest.raises(DrillRefused, match="cannot preempt a node on purpose") as err:
        eng.request_drill(job.id)
    assert err.value.error_code == "drill-refused"
    eng.store.close()


# -- judging: pure -----------------------------------------------------------------------


def test_judge_drill_drills_the_running_attempt_and_moots_the_rest(tmp_path: Path) -> None:
    eng = _loop(tmp_path, DrillingFake())
    job = _running(eng)
    (attempt,) = eng.store.attempts(job.id)
    asked = IntentRecord(1, job.id, IntentKind.DRILL, T0 + timedelta(hours=1), node=0)
    assert judge_drill(asked, attempt, JobStatus.RUNNING) == Drill(asked, attempt, 0)
    assert isinstance(judge_drill(asked, attempt, JobStatus.CHECKPOINTING), Moot)
    assert isinstance(judge_drill(asked, None, JobStatus.RECOVERING), Moot)
    early = IntentRecord(2, job.id, IntentKind.DRILL, attempt.started_at - timedelta(1), node=0)
    assert isinstance(judge_drill(early, attempt, JobStatus.RUNNING), Moot)
    beyond = IntentRecord(3, job.id, IntentKind.DRILL, T0 + timedelta(hours=1), node=4)
    assert isinstance(judge_drill(beyond, attempt, JobStatus.RUNNING), Moot)
    # A cancel and a priority come first.
    priority = IntentRecord(4, job.id, IntentKind.PRIORITY, T0, priority=3)
    assert judge_intents([asked, priority], attempt, JobStatus.RUNNING) == Reprioritise(priority)
    eng.store.close()


def test_only_a_preemption_of_a_drilled_attempt_carries_the_drill_fact(tmp_path: Path) -> None:
    eng = _loop(tmp_path, DrillingFake())
    job = _running(eng)
    (attempt,) = eng.store.attempts(job.id)
    node = attempt.instance_ids[0]
    drilled = [EventRecord(1, job.id, attempt.started_at, JobStatus.RUNNING, JobStatus.RUNNING,
                           EventCause.DRILL, "", EventFacts(node=node))]  # fmt: skip
    notice = Checkpoint(attempt, EventFacts(node=node))
    preempted = End.attempt_ended(attempt, JobStatus.RECOVERING, AttemptEnd.PREEMPTED, "",
                                  facts=EventFacts(node=node))  # fmt: skip
    lost = End.attempt_ended(attempt, JobStatus.RECOVERING, AttemptEnd.LOST, "")
    for verdict in (notice, preempted):
        marked = with_drill_fact(verdict, lambda: drilled)
        assert isinstance(marked, Checkpoint | End) and marked.facts.drill is True
        assert with_drill_fact(verdict, list) == verdict  # no drill event: the market's

    def never() -> list[EventRecord]:
        raise AssertionError("events read for a verdict that is no preemption")

    assert with_drill_fact(lost, never) == lost
    eng.store.close()
