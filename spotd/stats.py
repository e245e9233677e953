"""Pool statistics from the store's price history, for the policies.

The history records each poll's spot capacity signal per pool; a pool is
"up" in a sample when the signal is above zero. Availability is the share
of samples up; the preemption rate is the number of up-to-down changes per
hour spent up. A pool with too few samples says nothing (None), and the
policy falls back on its prior.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from spotd.contracts import Store
from spotd.domain import Market, Pool, PricePoint

MIN_SAMPLES = 6


class HistoryStats:
    """:class:`~spotd.domain.PoolStats` over the last ``window`` of price history."""

    def __init__(
        self, store: Store, *, now: datetime, window: timedelta, ttl_seconds: float = 300.0
    ) -> None:
        self._store = store
        self._now = now
        self._window = window
        self._ttl = ttl_seconds
        self._cache: dict[Pool, tuple[float, float | None, float | None]] = {}

    def at(self, now: datetime) -> HistoryStats:
        """The same statistics, as of ``now`` (the cache is kept)."""
        self._now = now
        return self

    def availability(self, pool: Pool) -> float | None:
        return self._get(pool)[0]

    def preemptions_per_hour(self, pool: Pool) -> float | None:
        return self._get(pool)[1]

    def _get(self, pool: Pool) -> tuple[float | None, float | None]:
        hit = self._cache.get(pool)
        if hit is not None and time.monotonic() - hit[0] < self._ttl:
            return hit[1], hit[2]
        points = [
            p
            for p in self._store.price_history(pool, since=self._now - self._window)
            if p.market is Market.SPOT and p.capacity is not None
        ]
        avail, rate = summarise(points)
        self._cache[pool] = (time.monotonic(), avail, rate)
        return avail, rate


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
