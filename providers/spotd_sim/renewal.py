"""A seeded alternating up/down renewal process, generated lazily.

Up and down periods are exponential. The change points depend only on the
seed text and the means, so every process that builds the same process sees
the same history; they are drawn in chunks as far as lookups reach.
Offsets are whole microseconds, like ``datetime``: a change point converted
to a datetime and back lands exactly on itself, never just before it.
"""

from __future__ import annotations

import bisect
import random
import threading

_CHUNK = 128
"""Periods drawn per extension: few enough to be cheap, many enough to be rare."""


class RenewalProcess:
    """Whether a pool is up at any offset (microseconds) after the market epoch.

    Offsets before 0 behave like offset 0: the history starts at the epoch.
    """

    def __init__(self, seed_text: str, mean_up_us: float, mean_down_us: float) -> None:
        if mean_up_us <= 0 or mean_down_us < 0:
            raise ValueError("mean up time must be positive and mean down time >= 0")
        # Not for secrets: a reproducible simulation wants a seeded PRNG.
        self._rng = random.Random(seed_text)  # noqa: S311
        self._means = (mean_up_us, mean_down_us)
        # The first state is drawn from the long-run share of up time, so
        # the epoch is not special; exponential periods need no residual law.
        self._starts_up = mean_down_us == 0 or self._rng.random() < self.up_share
        self._bounds: list[int] = [0]
        self._lock = threading.Lock()

    @property
    def up_share(self) -> float:
        """Long-run fraction of time up: mean_up / (mean_up + mean_down)."""
        up, down = self._means
        return up / (up + down)

    def _period_up(self, index: int) -> bool:
        return self._starts_up == (index % 2 == 0)

    def _extend_past(self, offset: int) -> None:
        with self._lock:
            while self._bounds[-1] <= offset:
                for _ in range(_CHUNK):
                    index = len(self._bounds) - 1
                    mean = self._means[0] if self._period_up(index) else self._means[1]
                    length = max(1, round(self._rng.expovariate(1.0 / mean)))
                    self._bounds.append(self._bounds[-1] + length)

    def _index(self, offset: int) -> int:
        offset = max(0, offset)
        if self._means[1] == 0:
            return 0
        self._extend_past(offset)
        return bisect.bisect_right(self._bounds, offset) - 1

    def is_up(self, offset: int) -> bool:
        """Whether the pool is up ``offset`` seconds after the epoch."""
        return self._period_up(self._index(offset))

    def next_change(self, offset: int) -> int | None:
        """Offset of the first change after ``offset``; None if it never changes."""
        if self._means[1] == 0:
            return None
        index = self._index(offset)
        return self._bounds[index + 1]
