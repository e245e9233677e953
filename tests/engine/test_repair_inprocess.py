"""Node repair on the in-process simulated market, on a clock the test moves: a 2-node
gang loses node 1 to the market, node 0 stands by and is kept, one new node joins it,
and the job ends with all its work done, billed once per node."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from engine_support import memory_checkpoints, ticks_until

from spotd import checkpoints
from spotd.core.clock import ManualClock
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, EventCause
from spotd.daemon.rejoin import DaemonRejoin
from spotd.engine.reconcile import Engine
from spotd.engine.reports import StoreReports
from spotd.engine.settings import EngineSettings
from spotd.store import SqlStore, open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import (
    InProcessSimProvider,
    TrainingPlan,
    TrainingWorkload,
    build_inprocess_providers,
)

EPOCH = datetime(2026, 3, 2, tzinfo=UTC)
WORK_HOURS = 2.0


@pytest.fixture
def uri() -> Iterator[str]:
    with memory_checkpoints("repair") as where:
        yield where


def gang_job(uri: str) -> JobSpec:
    return JobSpec.model_validate({
        "name": "gang",
        "command": ["python", "train.py"],
        "resources": {"gpus": ["V100"], "gpus_per_node": 1, "nodes": 2, "min_gbps_per_gpu": 1},
        "market": {"type": "spot", "providers": ["sim-aws"]},
        "checkpoint": {"uri": uri, "interval": "10m"},
        "env": {"SPOTD_SIM_WORK_HOURS": str(WORK_HOURS)},
    })  # fmt: skip


def engine_on(store: SqlStore, clock: ManualClock) -> tuple[Engine, InProcessSimProvider]:
    aws, *_ = build_inprocess_providers(
        clock, seed=2, mean_up_hours=10_000, mean_down_hours=0.1, boot_seconds=120,
        reports=StoreReports(store), rejoin=DaemonRejoin(store, "daemon-token").next_step,
        workloads=TrainingWorkload.factory(TrainingPlan(step_seconds=60, heartbeat_seconds=60)),
    )  # fmt: skip
    settings = EngineSettings(owner="test", replan_seconds=1e9, price_history_seconds=3600)
    return Engine(store, {aws.name: aws}, CheapestPolicy(), clock, settings), aws


def test_a_gang_that_loses_node_1_keeps_node_0_and_does_all_its_work(uri: str) -> None:
    clock = ManualClock(EPOCH)
    store = open_store("sqlite://")
    try:
        eng, aws = engine_on(store, clock)
        job = eng.submit(gang_job(uri))
        ticks_until(eng, clock, job.id, lambda j: j.status is JobStatus.RUNNING)
        clock.advance(30 * 60)  # half an hour of training: checkpoints at 10, 20, 30 min
        (first,) = store.attempts(job.id)
        aws.reclaim(first.instance_ids[1])
        job = ticks_until(eng, clock, job.id, lambda j: j.status.terminal)
        assert job.status is JobStatus.SUCCEEDED
        before, after = store.attempts(job.id)
        assert (before.end_reason, after.end_reason) == (AttemptEnd.PREEMPTED,
                                                         AttemptEnd.SUCCEEDED)  # fmt: skip
        assert after.instance_ids[0] == before.instance_ids[0]
        assert after.instance_ids[1] not in before.instance_ids
        ids = sorted({*before.instance_ids, *after.instance_ids})
        assert len(ids) == len(aws.list_instances({"spotd-job": job.id})) == 3
        assert any(e.cause is EventCause.NODE_REPLACED for e in store.events(job.id))
        assert after.resume_from is not None
        latest = checkpoints.latest_complete(uri)
        assert latest is not None and latest.step == round(WORK_HOURS * 3600 / 60)
        ledger = store.ledger(job_id=job.id)
        assert sum(e.usd for e in ledger) == pytest.approx(aws.bill(ids), abs=0.011)
    finally:
        store.close()
