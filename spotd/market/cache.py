"""The last good offerings of every provider, refreshed by polls.

A failed poll keeps the previous offerings, records the error, and backs
off (doubling up to ``max_backoff_seconds``) before the provider is asked
again, so placement goes on with stale data rather than none and a failing
API is not hammered. Each snapshot says how old it is.

Several daemons on one database share one poll (:meth:`MarketCache.share`):
the leader polls and publishes, the others read what it published, and poll
themselves only when that is older than it should be (the leader gone).
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import overload

from spotd.core.clock import WALL
from spotd.core.contracts import Clock, OfferingBoard, Provider
from spotd.core.errors import ProviderError
from spotd.core.values import Market, Offering, Pool
from spotd.market.linked import Linked, price_links
from spotd.market.signals import LaunchSignals

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one provider offered at its last successful poll."""

    offerings: tuple[Offering, ...]
    fetched_at: float
    """POSIX time of the last successful poll, by the cache's clock; 0 if never."""
    error: str | None = None
    """The last poll's error, when it failed."""
    failures: int = 0
    """Polls failed in a row."""
    retry_at: float = 0.0
    """POSIX time before which a failed provider is not polled again."""

    def age(self, now: float) -> float | None:
        """Seconds from the last good poll to ``now`` (POSIX time); None if there never
        was one."""
        if not self.fetched_at:
            return None
        return now - self.fetched_at

    @property
    def stale(self) -> bool:
        """Whether the last poll failed (the offerings are older than they should be)."""
        return self.error is not None


