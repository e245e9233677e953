"""Prometheus metrics of the daemon, read from the engine at scrape time.

Each daemon gets its own :class:`~prometheus_client.CollectorRegistry` (not
the library's global one), so tests and several daemons in one process do
not clash. Nothing is counted in the reconcile loop: a collector reads the
store and the market cache when Prometheus scrapes ``/metrics``.

Exposed:

``spotd_spend_usd``                      spend so far over every job, by the ledger
``spotd_savings_usd``                    the ledger's on-demand equivalent, less spend
``spotd_active_jobs{status}``            jobs in each active status
``spotd_preemptions_total``              attempts that ended in a preemption
``spotd_price_poll_age_seconds{provider}``  age of the last good price poll (+Inf: never)
``spotd_price_poll_failures{provider}``  price polls failed in a row
``spotd_outbox_messages``                emails waiting for delivery (when an outbox is given)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from fastapi import APIRouter, Response, params
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from spotd.billing.ledger import ledger_so_far
from spotd.billing.ledger import totals as ledger_totals
from spotd.core.contracts import Clock
from spotd.core.states import ACTIVE, JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, JobRecord, LedgerEntry, Offering, Pool
from spotd.market.cache import Snapshot

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class FleetTotals:
    """Money and preemptions over every job the store knows."""

    spent_usd: float
    savings_usd: float
    preemptions: int


class MarketSource(Protocol):
    """The part of :class:`~spotd.market.cache.MarketCache` the metrics read."""

    def snapshots(self) -> dict[str, Snapshot]:
        """Every provider's snapshot, by provider name."""
        ...

    def find(self, pool: Pool) -> Offering | None:
        """The current offering of ``pool``, if its provider lists it."""
        ...


class JobsView(Protocol):
    """The part of :class:`~spotd.core.contracts.Store` the metrics read."""

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``statuses``."""
        ...

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        """The attempts of many jobs at once, by job id."""
        ...

    def ledger(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job_id: str | None = None,
    ) -> list[LedgerEntry]:
        """Stored ledger lines, of one job or all, oldest first."""
        ...


class EngineView(Protocol):
    """The part of :class:`~spotd.engine.reconcile.Engine` the metrics read."""

    @property
    def store(self) -> JobsView: ...

    @property
    def market(self) -> MarketSource: ...

    @property
    def clock(self) -> Clock: ...


class Outboxlike(Protocol):
    """Anything with a ``pending()`` list, like :class:`~spotd.mail.Outbox`."""

    def pending(self) -> Sequence[object]:
        """The messages waiting for delivery."""
        ...


def store_totals(engine: EngineView) -> Callable[[], FleetTotals]:
    """FleetTotals over every job's ledger (:func:`spotd.billing.ledger.ledger_so_far`).

    The same figures as ``spotd status`` and ``spotd report``: the stored
    lines of closed attempts, the open ones billed up to now. Savings are the
    ledger's on-demand equivalent less the spend; an open attempt's
    equivalent is at the on-demand price its pool lists now (no saving is
    claimed where it lists none).
    """

    def totals() -> FleetTotals:
        now = engine.clock.now()
        jobs = engine.store.list_jobs()
        attempts = engine.store.attempts_for([j.id for j in jobs])
        billed: dict[str, list[LedgerEntry]] = {}
        for entry in engine.store.ledger():
            billed.setdefault(entry.job_id, []).append(entry)
        spend = on_demand = 0.0
        preemptions = 0
        for job in jobs:
            rows = attempts.get(job.id, [])
            entries = ledger_so_far(job, rows, billed.get(job.id, []), now,
                                    on_demand_prices=_on_demand_prices(engine.market, rows))
            paid, equivalent = ledger_totals(entries)
            spend += paid
            on_demand += equivalent
            preemptions += sum(a.end_reason is AttemptEnd.PREEMPTED for a in rows)
        return FleetTotals(spent_usd=spend, savings_usd=on_demand - spend, preemptions=preemptions)

    return totals


def _on_demand_prices(market: MarketSource, attempts: Sequence[AttemptRecord]) -> dict[Pool, float]:
    """The on-demand price each attempt's pool lists now, where it lists one."""
    prices: dict[Pool, float] = {}
    for a in attempts:
        offering = market.find(a.pool)
        if offering is not None and offering.on_demand_price is not None:
            prices[a.pool] = offering.on_demand_price
    return prices


