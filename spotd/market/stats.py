"""Pool statistics from the store's price history, for the policies.

The history records each poll's spot capacity signal per pool; a pool is
"up" in a sample when the signal is above zero. Availability is the share
of samples up; the preemption rate is the number of up-to-down changes per
hour spent up. A pool with too few samples says nothing (None), and the
policy falls back on its prior. The same samples, held from one poll to the
next on a grid of :data:`SERIES_STEP`, make the pool's capacity series.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from spotd.core import facts
from spotd.core.capacity import CapacitySeries, resample
from spotd.core.contracts import HistoryStore
from spotd.core.values import Market, Offering, Pool, PoolStats, PricePoint
from spotd.market.ttl import TtlCache

MIN_SAMPLES = 6
SERIES_STEP = timedelta(minutes=5)
"""Grid of the capacity series: about one price poll."""
RECENT_POOLS = 64
"""Pools whose last read samples are kept, so a deadline job's capacity series, asked for
right after its rates, does not read the history again (a bound, not every pool's)."""


def expected_preemptions(stats: PoolStats | None, off: Offering, market: Market) -> float:
    """Expected preemptions per hour of a running node of ``off`` bought in ``market``.

    The pool's observed rate where its history says one; else the prior, raised
    when the provider's capacity signal is low. The cost model prices with it,
    and the engine derives from it the checkpoint interval it tells the job.
    """
    if market is Market.ON_DEMAND:
        return 0.0
    observed = stats.preemptions_per_hour(off.pool) if stats else None
    if observed is not None:
        return observed
    capacity = 1.0 if off.capacity is None else max(0.05, off.capacity)
    return facts.DEFAULT_PREEMPTIONS_PER_HOUR / capacity


class HistoryStats:
    """:class:`~spotd.core.values.PoolStats` over the last ``window`` of price history."""

    def __init__(
        self, store: HistoryStore, *, now: datetime, window: timedelta, ttl_seconds: float = 300.0
    ) -> None:
        self._store = store
        self._now = now
        self._window = window
        self._rates: TtlCache[Pool, tuple[float | None, float | None]] = TtlCache(ttl_seconds)
        # Only deadline plans read series: they are built on demand, apart.
        self._series: TtlCache[Pool, CapacitySeries | None] = TtlCache(ttl_seconds)
        # One read of a pool's history serves both its rates and its series.
        self._recent: TtlCache[Pool, list[PricePoint]] = TtlCache(
            ttl_seconds, max_items=RECENT_POOLS
        )

    def at(self, now: datetime) -> HistoryStats:
        """The same statistics, as of ``now`` (the cache is kept)."""
        self._now = now
        return self

    def availability(self, pool: Pool) -> float | None:
        return self._rates_of(pool)[0]

    def preemptions_per_hour(self, pool: Pool) -> float | None:
        return self._rates_of(pool)[1]

    def _rates_of(self, pool: Pool) -> tuple[float | None, float | None]:
        return self._rates.get_or_load(pool, lambda: summarise(self._points(pool)))

    def capacity_series(self, pool: Pool) -> CapacitySeries | None:
        return self._series.get_or_load(pool, lambda: self._build_series(pool))

    def _build_series(self, pool: Pool) -> CapacitySeries | None:
        points = self._points(pool)
        if len(points) < MIN_SAMPLES:
            return None
        samples = [(p.at, (p.capacity or 0.0) > 0) for p in points]
        return resample(samples, SERIES_STEP, max(self._now, points[-1].at))

    def _points(self, pool: Pool) -> list[PricePoint]:
        return self._recent.get_or_load(pool, lambda: self._read(pool))

    def _read(self, pool: Pool) -> list[PricePoint]:
        return [
            p
            for p in self._store.price_history(pool, since=self._now - self._window)
            if p.market is Market.SPOT and p.capacity is not None
        ]


def summarise(points: list[PricePoint]) -> tuple[float | None, float | None]:
    """(availability, preemptions per hour up) of a pool's spot samples, oldest first."""
    if len(points) < MIN_SAMPLES:
        return None, None
    up = [(p.capacity or 0.0) > 0 for p in points]
    availability = sum(up) / len(up)
    up_hours = 0.0
    drops = 0
    for before, after, was_up, is_up in zip(points, points[1:], up, up[1:], strict=False):
        if was_up:
            up_hours += (after.at - before.at).total_seconds() / 3600
            drops += not is_up
    if up_hours <= 0:
        return availability, None
    return availability, drops / up_hours
