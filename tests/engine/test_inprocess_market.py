"""One spot job through a dozen preemptions on the in-process simulated market.

The market's nodes are workloads on a :class:`ManualClock`
(:mod:`spotd_sim.inprocess`): the test ticks the engine and moves the clock,
and nothing else moves. Their agents' reports reach the store as the daemon's
agent routes would put them there (:class:`StoreReports`), and their
checkpoints go where the engine looks for them, so each attempt resumes from
the last complete one. One seed and one sequence of moves give one history.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import fsspec
import pytest

from spotd import checkpoints
from spotd.core.clock import ManualClock
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, InstanceReport, JobRecord
from spotd.engine.reconcile import Engine
from spotd.engine.reports import StoreReports
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import ReportSink, TrainingPlan, TrainingWorkload, build_inprocess_providers

EPOCH = datetime(2026, 3, 2, tzinfo=UTC)
TICK = timedelta(minutes=15)
"""The clock's move between two passes: longer than a boot, shorter than most spot lives."""
MAX_TICKS = 200
WORK_HOURS = 3.0
STEP_SECONDS = 60.0
TOTAL_STEPS = round(WORK_HOURS * 3600 / STEP_SECONDS)
AWS_NOTICE = timedelta(seconds=120)

Event = tuple[datetime, JobStatus | None, JobStatus, str, str]

S = JobStatus
SPOT_MOVES = {
    (None, S.PENDING), (S.PENDING, S.PROVISIONING), (S.PROVISIONING, S.RUNNING),
    (S.RUNNING, S.CHECKPOINTING), (S.CHECKPOINTING, S.RECOVERING),
    (S.PROVISIONING, S.RECOVERING), (S.RUNNING, S.RECOVERING),
    (S.RECOVERING, S.PROVISIONING), (S.RUNNING, S.SUCCEEDED),
}  # fmt: skip
"""Every change of status of a spot job on its way through preemptions to its end."""


@dataclass(frozen=True)
class Run:
    """What one run left in the store."""

    checkpoints: str
    job: JobRecord
    events: list[Event]
    attempts: list[AttemptRecord]
    reports: list[InstanceReport]


@pytest.fixture(scope="module")
def runs() -> Iterator[tuple[Run, Run]]:
    """The same run twice, each with a checkpoint folder of its own in fsspec's memory."""
    root = f"spotd-inprocess-{uuid.uuid4().hex}"
    try:
        yield run_market(f"memory://{root}/first"), run_market(f"memory://{root}/second")
    finally:
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


def long_haul(uri: str) -> JobSpec:
    """A one-node spot job of WORK_HOURS of work (the workload reads it from its env)."""
    return JobSpec.model_validate({
        "name": "long-haul",
        "command": ["python", "train.py"],
        "resources": {"gpus": ["V100"], "gpus_per_node": 1},
        "market": {"type": "spot", "providers": ["sim-aws"]},
        "checkpoint": {"uri": uri, "interval": "20m"},
        "env": {"SPOTD_SIM_WORK_HOURS": str(WORK_HOURS)},
    })  # fmt: skip


def run_market(uri: str) -> Run:
    """Submit the job to an engine on a fresh in-process market and tick it to its end."""
    clock = ManualClock(EPOCH)
    store = open_store("sqlite://")
    try:
        reports: ReportSink = StoreReports(store)
        aws, *_ = build_inprocess_providers(
            clock, seed=1, mean_up_hours=0.4, mean_down_hours=0.5, boot_seconds=300,
            reports=reports,
            workloads=TrainingWorkload.factory(TrainingPlan(step_seconds=STEP_SECONDS,
                                                            heartbeat_seconds=900)),
        )  # fmt: skip
        # Short cooldowns, no re-plan of a running job, a price row an hour: the run is
        # about preemptions, and each of these passes costs the engine time.
        settings = EngineSettings(owner="test", cooldown_hours=0.05, replan_seconds=1e9,
                                  price_history_seconds=3600)  # fmt: skip
        engine = Engine(store, {aws.name: aws}, CheapestPolicy(), clock, settings)
        job = engine.submit(long_haul(uri))
        for _ in range(MAX_TICKS):
            engine.market.refresh_all()  # as a daemon polls the simulator: every pass
            engine.tick()
            job = store.get_job(job.id)
            if job.status.terminal:
                break
            clock.advance(TICK.total_seconds())
        events = [(e.at, e.from_status, e.to_status, e.cause, e.detail)
                  for e in store.events(job.id)]  # fmt: skip
        return Run(uri, job, events, store.attempts(job.id), store.reports(job.id))
    finally:
        store.close()


def test_a_spot_job_survives_ten_preemptions_and_finishes(runs: tuple[Run, Run]) -> None:
    run, _ = runs
    assert run.job.status is JobStatus.SUCCEEDED, run.events[-3:]

    causes = [cause for _, _, _, cause, _ in run.events]
    assert causes[:2] == ["submitted", "placed"]
    assert causes[-1] == "succeeded"
    assert causes.count("preempted") >= 10
    moves = {(before, after) for _, before, after, _, _ in run.events if before is not after}
    assert moves <= SPOT_MOVES

    ends = [a.end_reason for a in run.attempts]
    assert ends[-1] is AttemptEnd.SUCCEEDED
    assert ends.count(AttemptEnd.PREEMPTED) >= 10
    assert set(ends) <= {AttemptEnd.PREEMPTED, AttemptEnd.NO_CAPACITY, AttemptEnd.SUCCEEDED}

    # Each attempt resumed from the last complete checkpoint: progress only grows.
    placed = [detail for _, _, _, cause, detail in run.events if cause == "placed"]
    resumed = [int(m.group(1)) for d in placed if (m := re.search(r"resume from step (\d+)", d))]
    assert resumed == sorted(resumed) and 0 < resumed[-1] < TOTAL_STEPS
    latest = checkpoints.latest_complete(run.checkpoints)
    assert latest is not None and latest.step == TOTAL_STEPS


def test_every_preempted_node_was_told_and_checkpointed(runs: tuple[Run, Run]) -> None:
    run, _ = runs
    by_attempt = {r.attempt: r for r in run.reports}
    noticed = 0
    for attempt in run.attempts:
        report = by_attempt.get(attempt.seq)
        if report is None:
            # Taken back while it booted: the job never started, its agent never spoke.
            assert attempt.end_reason in (AttemptEnd.PREEMPTED, AttemptEnd.NO_CAPACITY)
            assert attempt.running_at is None
            continue
        assert report.heartbeat_at is not None and report.command_at is not None
        if attempt.end_reason is AttemptEnd.PREEMPTED:
            # The notice came with the provider's notice time; the job left at the next
            # step boundary after writing its checkpoint (128 + SIGTERM).
            assert report.notice_kind == "preemption"
            assert report.notice_at is not None and report.notice_deadline is not None
            assert report.notice_deadline - report.notice_at == AWS_NOTICE
            assert report.exit_code == 143
            assert report.exited_at is not None
            assert timedelta(0) < report.exited_at - report.notice_at <= AWS_NOTICE
            noticed += 1
        else:
            assert attempt.end_reason is AttemptEnd.SUCCEEDED
            assert report.notice_at is None and report.exit_code == 0
    assert noticed >= 5


def test_the_same_moves_give_the_same_history(runs: tuple[Run, Run]) -> None:
    first, second = runs
    assert first.events == second.events
    assert [(a.pool, a.started_at, a.ended_at, a.end_reason) for a in first.attempts] == [
        (a.pool, a.started_at, a.ended_at, a.end_reason) for a in second.attempts
    ]
