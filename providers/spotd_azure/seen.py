"""What this process has seen of its VMs, to name the state of VMs that are gone.

Spot VMs are launched with ``evictionPolicy: Delete``: an evicted VM, its
disk and NIC disappear, and ARM keeps no record a compute GET can read. So
the adapter remembers every VM it launched or read; when one it did not
delete itself answers 404, it was taken back: a Spot VM is PREEMPTED, an
on-demand one TERMINATED. VMs we deleted read TERMINATED.

The memory is per process: after a daemon restart, a VM evicted before it
was read again is simply not found (the engine treats a missing node as
lost, and the on-VM agent reports the ``Preempt`` scheduled event it saw).
Entries of gone VMs are dropped after :data:`GONE_RETENTION`.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.values import Instance, InstanceState, Market

GONE_RETENTION = timedelta(days=7)


@dataclass(slots=True)
class _Entry:
    instance: Instance
    gone_at: datetime | None = None


class SeenVms:
    """Thread-safe memory of VMs by name; ``clock`` dates deletions and disappearances."""

    def __init__(self, clock: Clock = WALL) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._deleted: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def saw(self, instance: Instance) -> Instance:
        """Record a VM read from ARM; return it, TERMINATED if we are deleting it."""
        with self._lock:
            entry = self._entries.get(instance.id)
            if instance.id in self._deleted:
                # A VM being deleted may pass through "deallocating": that
                # is our delete, not an eviction, unless it was evicted before.
                before = entry.instance if entry else None
                ended = before is not None and before.ended
                state = before.state if before is not None and ended else InstanceState.TERMINATED
                instance = replace(instance, state=state)
            if entry is None:
                entry = self._entries[instance.id] = _Entry(instance)
            entry.instance, entry.gone_at = instance, None
            return instance

    def deleting(self, name: str, now: datetime | None = None) -> None:
        """Record that we asked ARM to delete ``name``."""
        with self._lock:
            self._deleted[name] = now or self._clock.now()

    def forget(self, names: Iterable[str]) -> None:
        """Drop ``names`` (VMs of a launch that failed and was rolled back)."""
        with self._lock:
            for name in names:
                self._entries.pop(name, None)
                self._deleted.pop(name, None)

    def gone(self, name: str, now: datetime | None = None) -> Instance | None:
        """The ended instance of a known VM that ARM no longer has; None if unknown."""
        now = now or self._clock.now()
        with self._lock:
            self._prune(now)
            entry = self._entries.get(name)
            if entry is None:
                return None
            if entry.gone_at is None:
                entry.gone_at = now
                state = _gone_state(entry.instance, name in self._deleted)
                entry.instance = replace(entry.instance, state=state,
                                         ended_at=entry.instance.ended_at or now)  # fmt: skip
            return entry.instance

    def known_except(self, present: Collection[str], tags: Mapping[str, str]) -> list[str]:
        """Names of known VMs with ``tags`` that are not among ``present``."""
        with self._lock:
            return [
                name for name, e in self._entries.items()
                if name not in present and tags.items() <= dict(e.instance.tags).items()
            ]  # fmt: skip

    def _prune(self, now: datetime) -> None:
        old = [n for n, e in self._entries.items()
               if e.gone_at is not None and now - e.gone_at > GONE_RETENTION]  # fmt: skip
        for name in old:
            del self._entries[name]
        for name in [n for n, at in self._deleted.items() if now - at > GONE_RETENTION]:
            del self._deleted[name]


def _gone_state(last: Instance, deleted_by_us: bool) -> InstanceState:
    if last.ended:
        return last.state
    if deleted_by_us:
        return InstanceState.TERMINATED
    # Nobody but Azure's eviction deletes our Spot VMs.
    return InstanceState.PREEMPTED if last.market is Market.SPOT else InstanceState.TERMINATED
