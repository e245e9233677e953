"""Prometheus metrics of the daemon, read from the store at scrape time.

Each daemon gets its own :class:`~prometheus_client.CollectorRegistry` (not
the library's global one), so tests and several daemons in one process do
not clash. Nothing is counted in the reconcile loop: a collector reads the
store and the market cache when Prometheus scrapes ``/metrics``, in a fixed
number of queries however many jobs the store holds (one per 2,000 shown
jobs where a query takes their ids): the aggregates of
:mod:`spotd.store.metric_queries`, plus the active jobs and their attempts,
which every reconcile pass reads too. Ended jobs are only ever summed by the
database. The three scans of the whole history (placement and notice
histograms, preflights) are served from the last read for
:data:`HISTORY_SECONDS`.

Names follow Prometheus' conventions: base units (``_seconds``, ``_usd``,
``_bytes_per_second``), ``_total`` on counters. Jobs are labelled
``job_id``, ``job_name`` and ``team``, never ``job`` or ``instance``: those
are the labels Prometheus gives every scraped target, and an exposed one
would be renamed ``exported_job``. Pools are labelled ``provider``,
``region``, ``zone`` and ``instance_type`` (and ``market`` where it splits).

Fleet:

``spotd_spend_usd``                      spend so far over every job, by the ledger
``spotd_savings_usd``                    the ledger's on-demand equivalent, less spend, of
                                         jobs that neither failed nor were cancelled
``spotd_active_jobs{status}``            jobs in each active status
``spotd_preemptions_total``              attempts that ended in a preemption
``spotd_price_poll_age_seconds{provider}``  age of the last good price poll (+Inf: never)
``spotd_price_poll_failures{provider}``  price polls failed in a row
``spotd_outbox_messages``                emails waiting for delivery (when an outbox is given)

Per pool (every pool an attempt ran in, ever):

``spotd_pool_spend_usd{pool,market}``    spend so far in the pool, by the ledger
``spotd_pool_attempts_total{pool,market,reason}``  ended attempts by end reason
``spotd_pool_placement_seconds{pool}``   histogram: from submission or recovery to running,
                                         per placement that ran (engine clock)
``spotd_pool_preemption_notices_total{pool}``  nodes that got a preemption notice
``spotd_pool_notice_to_checkpoint_seconds{pool}``  histogram: from a node's notice to its
                                         job's exit after checkpointing (agents' clocks)
``spotd_pool_preflights_total{pool,result}``  gang preflights, ``passed`` or ``failed``
``spotd_pool_preflight_bus_bandwidth_bytes_per_second{pool}``  the latest measured
                                         all-reduce bus bandwidth in the pool

Per job, for every active job and at most :data:`RECENT_ENDED_MAX` jobs that
ended in the last :data:`RECENT_ENDED_SECONDS` (an hour of real time; the
latest first), so the series grow with the work in flight, not with the
store's history; a job has at most 5 series plus one per end reason its
attempts had (11 reasons):

``spotd_job_status{job,status}``         1, labelled with the job's status
``spotd_job_spend_usd{job}``             the job's spend so far, by its ledger
``spotd_job_attempts_total{job,reason}``  the job's ended attempts by end reason
``spotd_job_placement_seconds{job}``     its latest placement's wait, as in the pool histogram
``spotd_job_notice_to_checkpoint_seconds{job}``  its latest attempt's, the slowest node's
``spotd_job_preflight_bus_bandwidth_bytes_per_second{job}``  its latest measured attempt's
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from fastapi import APIRouter, Response, params
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from spotd.billing.ledger import ledger_so_far
from spotd.billing.ledger import totals as ledger_totals
from spotd.billing.savings import saving_of
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.states import ACTIVE, JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, JobRecord, LedgerEntry, Offering, Pool
from spotd.market.cache import Snapshot
from spotd.store.metric_queries import Billed, Histogram, MetricQueries, PoolMarket

log = logging.getLogger(__name__)

RECENT_ENDED_SECONDS = 3600.0
"""Ended jobs keep their per-job series this long (real seconds) after they end..."""
RECENT_ENDED_MAX = 100
"""...and at most this many of them, the latest ended first."""

PLACEMENT_BUCKETS: tuple[float, ...] = (60, 300, 600, 1800, 3600, 7200, 21600, 86400)
"""Upper bounds of the placement histogram, seconds of the engine's clock: a minute
to a day (a placement waits for capacity as long as the market makes it)."""
NOTICE_BUCKETS: tuple[float, ...] = (5, 10, 20, 30, 60, 90, 120, 300)
"""Upper bounds of the notice-to-checkpoint histogram, seconds: the clouds' notices are
30 s (GCP, Azure) and 120 s (AWS), so those are the bounds that tell a saved checkpoint."""

HISTORY_SECONDS = 30.0
"""Real seconds the scans of the whole history (placements, notices, preflights) are
served again before they are read again."""

_BYTES_PER_GB = 1e9
"""The preflight measures in GB/s as nccl-tests do (10^9 bytes); the metric is in bytes."""

_POOL_LABELS = ["provider", "region", "zone", "instance_type"]
_JOB_LABELS = ["job_id", "job_name", "team"]


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
    """The part of :class:`~spotd.core.contracts.Store` the metrics read, besides the
    aggregates of :class:`~spotd.store.metric_queries.MetricQueries` over its database."""

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``statuses``."""
        ...

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        """The attempts of many jobs at once, by job id."""
        ...


