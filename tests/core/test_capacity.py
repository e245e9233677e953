"""Capacity series (spotd.core.capacity) and the daemon's view of them (spotd.market.stats)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotd.core.capacity import CapacitySeries, align, resample, spells_of, trailing_run
from spotd.core.network import Fabric, Interconnect
from spotd.core.values import Offering, Pool
from spotd.market.stats import SERIES_STEP, HistoryStats
from spotd.store import SqlStore

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
POOL = Pool("aws", "us-east-1", "us-east-1a", "p5.48xlarge")


def test_spells_leave_out_the_unknown_start_and_keep_the_present_open() -> None:
    up = np.array([1, 1, 0, 0, 0, 1, 1, 1, 0, 1], dtype=bool)
    s = spells_of(up, step_hours=0.5)
    assert s.up.tolist() == [False, True, False, True]
    assert s.hours.tolist() == [1.5, 1.5, 0.5, 0.5]
    assert s.ended.tolist() == [True, True, True, False]
    # Asked for, the first spell is kept as long as the series saw it.
    whole = spells_of(up, step_hours=0.5, keep_first=True)
    assert whole.up.tolist() == [True, False, True, False, True]
    assert whole.hours.tolist() == [1.0, 1.5, 1.5, 0.5, 0.5]
    assert whole.ended.tolist() == [True, True, True, True, False]


@given(st.lists(st.booleans(), min_size=1, max_size=60))
def test_spells_add_up_to_the_series(values: list[bool]) -> None:
    up = np.array(values)
    s = spells_of(up, 1.0)
    changes = int((up[1:] != up[:-1]).sum())
    left_out = trailing_run(up[::-1]) if changes else 0  # the first spell, read backwards
    assert s.hours.sum() + left_out == len(values)
    assert s.hours.size == max(1, changes)
    assert all(a != b for a, b in zip(s.up, s.up[1:], strict=False))
    assert trailing_run(up) == s.hours[-1] or s.hours.size == 0


def test_align_cuts_to_the_common_stretch() -> None:
    a = CapacitySeries(T0, 0.25, np.array([1, 1, 0, 0, 1, 1], dtype=bool))
    b = CapacitySeries(T0 + timedelta(minutes=30), 0.25, np.array([0, 0, 1, 1, 1], dtype=bool))
    got = align([a, b])
    assert got is not None
    start, step, matrix = got
    assert start == T0 + timedelta(minutes=30) and step == 0.25
    assert matrix.tolist() == [[False, False, True, True], [False, False, True, True]]
    assert align([a, replace(b, step_hours=0.5)]) is None
    assert align([a, replace(b, start=T0 + timedelta(hours=5))]) is None


def test_resample_holds_each_poll_until_the_next() -> None:
    step = timedelta(minutes=5)
    samples = [
        (T0 + timedelta(minutes=1), True),
        (T0 + timedelta(minutes=12), False),
        (T0 + timedelta(minutes=21), True),
    ]
    series = resample(samples, step, now=T0 + timedelta(minutes=30))
    assert series is not None
    assert series.start == T0  # on the shared grid
    assert series.up.tolist() == [True, True, True, False, False, True, True]
    assert series.age_hours() == pytest.approx(5 / 60)  # first seen 5 minutes ago
    assert resample([], step, now=T0) is None


def offering(capacity: float) -> Offering:
    return Offering(
        pool=POOL, gpu="H100", gpus_per_node=8, gpu_memory_gb=80,
        interconnect=Interconnect(Fabric.EFA, 400), spot_price=30.0, on_demand_price=98.0,
        capacity=capacity,
    )


def test_history_stats_give_the_capacity_series(store: SqlStore) -> None:
    """Polls every 5 minutes: capacity for an hour, none for 20 minutes, then back."""
    pattern = [1.0] * 12 + [0.0] * 4 + [0.8] * 3
    for i, capacity in enumerate(pattern):
        store.record_prices([offering(capacity)], at=T0 + SERIES_STEP * i)
    now = T0 + SERIES_STEP * (len(pattern) - 1)
    stats = HistoryStats(store, now=now, window=timedelta(days=7))
    series = stats.capacity_series(POOL)
    assert series is not None
    assert series.up.tolist() == [c > 0 for c in pattern]
    assert series.age_hours() == pytest.approx(10 / 60)
    spells = series.spells()
    assert spells.hours.tolist() == pytest.approx([20 / 60, 15 / 60])
    assert stats.availability(POOL) == pytest.approx(15 / 19)
    other = Pool("aws", "us-east-1", "us-east-1b", "p5.48xlarge")
    assert stats.capacity_series(other) is None


def test_history_stats_read_a_pool_once_for_its_rates_and_its_series(store: SqlStore) -> None:
    """A deadline job asks for a pool's rates, then its capacity series: one read."""
    for i, capacity in enumerate([1.0] * 8 + [0.0] * 2):
        store.record_prices([offering(capacity)], at=T0 + SERIES_STEP * i)
    reads: list[Pool] = []
    real = store.price_history

    def counted(pool: Pool, **kw: object) -> object:
        reads.append(pool)
        return real(pool, **kw)  # type: ignore[arg-type]

    store.price_history = counted  # type: ignore[method-assign]
    stats = HistoryStats(store, now=T0 + SERIES_STEP * 9, window=timedelta(days=7))
    assert stats.availability(POOL) == pytest.approx(0.8)
    series = stats.capacity_series(POOL)
    assert series is not None and series.up.sum() == 8
    assert stats.preemptions_per_hour(POOL) is not None
    assert reads == [POOL]
    # Past the cache period, the pool is read again.
    expired = HistoryStats(store, now=T0 + SERIES_STEP * 9, window=timedelta(days=7),
                           ttl_seconds=0.0)
    expired.availability(POOL)
    expired.capacity_series(POOL)
    assert reads == [POOL] * 3