class SpotdCollector(Collector):
    """Reads the daemon's state at each scrape.

    A section that fails (a database hiccup) is logged and left out of that
    scrape; the others are still served.
    """

    def __init__(
        self,
        engine: EngineView,
        spend_fn: Callable[[], FleetTotals],
        *,
        outbox: Outboxlike | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._spend_fn = spend_fn
        self._outbox = outbox
        self._wall = wall_clock

    def collect(self) -> Iterator[Metric]:
        """Every metric family, read now."""
        sections: Mapping[str, Callable[[], list[Metric]]] = {
            "totals": self._totals,
            "jobs": self._jobs,
            "price polls": self._polls,
            "outbox": self._outbox_size,
        }
        for name, section in sections.items():
            try:
                yield from section()
            except Exception:
                log.exception("metrics: reading %s failed; left out of this scrape", name)

    def _totals(self) -> list[Metric]:
        t = self._spend_fn()
        return [
            GaugeMetricFamily("spotd_spend_usd", "Spend so far over every job, USD.",
                              value=t.spent_usd),
            GaugeMetricFamily("spotd_savings_usd",
                              "On-demand cost of the same hours less the spend, USD.",
                              value=t.savings_usd),
            CounterMetricFamily("spotd_preemptions", "Attempts that ended in a preemption.",
                                value=t.preemptions),
        ]

    def _jobs(self) -> list[Metric]:
        counts = dict.fromkeys(ACTIVE, 0)
        for job in self._engine.store.list_jobs(ACTIVE):
            counts[job.status] = counts.get(job.status, 0) + 1
        family = GaugeMetricFamily("spotd_active_jobs", "Active jobs by status.",
                                   labels=["status"])
        for status, count in counts.items():
            family.add_metric([str(status)], count)
        return [family]

    def _polls(self) -> list[Metric]:
        now = self._wall()
        age = GaugeMetricFamily(
            "spotd_price_poll_age_seconds",
            "Seconds since the provider's last good price poll (+Inf: never polled).",
            labels=["provider"],
        )
        failures = GaugeMetricFamily(
            "spotd_price_poll_failures", "Price polls of the provider failed in a row.",
            labels=["provider"],
        )
        for provider, snapshot in sorted(self._engine.market.snapshots().items()):
            seconds = snapshot.age(now)
            age.add_metric([provider], math.inf if seconds is None else max(0.0, seconds))
            failures.add_metric([provider], snapshot.failures)
        return [age, failures]

    def _outbox_size(self) -> list[Metric]:
        if self._outbox is None:
            return []
        return [GaugeMetricFamily("spotd_outbox_messages", "Emails waiting for delivery.",
                                  value=len(self._outbox.pending()))]


def build_registry(
    engine: EngineView,
    spend_fn: Callable[[], FleetTotals] | None = None,
    *,
    outbox: Outboxlike | None = None,
) -> CollectorRegistry:
    """A fresh registry holding the daemon's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpotdCollector(engine, spend_fn or store_totals(engine), outbox=outbox))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format."""
    return generate_latest(registry)


def create_metrics_router(
    engine: EngineView,
    spend_fn: Callable[[], FleetTotals] | None = None,
    *,
    outbox: Outboxlike | None = None,
    dependencies: Sequence[params.Depends] = (),
) -> APIRouter:
    """``GET /metrics`` over ``engine``; ``dependencies`` can require the bearer token."""
    registry = build_registry(engine, spend_fn, outbox=outbox)
    router = APIRouter()

    # A plain def: FastAPI runs it in its thread pool, off the event loop,
    # since the collector queries the database.
    @router.get("/metrics", include_in_schema=False, dependencies=list(dependencies))
    def metrics() -> Response:
        return Response(content=render(registry), media_type=CONTENT_TYPE_LATEST)

    return router