class MarketCache:
    """Thread-safe cache of every provider's offerings, stamped by ``clock`` (the wall's:
    the snapshots' times are POSIX times of its ``now``)."""

    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        base_backoff_seconds: float = 5.0,
        max_backoff_seconds: float = 600.0,
        on_fresh: Callable[[str, tuple[Offering, ...]], None] | None = None,
        clock: Clock = WALL,
    ) -> None:
        self._providers = dict(providers)
        self._clock = clock
        self._snapshots: dict[str, Snapshot] = {}
        self._lock = threading.Lock()
        self._base = base_backoff_seconds
        self._max = max_backoff_seconds
        self._on_fresh = on_fresh
        self._index: OfferingIndex | None = None
        self._linked: Linked | None = None
        self._gpus: frozenset[str] | None = None
        self.signals = LaunchSignals(clock=clock.monotonic)
        """spotd's own capacity signal per pool, laid over the offerings (see its module)."""
        self._board: OfferingBoard | None = None
        self._leading: Callable[[], bool] = lambda: True
        self._max_age: Mapping[str, float] = {}
        self._adopted: dict[str, datetime] = {}

    def share(
        self, board: OfferingBoard, leading: Callable[[], bool], max_age: Mapping[str, float]
    ) -> None:
        """Share polls with other daemons through ``board``.

        While ``leading()``, each good poll is published there. Otherwise a
        refresh takes the leader's publication, and polls the provider only
        when there is none or it is older than ``max_age[name]`` seconds.
        """
        self._board, self._leading, self._max_age = board, leading, dict(max_age)

    def refresh(self, name: str) -> Snapshot:
        """Poll one provider, unless it is backing off; on failure keep its last data.

        A daemon that shares polls and does not lead reads the leader's instead.
        """
        old = self._raw(name)
        if self._board is not None and not self._leading():
            adopted = self._adopt(name, old)
            if adopted is not None:
                return adopted
        now = self._clock.now().timestamp()
        if old.failures and now < old.retry_at:
            return old
        try:
            offerings = tuple(self._providers[name].offerings())
        except ProviderError as exc:
            fresh = self._failed(name, old, exc, now)
        except Exception as exc:
            # An error the adapter failed to map is a bug in it; back off all the same
            # rather than hammer a failing API on every poll.
            log.exception("price poll of %s raised", name)
            fresh = self._failed(name, old, exc, now)
        else:
            fresh = Snapshot(offerings, now)
            if self._on_fresh is not None:
                self._on_fresh(name, offerings)
            self._publish(name, offerings)
        return self._keep(name, old, fresh)

    def _keep(self, name: str, old: Snapshot, fresh: Snapshot) -> Snapshot:
        with self._lock:
            if fresh is not old:
                self._index = None
                self._gpus = None
                self._linked = None
            self._snapshots[name] = fresh
        return fresh

    def _publish(self, name: str, offerings: tuple[Offering, ...]) -> None:
        if self._board is None or not self._leading():
            return
        try:
            self._board.publish(name, offerings)
        except Exception as exc:
            # The others poll for themselves once the last publication is too old.
            log.warning("could not publish the poll of %s: %s", name, exc)

    def _adopt(self, name: str, old: Snapshot) -> Snapshot | None:
        """The leader's publication for ``name`` if recent enough, else None."""
        assert self._board is not None
        try:
            published = self._board.read(name)
        except Exception as exc:
            log.warning("could not read the published poll of %s: %s", name, exc)
            return None
        if published is None or published.age_seconds > self._max_age.get(name, 0.0):
            return None
        if self._adopted.get(name) == published.published_at and not old.error:
            return old  # the same publication: keep the index built on it
        self._adopted[name] = published.published_at
        fetched_at = self._clock.now().timestamp() - published.age_seconds
        return self._keep(name, old, Snapshot(published.offerings, fetched_at))

    def _failed(self, name: str, old: Snapshot, exc: Exception, now: float) -> Snapshot:
        failures = old.failures + 1
        delay = min(self._max, self._base * 2 ** (failures - 1))
        age = old.age(now)
        log.warning(
            "price poll of %s failed (%d in a row, retry in %.0f s, data %s): %s",
            name, failures, delay, f"{age:.0f} s old" if age is not None else "none", exc,
        )
        return replace(old, error=f"{type(exc).__name__}: {exc}", failures=failures,
                       retry_at=now + delay)

    def refresh_all(self) -> None:
        """Poll every provider once."""
        for name in self._providers:
            self.refresh(name)

    def snapshot(self, name: str) -> Snapshot:
        """The current snapshot of one provider (empty if never polled), with prices
        linked to another provider's filled in (:mod:`spotd.market.linked`)."""
        with self._lock:
            raw = self._snapshots.get(name, Snapshot((), 0.0))
            priced = self._priced().offerings.get(name)
        return raw if priced is None or priced is raw.offerings else replace(raw, offerings=priced)

    def snapshots(self) -> dict[str, Snapshot]:
        """Every provider's snapshot, by provider name."""
        return {name: self.snapshot(name) for name in self._providers}

    def unpriced(self) -> tuple[Offering, ...]:
        """Offerings whose price link matched no enabled provider's offering: they keep
        their provider's own (default) price."""
        with self._lock:
            return self._priced().unmatched

    def _raw(self, name: str) -> Snapshot:
        with self._lock:
            return self._snapshots.get(name, Snapshot((), 0.0))

    def _priced(self) -> Linked:
        """The polled offerings with linked prices filled in; the lock is held. Kept
        until a poll changes a snapshot."""
        if self._linked is None:
            self._linked = price_links({n: s.offerings for n, s in self._snapshots.items()})
        return self._linked

    def offerings(self) -> OfferingIndex:
        """All providers' offerings, indexed, polling those never polled yet."""
        for name in self._providers:
            if name not in self._snapshots:
                self.refresh(name)
        with self._lock:
            if self._index is None:
                offered = (o for found in self._priced().offerings.values() for o in found)
                signals = self.signals
                self._index = OfferingIndex(map(signals.apply, offered) if signals else offered)
            return self._index

    def launch_refused(self, pool: Pool) -> None:
        """A launch in ``pool`` failed for want of capacity: lower its signal."""
        self.signals.refused(pool, self._offered_capacity(pool))
        self._reindex()

    def launch_succeeded(self, pool: Pool) -> None:
        """A launch in ``pool`` went through: raise its signal."""
        self.signals.launched(pool)
        self._reindex()

    def risk_warned(self, pool: Pool) -> None:
        """The provider warned a node of ``pool`` is at risk (a rebalance recommendation)."""
        self.signals.warned(pool, self._offered_capacity(pool))
        self._reindex()

    def _offered_capacity(self, pool: Pool) -> float | None:
        """The capacity the provider itself gives ``pool`` (without spotd's signal)."""
        found = (o for o in self._raw(pool.provider).offerings if o.pool == pool)
        return next((o.capacity for o in found), None)

    def _reindex(self) -> None:
        with self._lock:
            self._index = None

    def offered_gpus(self) -> frozenset[str] | None:
        """The GPU models (upper case) some provider offers now; None until every
        provider has answered a poll once, when nobody can tell what is offered."""
        with self._lock:
            snaps = [self._snapshots.get(name) for name in self._providers]
            if not snaps or any(s is None or not s.fetched_at for s in snaps):
                return None
            if self._gpus is None:  # kept until the next poll changes a snapshot
                self._gpus = frozenset(o.gpu.upper() for s in snaps if s for o in s.offerings)
            return self._gpus

    def find(self, pool: Pool) -> Offering | None:
        """The current offering of ``pool``, if its provider lists it."""
        with self._lock:
            offered = self._priced().offerings.get(pool.provider, ())
        for offering in offered:
            if offering.pool == pool:
                return self.signals.apply(offering)
        return None


