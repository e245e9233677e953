"""spotd's own capacity signal from launch outcomes and rebalance warnings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engine_support import FakeProvider, run_until, spec
from hypothesis import given
from hypothesis import strategies as st

from spotd.core.errors import CapacityError
from spotd.core.network import Fabric, Interconnect
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, InstanceReport, Offering, Pool
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.market.signals import HALF_LIFE_SECONDS, LaunchSignals
from spotd.store import open_store

POOL = Pool("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def offering(capacity: float | None) -> Offering:
    return Offering(pool=POOL, gpu="H100", gpus_per_node=8, gpu_memory_gb=80,
                    interconnect=Interconnect(Fabric.TCPX, 125), spot_price=30.0,
                    on_demand_price=88.0, capacity=capacity)  # fmt: skip


def test_no_outcome_is_no_signal() -> None:
    signals = LaunchSignals()
    assert signals.signal(POOL) is None
    assert signals.apply(offering(None)).capacity is None
    signals.launched(POOL)  # a success on an unknown pool says nothing new
    assert signals.signal(POOL) is None


def test_a_refusal_lowers_and_successes_raise_it() -> None:
    signals = LaunchSignals()
    signals.refused(POOL)
    low = signals.signal(POOL)
    assert low is not None and low < 0.5
    signals.refused(POOL)
    lower = signals.signal(POOL)
    assert lower is not None and lower < low
    signals.launched(POOL)
    raised = signals.signal(POOL)
    assert raised is not None and lower < raised < 1.0


def test_the_signal_fades_back_with_its_half_life() -> None:
    clock = Clock()
    signals = LaunchSignals(clock=clock)
    signals.refused(POOL)
    start = signals.signal(POOL)
    assert start is not None
    clock.t += HALF_LIFE_SECONDS
    half = signals.signal(POOL)
    assert half is not None
    assert abs((1 - half) - (1 - start) / 2) < 1e-9
    clock.t += 10 * HALF_LIFE_SECONDS
    assert signals.signal(POOL) is None


def test_a_refusal_falls_from_the_providers_own_score() -> None:
    signals = LaunchSignals()
    signals.refused(POOL, offered=0.5)
    value = signals.signal(POOL)
    assert value is not None and abs(value - 0.15) < 1e-6


def test_the_lower_of_the_providers_and_ours_wins() -> None:
    signals = LaunchSignals()
    signals.warned(POOL)
    ours = signals.signal(POOL)
    assert ours is not None
    assert signals.apply(offering(None)).capacity == round(ours, 3)
    assert signals.apply(offering(0.9)).capacity == round(ours, 3)
    assert signals.apply(offering(0.1)).capacity == 0.1


@given(st.lists(st.sampled_from(["refused", "warned", "launched"]), max_size=40))
def test_the_signal_stays_a_positive_fraction(steps: list[str]) -> None:
    signals = LaunchSignals()
    for step in steps:
        getattr(signals, step)(POOL)
        value = signals.signal(POOL)
        assert value is None or 0 < value < 1


def _engine(tmp_path: Path, provider: FakeProvider, policy_name: str = "cheapest") -> Engine:
    from spotd.registry import load_policy
    from spotd_sim import SimClock

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    return Engine(store, {"fake": provider}, load_policy(policy_name),
                  SimClock(tmp_path / "clock", 3600.0),
                  # 100 h of cooldown is 100 real s at 3600x: a refused pool stays
                  # refused however slowly the machine runs the test's passes.
                  EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck",
                                 replan_seconds=3600.0, cooldown_hours=100.0))  # fmt: skip


def test_a_capacity_refusal_lowers_the_pools_offered_capacity(tmp_path: Path) -> None:
    provider = FakeProvider()
    provider.launch_errors.append(CapacityError("no room", provider="fake"))
    eng = _engine(tmp_path, provider)
    try:
        job = eng.submit(spec())
        run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=5)
        first, second = eng.store.attempts(job.id)
        assert first.end_reason is AttemptEnd.NO_CAPACITY
        refused = eng.market.find(first.pool)
        assert refused is not None and refused.capacity is not None and refused.capacity < 0.5
        # The launch that went through says nothing new of an unknown pool.
        assert eng.market.find(second.pool) == next(
            o for o in provider.offerings() if o.pool == second.pool
        )
    finally:
        eng.store.close()


def test_a_rebalance_warning_moves_the_job_when_an_equal_pool_exists(tmp_path: Path) -> None:
    provider = FakeProvider()
    base = provider.offerings
    # Pools at one price and one fair score: only the warning tells them apart.
    provider.offerings = lambda: [  # type: ignore[method-assign]
        replace(o, spot_price=1.0, capacity=0.5) for o in base()
    ]
    eng = _engine(tmp_path, provider, "balanced")
    try:
        job = eng.submit(spec(deadline={"compute_hours": 100}))
        run_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING, timeout=5)
        (first,) = eng.store.attempts(job.id)
        eng.tick()
        assert len(eng.store.attempts(job.id)) == 1, "no warning, no move (the replan waits)"
        iid = first.instance_ids[0]
        eng.store.save_report(InstanceReport(iid, "fake", job.id, first.seq,
                                             notice_at=eng.clock.now(), notice_kind="rebalance"))
        run_until(eng, job.id, lambda j: len(eng.store.attempts(j.id)) == 2, timeout=5)
        moved, second = eng.store.attempts(job.id)
        assert moved.end_reason is AttemptEnd.MIGRATED
        assert second.pool != first.pool
        warned = eng.market.find(first.pool)
        assert warned is not None and warned.capacity is not None and warned.capacity < 0.5
    finally:
        eng.store.close()