class ReadView(Protocol):
    """The part of the read model (:class:`~spotd.daemon.reader.Reader`) the metrics read."""

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


@dataclass(frozen=True, slots=True)
class StoreReading:
    """What one scrape read of the store, shared by the sections built from it.

    ``ledgers`` is every priced job's ledger so far (its stored lines summed per
    closed attempt, plus ``fresh`` lines); ``fresh`` are the lines of attempts not
    billed yet (the running ones), priced to ``now`` as
    :func:`~spotd.billing.ledger.ledger_so_far` prices them. The stored lines of
    every other job are in ``billed``, summed by the database.
    """

    now: datetime
    active: list[JobRecord]
    shown: list[JobRecord]
    """The jobs with series of their own: the active ones, then the recently ended."""
    attempts: Mapping[str, list[AttemptRecord]]
    ledgers: Mapping[str, list[LedgerEntry]]
    fresh: list[LedgerEntry]
    billed: Mapping[PoolMarket, Billed]
    """The stored ledger lines of every closed attempt, by pool and market."""
    reasons: Mapping[tuple[PoolMarket, str], int]
    """Ended attempts by pool, market and end reason."""

    def totals(self) -> FleetTotals:
        """Spend, savings and preemptions over every job."""
        spend = sum(b.usd for b in self.billed.values()) + ledger_totals(self.fresh)[0]
        # Jobs that failed or were cancelled claim no saving (spotd.billing.savings).
        saved = sum(b.saved_usd for b in self.billed.values()) + saving_of(self.fresh)[0]
        preempted = sum(
            n for (_, reason), n in self.reasons.items() if reason == AttemptEnd.PREEMPTED
        )
        return FleetTotals(spent_usd=spend, savings_usd=saved, preemptions=preempted)

    def pool_spend(self) -> dict[PoolMarket, float]:
        """Spend so far by pool and market: the stored lines plus the fresh ones."""
        spend = {key: b.usd for key, b in self.billed.items()}
        for e in self.fresh:
            key = PoolMarket(Pool(e.provider, e.region, e.zone, e.instance_type), e.market)
            spend[key] = spend.get(key, 0.0) + e.usd
        return spend