def unoffered_gpus(gpus: Sequence[str], offered: frozenset[str] | None) -> str | None:
    """Why no provider can run a job that accepts ``gpus``, given the models ``offered``
    (:meth:`MarketCache.offered_gpus`); None if it can run, or if nobody can tell yet.

    A job may list a model no provider offers today beside one they do (it
    takes either, and the other may come), but not a misspelling of an offered
    one: ``H100s`` or ``A1OO`` beside ``A100`` would be dropped without a word.
    """
    if not offered:
        return None
    known = sorted(offered)
    missing = [g for g in gpus if g not in offered]
    if len(missing) < len(gpus):
        typos = {g: m for g in missing if (m := _misspelt(g, known)) is not None}
        if not typos:
            return None
        fixes = ", ".join(f"{g} (did you mean {m}?)" for g, m in typos.items())
        return f"no enabled provider offers {fixes}; correct or remove it"
    close = sorted({c for g in gpus if (c := _misspelt(g, known) or _closest(g, known))})
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"no enabled provider offers {', '.join(gpus)} (offered: {', '.join(known)}){hint}"


def _misspelt(gpu: str, known: Sequence[str]) -> str | None:
    """The offered model ``gpu`` is a slip of: a letter for a digit (O, I) or a plural."""
    plain = _plain(gpu)
    return next((k for k in known if _plain(k) == plain), None)


def _plain(gpu: str) -> str:
    return gpu.upper().replace("O", "0").replace("I", "1").removesuffix("S")


def _closest(gpu: str, known: Sequence[str]) -> str | None:
    return next(iter(difflib.get_close_matches(gpu, known, n=1, cutoff=0.5)), None)


class OfferingIndex(Sequence[Offering]):
    """A market's offerings with buckets by (GPU model, GPUs per node, market), cheapest first.

    Policies walk only the buckets a job can use, in price order, and stop
    once the price alone rules out beating the best found: placing a job
    against tens of thousands of offerings then costs a few dozen checks.
    Buckets are built on first use and kept for the life of the snapshot.
    """

    def __init__(self, offerings: Iterable[Offering]) -> None:
        self._all = tuple(offerings)
        self._buckets: dict[tuple[str, int, Market], tuple[Offering, ...]] = {}

    @classmethod
    def of(cls, offerings: Sequence[Offering]) -> OfferingIndex:
        """``offerings`` as an index (itself when it already is one)."""
        return offerings if isinstance(offerings, OfferingIndex) else cls(offerings)

    @overload
    def __getitem__(self, i: int) -> Offering: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Offering]: ...
    def __getitem__(self, i: int | slice) -> Offering | Sequence[Offering]:
        return self._all[i]

    def __len__(self) -> int:
        return len(self._all)

    def bucket(self, gpu: str, gpus_per_node: int, market: Market) -> tuple[Offering, ...]:
        """Offerings of that GPU model and node size sold in ``market``, cheapest first."""
        key = (gpu.upper(), gpus_per_node, market)
        found = self._buckets.get(key)
        if found is None:
            if not self._buckets:
                self._build()
            found = self._buckets.get(key, ())
        return found

    def node_sizes(self, gpu: str) -> dict[int, frozenset[Market]]:
        """The GPUs per node offered for that GPU model, each with the markets it is sold in."""
        if not self._buckets:
            self._build()
        sizes: dict[int, set[Market]] = {}
        for model, per_node, market in self._buckets:
            if model == gpu.upper():
                sizes.setdefault(per_node, set()).add(market)
        return {n: frozenset(markets) for n, markets in sorted(sizes.items())}

    def _build(self) -> None:
        groups: dict[tuple[str, int, Market], list[tuple[float, Offering]]] = {}
        for off in self._all:
            for market in Market:
                price = off.price(market)
                if price is not None:
                    key = (off.gpu.upper(), off.gpus_per_node, market)
                    groups.setdefault(key, []).append((price, off))
        self._buckets = {
            key: tuple(o for _, o in sorted(items, key=lambda item: item[0]))
            for key, items in groups.items()
        }
