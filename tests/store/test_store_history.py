"""Price history and agent reports, on every store backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spotd.core.network import Fabric, Interconnect
from spotd.core.values import InstanceReport, Market, Offering, Pool
from spotd.store import SqlStore

T0 = datetime(2026, 5, 1, tzinfo=UTC)
POOL = Pool("aws", "us-east-1", "us-east-1a", "p5.48xlarge")


def offering(spot: float | None, on_demand: float | None, pool: Pool = POOL) -> Offering:
    return Offering(
        pool=pool, gpu="H100", gpus_per_node=8, gpu_memory_gb=80,
        interconnect=Interconnect(Fabric.EFA, 400), spot_price=spot,
        on_demand_price=on_demand, capacity=0.7,
    )


def test_prices_kept_as_history(store: SqlStore) -> None:
    other = Pool("aws", "us-east-1", "us-east-1b", "p5.48xlarge")
    assert store.record_prices([offering(30.0, 98.0), offering(31.0, 98.0, other)], at=T0) == 4
    store.record_prices([offering(32.5, 98.0)], at=T0 + timedelta(minutes=5))
    store.record_prices([offering(None, 98.0)], at=T0 + timedelta(minutes=10))
    points = store.price_history(POOL, since=T0)
    spot = [(p.at, p.price) for p in points if p.market is Market.SPOT]
    assert spot == [(T0, 30.0), (T0 + timedelta(minutes=5), 32.5)]
    assert [p.price for p in points if p.market is Market.ON_DEMAND] == [98.0] * 3
    assert all(p.pool == POOL for p in points)
    assert all(p.capacity is None for p in points if p.market is Market.ON_DEMAND)
    assert [p.price for p in store.price_history(POOL, since=T0 + timedelta(minutes=6))] == [98.0]


def test_reports_merge_per_instance(store: SqlStore) -> None:
    job = "j-0123456789"
    store.save_report(InstanceReport("i-1", "aws", job, 1, heartbeat_at=T0))
    store.save_report(
        InstanceReport("i-1", "aws", job, 1, notice_at=T0, notice_kind="preemption",
                       notice_deadline=T0 + timedelta(minutes=2))
    )
    store.save_report(InstanceReport("i-1", "aws", job, 1, heartbeat_at=T0 + timedelta(seconds=30)))
    store.save_report(InstanceReport("i-1", "gcp", job, 2, exit_code=0, exited_at=T0))
    (aws, gcp) = store.reports(job)
    assert aws.heartbeat_at == T0 + timedelta(seconds=30), "the newest heartbeat wins"
    assert aws.notice_kind == "preemption" and aws.notice_at == T0, "a notice is not forgotten"
    assert aws.exit_code is None
    assert (gcp.provider, gcp.attempt, gcp.exit_code) == ("gcp", 2, 0)
    assert store.reports("j-other") == []