def read_store(reader: ReadView, queries: MetricQueries) -> StoreReading:
    """Read what the store-backed sections need, in a fixed number of queries.

    The active jobs and their attempts are read whole (a reconcile pass reads
    the same); ended jobs only in aggregate, except the few recently ended
    ones shown per job and any whose last bill is not written yet.
    """
    now = reader.clock.now()
    active = reader.store.list_jobs(ACTIVE)
    # Real time, whatever the engine's clock runs at (the simulated market's runs faster).
    real_per_engine_second = reader.clock.seconds_to_real(1.0)
    since = now - timedelta(seconds=RECENT_ENDED_SECONDS / max(real_per_engine_second, 1e-9))
    shown = [*active, *queries.recently_ended(since=since, limit=RECENT_ENDED_MAX)]
    known = {j.id for j in shown}
    priced = [*shown, *queries.jobs(queries.jobs_with_unbilled_attempts() - known)]
    ids = [j.id for j in priced]
    attempts = reader.store.attempts_for(ids)
    lines = queries.billed(ids)
    billed = lines.by_attempt
    ledgers: dict[str, list[LedgerEntry]] = {}
    fresh: list[LedgerEntry] = []
    for job in priced:
        rows = attempts.get(job.id, [])
        by_seq = billed.get(job.id, {})
        stored = [_summed_line(a, by_seq[a.seq]) for a in rows if a.seq in by_seq]
        entries = ledger_so_far(
            job, rows, stored, now, on_demand_prices=on_demand_prices(reader.market, rows)
        )
        ledgers[job.id] = entries
        fresh.extend(e for e in entries if e.attempt not in by_seq)
    return StoreReading(
        now=now,
        active=active,
        shown=shown,
        attempts=attempts,
        ledgers=ledgers,
        fresh=fresh,
        billed=lines.by_pool,
        reasons=queries.attempts_by_reason(),
    )


def _summed_line(attempt: AttemptRecord, billed: Billed) -> LedgerEntry:
    """The stored lines of a closed attempt as one line: all :func:`ledger_so_far`
    and the sums need of them (which attempt, what it cost)."""
    return LedgerEntry(
        job_id=attempt.job_id,
        attempt=attempt.seq,
        provider=attempt.pool.provider,
        region=attempt.pool.region,
        zone=attempt.pool.zone,
        instance_type=attempt.pool.instance_type,
        gpu="",
        gpus=0,
        nodes=attempt.nodes,
        fabric="",
        market=str(attempt.market),
        kind="compute",
        start=attempt.started_at,
        end=attempt.ended_at or attempt.started_at,
        billed_seconds=0.0,
        usd=billed.usd,
        on_demand_usd=billed.on_demand_usd,
        job_status="",
    )


def store_totals(reader: ReadView) -> Callable[[], FleetTotals]:
    """FleetTotals over every job's ledger (:func:`spotd.billing.ledger.ledger_so_far`).

    The same figures as ``spotd status`` and ``spotd report``: the stored
    lines of closed attempts, the open ones billed up to now. Savings are the
    ledger's on-demand equivalent less the spend; an open attempt's
    equivalent is at the on-demand price its pool lists now (no saving is
    claimed where it lists none). Needs the SQL store: the sums are the
    database's.
    """

    def totals() -> FleetTotals:
        return read_store(reader, _queries_of(reader)).totals()

    return totals


def placement_waits(job: JobRecord, attempts: Iterable[AttemptRecord]) -> list[float]:
    """Seconds each placement of ``job`` that ran waited, oldest first (engine clock).

    From the job's submission, or from the end of its last attempt that ran (a
    recovery), to the attempt's ``running_at``; the rule of
    :meth:`~spotd.store.metric_queries.MetricQueries.placement_histogram`.
    """
    waits: list[float] = []
    waited_from = job.submitted_at
    for a in sorted(attempts, key=lambda a: a.seq):
        if a.running_at is None:
            continue
        waits.append((a.running_at - waited_from).total_seconds())
        if a.ended_at is not None:
            waited_from = a.ended_at
    return waits


def on_demand_prices(market: MarketSource, attempts: Sequence[AttemptRecord]) -> dict[Pool, float]:
    """The on-demand price each attempt's pool lists now, where it lists one."""
    prices: dict[Pool, float] = {}
    for a in attempts:
        offering = market.find(a.pool)
        if offering is not None and offering.on_demand_price is not None:
            prices[a.pool] = offering.on_demand_price
    return prices


def _queries_of(reader: ReadView) -> MetricQueries:
    queries = MetricQueries.of(reader.store)
    if queries is None:
        raise TypeError(f"the metrics need the SQL store, not {type(reader.store).__name__}")
    return queries


