"""A small time-to-live cache for facts that change slowly (prices, offerings)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values kept for ``ttl_seconds`` of ``clock`` (monotonic seconds) after loading."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._items: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get_or_load(self, key: K, load: Callable[[], V]) -> V:
        """The cached value of ``key``, or ``load()`` stored under it.

        Two threads missing at once may both load; the later write wins.
        That costs one extra API call, which is cheaper than holding a lock
        across a network call.
        """
        now = self._clock()
        with self._lock:
            hit = self._items.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        value = load()
        with self._lock:
            self._items[key] = (now, value)
        return value
