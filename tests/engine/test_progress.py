"""The daemon's count of a job's progress, in the reference hours its spec states."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, run_until
from hypothesis import given
from hypothesis import strategies as st

from spotd.core import facts
from spotd.core.cadence import checkpoint_interval
from spotd.core.network import Fabric, Interconnect
from spotd.core.progress import (
    done_hours,
    job_done_hours,
    lost_hours,
    reported_steps,
    work_per_hour,
)
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, InstanceReport, Market, Offering, Pool
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies import costmodel
from spotd_policies.cheapest import CheapestPolicy

T0 = datetime(2026, 5, 1, tzinfo=UTC)
POOL = Pool("aws", "us-east-1", "us-east-1a", "p5.48xlarge")


def job(
    *, nodes: int = 1, gpus: tuple[str, ...] = ("H100",), size_gb: float = 0.001,
    compute_hours: float = 100,
) -> JobSpec:
    return JobSpec.model_validate({
        "name": "t", "command": ["true"],
        "resources": {"gpus": list(gpus), "gpus_per_node": 8, "nodes": nodes},
        "checkpoint": {"size_gb": size_gb},
        "deadline": {"compute_hours": compute_hours},
    })  # fmt: skip


def offering(gpu: str = "H100", fabric: Fabric = Fabric.INFINIBAND) -> Offering:
    return Offering(
        pool=POOL, gpu=gpu, gpus_per_node=8, gpu_memory_gb=80,
        interconnect=Interconnect(fabric, 400), spot_price=25.0, on_demand_price=60.0,
    )  # fmt: skip


def attempt(
    hours: float,
    *,
    end: AttemptEnd | None = AttemptEnd.PREEMPTED,
    rate: float | None = 1.0,
    interval: float | None = 0.5,
    saves: bool | None = False,
    seq: int = 1,
) -> AttemptRecord:
    """An attempt that ran ``hours`` from T0 (still running when ``end`` is None)."""
    return AttemptRecord(
        id=seq, job_id="j", seq=seq, pool=POOL, market=Market.SPOT, nodes=1,
        price_per_node_hour=1.0, client_token=f"t{seq}", instance_ids=("i",),
        resume_from=None, started_at=T0, running_at=T0,
        ended_at=None if end is None else T0 + timedelta(hours=hours), end_reason=end,
        work_per_hour=rate, checkpoint_interval_hours=interval, saves_on_notice=saves,
    )  # fmt: skip


# -- work per running hour --------------------------------------------------------


def test_the_reference_setup_does_an_hour_per_hour_less_its_writes() -> None:
    spec = job(nodes=2)
    assert work_per_hour(spec, offering(), 1.0) == pytest.approx(1.0, rel=1e-5)
    # 320 GB at 1 GB/s: 320 s of every half hour go to the write.
    big = job(nodes=2, size_gb=320)
    assert work_per_hour(big, offering(), 0.5) == pytest.approx(1 / (1 + 320 / 1800))


def test_a_slower_fabric_or_gpu_does_less_of_the_jobs_compute() -> None:
    two = job(nodes=2)
    efa = work_per_hour(two, offering(fabric=Fabric.EFA), 1.0)
    assert efa == pytest.approx(facts.FABRIC_EFFICIENCY[Fabric.EFA] / 0.88, rel=1e-5)
    # One node needs no fabric: EFA or Ethernet, an hour is an hour.
    assert work_per_hour(job(), offering(fabric=Fabric.ETHERNET), 1.0) == pytest.approx(
        1.0, rel=1e-5
    )
    # An A100 allowed for a job stated in H100 hours does a third of the work.
    either = job(gpus=("H100", "A100"))
    assert work_per_hour(either, offering("A100"), 1.0) == pytest.approx(0.32, rel=1e-5)


# -- what an end loses ----------------------------------------------------------------


def test_a_notice_that_fits_the_checkpoint_loses_nothing() -> None:
    spec = job()
    assert lost_hours(spec, attempt(3, saves=True)) == 0.0
    assert lost_hours(spec, attempt(3, saves=False)) == 0.25
    # A node lost without notice loses half an interval whatever the checkpoint, and so
    # does a migration: the nodes are stopped with only the provider's shutdown grace.
    assert lost_hours(spec, attempt(3, end=AttemptEnd.LOST, saves=True)) == 0.25
    assert lost_hours(spec, attempt(3, end=AttemptEnd.MIGRATED, saves=True)) == 0.25
    for end in (AttemptEnd.SUCCEEDED, AttemptEnd.CANCELLED, None):
        assert lost_hours(spec, attempt(3, end=end)) == 0.0


def test_attempts_from_before_the_count_read_as_the_old_estimate() -> None:
    spec = job()
    old = attempt(3, rate=None, interval=None, saves=None)
    default = checkpoint_interval(spec, facts.DEFAULT_PREEMPTIONS_PER_HOUR)
    assert lost_hours(spec, old) == pytest.approx(default / 2)
    assert done_hours(spec, [old], T0) == pytest.approx(3 - default / 2)


# -- the count --------------------------------------------------------------------------


def test_done_hours_weighs_each_attempt_by_its_rate_and_loss() -> None:
    spec = job()
    attempts = [
        attempt(4, rate=0.8, interval=0.5, saves=False, seq=1),  # (4 - 0.25) * 0.8
        attempt(2, rate=1.0, saves=True, seq=2),  # 2
        attempt(0, end=None, rate=0.5, seq=3),  # open: 1.5 h so far at half speed
    ]
    now = T0 + timedelta(hours=1.5)
    assert done_hours(spec, attempts, now) == pytest.approx(3.0 + 2.0 + 0.75)


def test_reading_back_a_checkpoint_is_not_progress() -> None:
    spec = job(size_gb=360)  # 360 s to read at 1 GB/s
    fresh = attempt(2, end=AttemptEnd.SUCCEEDED)
    resumed = replace(fresh, resume_from="s3://ck/step-00000100")
    assert done_hours(spec, [fresh], T0) == pytest.approx(2.0)
    assert done_hours(spec, [resumed], T0) == pytest.approx(2.0 - 0.1)


def test_an_attempt_that_never_ran_or_lost_all_it_did_adds_nothing() -> None:
    spec = job()
    booting = replace(attempt(1), running_at=None)
    brief = attempt(0.1, interval=1.0)  # lost half an hour, ran a tenth of one
    assert done_hours(spec, [booting, brief], T0) == 0.0


@given(
    spans=st.lists(
        st.tuples(
            st.floats(0, 30), st.floats(0.05, 2.5), st.floats(0.05, 4),
            st.sampled_from([*AttemptEnd]), st.booleans(),
        ),
        max_size=6,
    ),
    open_for=st.floats(0, 30),
)
def test_done_hours_stays_within_what_ran_and_what_the_job_needs(
    spans: list[tuple[float, float, float, AttemptEnd, bool]], open_for: float
) -> None:
    spec = job(compute_hours=40)
    ended = [
        attempt(h, rate=r, interval=i, end=e, saves=s, seq=n)
        for n, (h, r, i, e, s) in enumerate(spans, 1)
    ]
    running = attempt(0, end=None, rate=1.0, seq=len(spans) + 1)
    now = T0 + timedelta(hours=open_for)
    done = done_hours(spec, [*ended, running], now)
    most = sum(h * r for h, r, *_ in spans) + open_for
    assert 0.0 <= done <= min(40.0, most) + 1e-9
    # Time running on the open attempt only ever adds progress.
    later = done_hours(spec, [*ended, running], now + timedelta(hours=1))
    assert later >= done


# -- the engine keeps what it placed ------------------------------------------------------


def test_the_engine_counts_a_slow_placement_at_its_own_rate(tmp_path: Path) -> None:
    class Clock:
        at = T0

        def now(self) -> datetime:
            return self.at

        def seconds_to_real(self, seconds: float) -> float:
            return seconds

    clock = Clock()
    provider = FakeProvider()  # A100 offerings only
    # A low capacity signal raises the prior rate: the interval must follow it.
    listed = provider.offerings
    provider.offerings = lambda: [  # type: ignore[method-assign]
        replace(o, capacity=0.5) for o in listed()
    ]
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    eng = Engine(
        store, {"fake": provider}, CheapestPolicy(), clock,
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    )  # fmt: skip
    try:
        spec = JobSpec.model_validate({
            "name": "t", "command": ["true"],
            "resources": {"gpus": ["H100", "A100"], "gpus_per_node": 1},
            "checkpoint": {"size_gb": 40},
        })  # fmt: skip
        record = eng.submit(spec)
        run_until(eng, record.id, lambda j: j.status is JobStatus.RUNNING, timeout=5)
        (placed,) = store.attempts(record.id)
        offering = eng.market.find(placed.pool)
        assert offering is not None and placed.checkpoint_interval_hours is not None
        priced = costmodel.estimate(eng.context(record), offering, placed.market)
        assert placed.checkpoint_interval_hours == priced.checkpoint_interval_hours
        write = 40 * 8 / facts.CHECKPOINT_WRITE_GBPS / 3600
        assert placed.work_per_hour == pytest.approx(
            0.32 / (1 + write / placed.checkpoint_interval_hours)
        )
        assert placed.saves_on_notice is True  # 40 GB in 40 s, plus 10 s, fits 120 s
        told = provider.launched[0].env["SPOTD_CHECKPOINT_INTERVAL_SECONDS"]
        assert int(told) == round(placed.checkpoint_interval_hours * 3600)

        clock.at = T0 + timedelta(hours=10)
        ran = (clock.at - placed.running_at).total_seconds() / 3600 if placed.running_at else 0
        record = store.get_job(record.id)
        assert eng.context(record).done_hours == pytest.approx(ran * placed.work_per_hour)
        assert eng.context(record).done_hours < 0.32 * ran
    finally:
        store.close()


# -- progress as the job itself reports it ------------------------------------------


def beat(seq: int, minute: int, step: int | None, total: int | None = 1000) -> InstanceReport:
    return InstanceReport(f"i-{seq}", "aws", "j", seq, heartbeat_at=T0 + timedelta(minutes=minute),
                          step=step, total_steps=total)  # fmt: skip


def test_the_jobs_latest_count_is_taken_newest_attempt_first() -> None:
    reports = [beat(2, 5, 300), beat(1, 90, 700), beat(2, 9, 450), beat(2, 12, None)]
    # Attempt 2 resumed from an earlier checkpoint than attempt 1 reached: its word counts.
    assert reported_steps(reports) == (450, 1000)
    assert reported_steps([beat(1, 3, 10, total=None)]) is None
    assert reported_steps([]) is None


def test_done_hours_follow_the_jobs_steps_where_it_reports_them() -> None:
    spec, ran = job(compute_hours=100), [attempt(30, end=None)]
    now = T0 + timedelta(hours=30)
    assert job_done_hours(spec, ran, (250, 1000), now) == 25.0
    assert job_done_hours(spec, ran, (1200, 1000), now) == 100.0  # never past the whole job
    # Without the job's word, the daemon's own estimate.
    assert job_done_hours(spec, ran, None, now) == done_hours(spec, ran, now)