class SpotdCollector(Collector):
    """Reads the daemon's state at each scrape.

    A section that fails (a database hiccup) is logged and left out of that
    scrape; the others are still served. When the store cannot be read at
    all, only the sections that need it are left out.

    The placement and notice histograms and the preflight figures scan every
    attempt and agent report ever stored, so they are read again at most every
    ``history_seconds`` (real seconds; 0: at every scrape) and served from the
    last read in between: Prometheus takes rates of them over minutes. Spend,
    attempt counts and the per-job series are read at every scrape.

    ``wall`` is the real clock (the price polls' ages, the history's), which the
    engine's, on a simulated market, is not.
    """

    def __init__(
        self,
        reader: ReadView,
        spend_fn: Callable[[], FleetTotals] | None = None,
        *,
        outbox: Outboxlike | None = None,
        wall: Clock = WALL,
        queries: MetricQueries | None = None,
        history_seconds: float = HISTORY_SECONDS,
    ) -> None:
        self._reader = reader
        self._spend_fn = spend_fn
        self._outbox = outbox
        self._wall = wall
        self._queries = queries
        self._history_seconds = history_seconds
        self._history: dict[str, tuple[float, list[Metric]]] = {}
        # Scrapes run in the API's thread pool: two at once must not both rescan.
        self._history_lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        """Every metric family, read now."""
        try:
            reading: StoreReading | None = read_store(
                self._reader, self._queries or _queries_of(self._reader)
            )
        except Exception:
            log.exception("metrics: reading the store failed; its series are left out")
            reading = None
        sections: dict[str, Callable[[], list[Metric]]] = {}
        if reading is not None or self._spend_fn is not None:
            sections["totals"] = lambda: self._totals(reading)
        if reading is not None:
            sections.update(
                {
                    "jobs": lambda: self._jobs(reading),
                    "per-job figures": lambda: self._per_job(reading),
                    "pool spend and attempts": lambda: self._pools(reading),
                    "placements": lambda: self._recent("placements", self._placements),
                    "preemption notices": lambda: self._recent("notices", self._notices),
                    "preflights": lambda: self._recent("preflights", self._preflights),
                }
            )
        sections["price polls"] = self._polls
        sections["outbox"] = self._outbox_size
        for name, section in sections.items():
            try:
                yield from section()
            except Exception:
                log.exception("metrics: reading %s failed; left out of this scrape", name)

    def _queries_now(self) -> MetricQueries:
        return self._queries or _queries_of(self._reader)

    def _recent(self, name: str, read: Callable[[], list[Metric]]) -> list[Metric]:
        """``read()``, or what it returned less than ``history_seconds`` ago."""
        with self._history_lock:
            now = self._wall.monotonic()
            kept = self._history.get(name)
            if kept is not None and now - kept[0] < self._history_seconds:
                return kept[1]
            families = read()
            self._history[name] = (now, families)
            return families

    # -- fleet --------------------------------------------------------------

    def _totals(self, reading: StoreReading | None) -> list[Metric]:
        if self._spend_fn is not None:
            t = self._spend_fn()
        elif reading is not None:
            t = reading.totals()
        else:  # pragma: no cover - collect() adds this section only with one of them
            return []
        return [
            GaugeMetricFamily(
                "spotd_spend_usd", "Spend so far over every job, USD.", value=t.spent_usd
            ),
            GaugeMetricFamily(
                "spotd_savings_usd",
                "On-demand cost of the same hours less the spend, USD.",
                value=t.savings_usd,
            ),
            CounterMetricFamily(
                "spotd_preemptions", "Attempts that ended in a preemption.", value=t.preemptions
            ),
        ]

    def _jobs(self, reading: StoreReading) -> list[Metric]:
        counts = dict.fromkeys(ACTIVE, 0)
        for job in reading.active:
            counts[job.status] = counts.get(job.status, 0) + 1
        family = GaugeMetricFamily("spotd_active_jobs", "Active jobs by status.", labels=["status"])
        for status, count in counts.items():
            family.add_metric([str(status)], count)
        return [family]

    # -- per job ------------------------------------------------------------

    def _per_job(self, reading: StoreReading) -> list[Metric]:
        queries = self._queries_now()
        ids = [j.id for j in reading.shown]
        notices = queries.latest_notice_seconds(ids)
        bandwidth = queries.latest_preflight_busbw(ids)
        status = GaugeMetricFamily(
            "spotd_job_status",
            "1 for each job shown, labelled with its status.",
            labels=[*_JOB_LABELS, "status"],
        )
        spend = GaugeMetricFamily(
            "spotd_job_spend_usd", "The job's spend so far by its ledger, USD.", labels=_JOB_LABELS
        )
        attempts = CounterMetricFamily(
            "spotd_job_attempts",
            "The job's ended attempts by end reason.",
            labels=[*_JOB_LABELS, "reason"],
        )
        placement = GaugeMetricFamily(
            "spotd_job_placement_seconds",
            "How long the job's latest placement that ran waited, from submission or recovery "
            "to running (engine clock).",
            labels=_JOB_LABELS,
        )
        notice = GaugeMetricFamily(
            "spotd_job_notice_to_checkpoint_seconds",
            "From a preemption notice to the job's exit after it, in its latest attempt that "
            "reported both (the slowest node; agents' clocks).",
            labels=_JOB_LABELS,
        )
        busbw = GaugeMetricFamily(
            "spotd_job_preflight_bus_bandwidth_bytes_per_second",
            "All-reduce bus bandwidth the gang preflight of the job's latest measured attempt "
            "found.",
            labels=_JOB_LABELS,
        )
        for job in reading.shown:
            labels = [job.id, job.name, job.spec.team or ""]
            rows = reading.attempts.get(job.id, [])
            status.add_metric([*labels, str(job.status)], 1)
            spend.add_metric(labels, ledger_totals(reading.ledgers.get(job.id, []))[0])
            ended = Counter(str(a.end_reason) for a in rows if a.end_reason is not None)
            for reason, count in sorted(ended.items()):
                attempts.add_metric([*labels, reason], count)
            waits = placement_waits(job, rows)
            if waits:
                placement.add_metric(labels, waits[-1])
            if job.id in notices:
                notice.add_metric(labels, notices[job.id])
            if job.id in bandwidth:
                busbw.add_metric(labels, bandwidth[job.id] * _BYTES_PER_GB)
        return [status, spend, attempts, placement, notice, busbw]

    # -- per pool -----------------------------------------------------------

    def _pools(self, reading: StoreReading) -> list[Metric]:
        labels = [*_POOL_LABELS, "market"]
        spend = GaugeMetricFamily(
            "spotd_pool_spend_usd",
            "Spend so far in the pool and market, by the ledger, USD.",
            labels=labels,
        )
        for key, usd in sorted(reading.pool_spend().items(), key=lambda kv: _key_order(kv[0])):
            spend.add_metric([*_pool_values(key.pool), key.market], usd)
        attempts = CounterMetricFamily(
            "spotd_pool_attempts",
            "Ended attempts in the pool and market, by end reason.",
            labels=[*labels, "reason"],
        )
        for (key, reason), count in sorted(
            reading.reasons.items(), key=lambda kv: (_key_order(kv[0][0]), kv[0][1])
        ):
            attempts.add_metric([*_pool_values(key.pool), key.market, reason], count)
        return [spend, attempts]

    def _placements(self) -> list[Metric]:
        family = HistogramMetricFamily(
            "spotd_pool_placement_seconds",
            "Placements that ran, by how long the job waited from submission or recovery to "
            "running (engine clock).",
            labels=_POOL_LABELS,
        )
        for h in self._queries_now().placement_histogram(PLACEMENT_BUCKETS):
            _add_histogram(family, h, PLACEMENT_BUCKETS)
        return [family]

    def _notices(self) -> list[Metric]:
        counts, histograms = self._queries_now().notice_histogram(NOTICE_BUCKETS)
        total = CounterMetricFamily(
            "spotd_pool_preemption_notices",
            "Nodes in the pool that reported a preemption notice.",
            labels=_POOL_LABELS,
        )
        for pool, count in sorted(counts.items(), key=lambda kv: _pool_values(kv[0])):
            total.add_metric(_pool_values(pool), count)
        family = HistogramMetricFamily(
            "spotd_pool_notice_to_checkpoint_seconds",
            "From a node's preemption notice to its job's exit after checkpointing (agents' "
            "clocks); nodes killed before their job exited are not observed.",
            labels=_POOL_LABELS,
        )
        for h in histograms:
            _add_histogram(family, h, NOTICE_BUCKETS)
        return [total, family]

    def _preflights(self) -> list[Metric]:
        total = CounterMetricFamily(
            "spotd_pool_preflights",
            "Attempts whose gang preflight ended, by result.",
            labels=[*_POOL_LABELS, "result"],
        )
        busbw = GaugeMetricFamily(
            "spotd_pool_preflight_bus_bandwidth_bytes_per_second",
            "All-reduce bus bandwidth of the pool's latest preflight that measured one.",
            labels=_POOL_LABELS,
        )
        for p in sorted(self._queries_now().preflights(), key=lambda p: _pool_values(p.pool)):
            values = _pool_values(p.pool)
            total.add_metric([*values, "passed"], p.passed)
            total.add_metric([*values, "failed"], p.failed)
            if p.latest_busbw_gbps is not None:
                busbw.add_metric(values, p.latest_busbw_gbps * _BYTES_PER_GB)
        return [total, busbw]

    # -- the daemon's own ---------------------------------------------------

    def _polls(self) -> list[Metric]:
        now = self._wall.now().timestamp()
        age = GaugeMetricFamily(
            "spotd_price_poll_age_seconds",
            "Seconds since the provider's last good price poll (+Inf: never polled).",
            labels=["provider"],
        )
        failures = GaugeMetricFamily(
            "spotd_price_poll_failures",
            "Price polls of the provider failed in a row.",
            labels=["provider"],
        )
        for provider, snapshot in sorted(self._reader.market.snapshots().items()):
            seconds = snapshot.age(now)
            age.add_metric([provider], math.inf if seconds is None else max(0.0, seconds))
            failures.add_metric([provider], snapshot.failures)
        return [age, failures]

    def _outbox_size(self) -> list[Metric]:
        if self._outbox is None:
            return []
        return [
            GaugeMetricFamily(
                "spotd_outbox_messages",
                "Emails waiting for delivery.",
                value=len(self._outbox.pending()),
            )
        ]


