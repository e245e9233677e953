"""A capacity signal per pool from what spotd itself saw: launches and rebalance warnings.

AWS publishes spot placement scores; GCP and Azure publish nothing an adapter
can poll for every pool. But every launch tells: a capacity refusal says the
pool is short, a launch that went through says it is not, and an AWS
rebalance recommendation says a running pool is at risk. This module keeps
one signal in (0, 1] per pool from those outcomes and lays it over the
offerings' own ``capacity`` (the lower of the two wins), so the policy weighs
it exactly as it weighs a placement score: a low signal raises the expected
preemption rate, which the cost model prices.

Old news fades: the signal drifts back towards "no signal" with a half-life,
so a pool that refused a launch an hour ago gets a fair chance again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from spotd.core.clock import WALL
from spotd.core.values import Offering, Pool

FAILURE_FACTOR = 0.3
"""A capacity refusal multiplies the signal by this."""
WARNING_FACTOR = 0.6
"""A rebalance recommendation multiplies it by this: a risk, not a refusal."""
SUCCESS_GAIN = 0.5
"""A launch that went through closes this share of the gap to a full signal."""
HALF_LIFE_SECONDS = 3600.0
"""Time in which a signal's distance from 1 halves."""
FADED = 0.98
"""A signal this close to 1 is no signal at all any more: it is dropped."""


@dataclass(frozen=True, slots=True)
class _Seen:
    value: float
    at: float


class LaunchSignals:
    """Thread-safe signals by pool; ``clock`` is monotonic seconds (a
    :meth:`~spotd.core.contracts.Clock.monotonic`; the wall's by default)."""

    def __init__(
        self,
        *,
        half_life_seconds: float = HALF_LIFE_SECONDS,
        clock: Callable[[], float] = WALL.monotonic,
    ) -> None:
        self._half_life = half_life_seconds
        self._clock = clock
        self._seen: dict[Pool, _Seen] = {}
        self._lock = threading.Lock()

    def refused(self, pool: Pool, offered: float | None = None) -> None:
        """The pool refused a launch for want of capacity.

        ``offered`` is the capacity the provider itself gives the pool, if any:
        the signal falls from the lower of that and spotd's own.
        """
        self._update(pool, lambda v: v * FAILURE_FACTOR, offered)

    def warned(self, pool: Pool, offered: float | None = None) -> None:
        """The provider warned that a node of the pool is at elevated risk."""
        self._update(pool, lambda v: v * WARNING_FACTOR, offered)

    def launched(self, pool: Pool) -> None:
        """A launch in the pool went through."""
        self._update(pool, lambda v: v + (1.0 - v) * SUCCESS_GAIN, None)

    def signal(self, pool: Pool) -> float | None:
        """The pool's signal now; None when spotd has seen nothing recent of it."""
        with self._lock:
            return self._now_value(pool)

    def apply(self, offering: Offering) -> Offering:
        """``offering`` with its capacity lowered to this pool's signal where that is lower."""
        ours = self.signal(offering.pool)
        if ours is None:
            return offering
        theirs = offering.capacity
        if theirs is not None and theirs <= ours:
            return offering
        return replace(offering, capacity=round(ours, 3))

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._seen)

    def _update(self, pool: Pool, step: Callable[[float], float], offered: float | None) -> None:
        with self._lock:
            known = [v for v in (self._now_value(pool), offered) if v is not None]
            value = step(min(known, default=1.0))
            self._seen[pool] = _Seen(min(1.0, max(0.01, value)), self._clock())

    def _now_value(self, pool: Pool) -> float | None:
        seen = self._seen.get(pool)
        if seen is None:
            return None
        elapsed = max(0.0, self._clock() - seen.at)
        value: float = 1.0 - (1.0 - seen.value) * 0.5 ** (elapsed / self._half_life)
        if value >= FADED:
            del self._seen[pool]
            return None
        return value
