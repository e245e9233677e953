"""The last good offerings of every provider, refreshed by polls.

A failed poll keeps the previous offerings and records the error and its
time, so placement goes on with stale data rather than none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from spotd.contracts import Provider
from spotd.domain import Offering, Pool
from spotd.errors import ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one provider offered at its last successful poll."""

    offerings: tuple[Offering, ...]
    fetched_at: float
    """Wall time (``time.time()``) of the last successful poll; 0 if never."""
    error: str | None = None
    """The last poll's error, when it failed."""


class MarketCache:
    """Thread-safe cache of every provider's offerings."""

    def __init__(self, providers: Mapping[str, Provider]) -> None:
        self._providers = dict(providers)
        self._snapshots: dict[str, Snapshot] = {}
        self._lock = threading.Lock()

    def refresh(self, name: str) -> Snapshot:
        """Poll one provider; on failure keep its last good offerings."""
        provider = self._providers[name]
        try:
            fresh = Snapshot(tuple(provider.offerings()), time.time())
        except ProviderError as exc:
            log.warning("price poll of %s failed, keeping last data: %s", name, exc)
            with self._lock:
                old = self._snapshots.get(name, Snapshot((), 0.0))
                fresh = Snapshot(old.offerings, old.fetched_at, str(exc))
        with self._lock:
            self._snapshots[name] = fresh
        return fresh

    def refresh_all(self) -> None:
        """Poll every provider once."""
        for name in self._providers:
            self.refresh(name)

    def snapshot(self, name: str) -> Snapshot:
        """The current snapshot of one provider (empty if never polled)."""
        with self._lock:
            return self._snapshots.get(name, Snapshot((), 0.0))

    def offerings(self) -> list[Offering]:
        """All providers' offerings, polling those never polled yet."""
        for name in self._providers:
            if name not in self._snapshots:
                self.refresh(name)
        with self._lock:
            return [o for snap in self._snapshots.values() for o in snap.offerings]

    def find(self, pool: Pool) -> Offering | None:
        """The current offering of ``pool``, if its provider lists it."""
        for offering in self.snapshot(pool.provider).offerings:
            if offering.pool == pool:
                return offering
        return None