def _pool_values(pool: Pool) -> list[str]:
    return [pool.provider, pool.region, pool.zone, pool.instance_type]


def _key_order(key: PoolMarket) -> tuple[str, ...]:
    return (*_pool_values(key.pool), key.market)


def _add_histogram(family: HistogramMetricFamily, h: Histogram, bounds: Sequence[float]) -> None:
    buckets = [(_bound(b), float(n)) for b, n in zip(bounds, h.cumulative, strict=True)]
    buckets.append(("+Inf", float(h.count)))
    family.add_metric(_pool_values(h.pool), buckets, sum_value=h.total)


def _bound(value: float) -> str:
    # Prometheus' own clients write bounds as floats ("60.0"); keep to that.
    return repr(float(value))


def build_registry(
    reader: ReadView,
    spend_fn: Callable[[], FleetTotals] | None = None,
    *,
    outbox: Outboxlike | None = None,
) -> CollectorRegistry:
    """A fresh registry holding the daemon's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpotdCollector(reader, spend_fn, outbox=outbox))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format."""
    return generate_latest(registry)


def create_metrics_router(
    reader: ReadView,
    spend_fn: Callable[[], FleetTotals] | None = None,
    *,
    outbox: Outboxlike | None = None,
    dependencies: Sequence[params.Depends] = (),
    route_class: type[APIRoute] = APIRoute,
) -> APIRouter:
    """``GET /metrics`` over what ``reader`` reads; ``route_class`` (a
    :func:`~spotd.daemon.guard.checked_first` one) or ``dependencies`` can require
    the bearer token."""
    registry = build_registry(reader, spend_fn, outbox=outbox)
    router = APIRouter(route_class=route_class)

    # A plain def: FastAPI runs it in its thread pool, off the event loop,
    # since the collector queries the database.
    @router.get("/metrics", include_in_schema=False, dependencies=list(dependencies))
    def metrics() -> Response:
        return Response(content=render(registry), media_type=CONTENT_TYPE_LATEST)

    return router
