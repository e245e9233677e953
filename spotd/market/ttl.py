"""A time-to-live cache for facts that change slowly: prices, offerings, pool statistics."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from spotd.core.clock import WALL

__all__ = ["TtlCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values kept for ``ttl_seconds`` of ``clock`` (monotonic seconds, a
    :meth:`~spotd.core.contracts.Clock.monotonic`; the wall's by default) after loading.

    With ``max_items``, the least recently used keys are dropped beyond that
    many. A failed load stores nothing, so the next call loads again.
    """

    def __init__(
        self,
        ttl_seconds: float,
        clock: Callable[[], float] = WALL.monotonic,
        *,
        max_items: int | None = None,
    ) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._max = max_items
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_load(self, key: K, load: Callable[[], V]) -> V:
        """The cached value of ``key``, or ``load()`` stored under it.

        Two threads missing at once may both load; the later write wins.
        That costs one extra load, which is cheaper than holding a lock
        across a network call or a database read.
        """
        now = self._clock()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and now - hit[0] < self._ttl:
                self._items.move_to_end(key)
                return hit[1]
        value = load()
        with self._lock:
            self._items[key] = (now, value)
            self._items.move_to_end(key)
            while self._max is not None and len(self._items) > self._max:
                self._items.popitem(last=False)
        return value

    def last(self, key: K) -> V | None:
        """The value last loaded for ``key``, however old (None if none is held)."""
        with self._lock:
            hit = self._items.get(key)
        return None if hit is None else hit[1]
