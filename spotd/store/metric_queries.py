"""Aggregate reads of the store for ``/metrics``: per pool, and per job for a few jobs.

Every query here is one statement (per chunk of job ids where it takes ids)
that the database aggregates, so a scrape costs a fixed number of round trips
however many jobs, attempts and ledger lines the store holds; nothing loads
every job. Times are the store's: attempts and events on the engine's clock,
agent reports on the agents' own clocks.

A *pool* here is ``(provider, region, zone, instance_type)``; the spend and
attempt counts also split it by market.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Select,
    and_,
    case,
    cast,
    exists,
    func,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from spotd.core.values import TERMINAL, JobRecord, Pool

# The store package's own row readers: one reading of a row, wherever it is read.
from spotd.store.rows import chunks, job_record
from spotd.store.sql import SqlStore
from spotd.store.tables import ATTEMPTS, JOBS, LEDGER, REPORTS

"""Job ids per ``IN`` list: SQLite caps the bound parameters of one statement."""

_TERMINAL = tuple(s.value for s in TERMINAL)
_POOL = ("provider", "region", "zone", "instance_type")


@dataclass(frozen=True, slots=True)
class PoolMarket:
    """A pool and a market: the labels of spend and attempt counts."""

    pool: Pool
    market: str


@dataclass(frozen=True, slots=True)
class Billed:
    """Stored ledger lines summed: what was paid and its on-demand equivalent, USD."""

    usd: float
    on_demand_usd: float
    saved_usd: float = 0.0
    """On-demand equivalent less spend, of the lines of jobs that neither failed nor were
    cancelled (theirs claim no saving: :mod:`spotd.billing.savings`)."""


@dataclass(frozen=True, slots=True)
class BilledLines:
    """The stored ledger lines of closed attempts, summed two ways in one snapshot."""

    by_pool: dict[PoolMarket, Billed]
    """Over every job, by pool and market."""
    by_attempt: dict[str, dict[int, Billed]]
    """For the jobs asked about, by job id and attempt seq."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observations of one pool: cumulative counts at each bucket's upper bound."""

    pool: Pool
    cumulative: tuple[int, ...]
    """``cumulative[i]``: observations ``<= bounds[i]`` (the bounds the caller gave)."""
    count: int
    total: float


@dataclass(frozen=True, slots=True)
class PoolPreflight:
    """The preflights of one pool: attempts that passed or failed, the latest bandwidth."""

    pool: Pool
    passed: int
    failed: int
    latest_busbw_gbps: float | None
    """The bus bandwidth of the pool's latest attempt that measured one, GB/s."""


class MetricQueries:
    """The aggregate reads behind the per-pool and per-job metrics."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"

    @classmethod
    def of(cls, store: object) -> MetricQueries | None:
        """The queries over ``store``'s database; None for a store that is not SQL."""
        return cls(store.engine) if isinstance(store, SqlStore) else None

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        # One transaction per call, and on PostgreSQL a repeatable read: the statements
        # of one call see one snapshot (SQLite's read transactions always do).
        options = {"isolation_level": "REPEATABLE READ"} if self._postgres else {}
        with self._engine.connect().execution_options(**options) as conn, conn.begin():
            yield conn

    # -- jobs ---------------------------------------------------------------

    def recently_ended(self, *, since: datetime, limit: int) -> list[JobRecord]:
        """Up to ``limit`` jobs that ended at ``since`` or later, the latest first."""
        query = (
            select(JOBS)
            .where(JOBS.c.status.in_(_TERMINAL), JOBS.c.updated_at >= since)
            .order_by(JOBS.c.updated_at.desc(), JOBS.c.id.desc())
            .limit(limit)
        )
        with self._read() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def jobs(self, job_ids: Collection[str]) -> list[JobRecord]:
        """The jobs of ``job_ids`` that exist, in no particular order."""
        found: list[JobRecord] = []
        with self._read() as conn:
            for chunk in chunks(list(job_ids)):
                found.extend(
                    job_record(r) for r in conn.execute(select(JOBS).where(JOBS.c.id.in_(chunk)))
                )
        return found

    def jobs_with_unbilled_attempts(self) -> set[str]:
        """Jobs with a closed attempt that launched nodes but has no ledger line yet.

        Briefly true of every attempt that ends (the engine bills it right
        after the transition), and for good of one whose bill failed; such an
        attempt is priced like an open one until it is billed.
        """
        billed = exists().where(
            LEDGER.c.job_id == ATTEMPTS.c.job_id, LEDGER.c.attempt == ATTEMPTS.c.seq
        )
        query = (
            select(ATTEMPTS.c.job_id)
            .where(ATTEMPTS.c.ended_at.is_not(None), ATTEMPTS.c.instance_ids != "[]", ~billed)
            .distinct()
        )
        with self._read() as conn:
            return {str(job_id) for job_id in conn.execute(query).scalars()}

    # -- money --------------------------------------------------------------

    def billed(self, job_ids: Collection[str]) -> BilledLines:
        """The stored ledger lines of closed attempts: summed by pool and market over
        every job, and by attempt for ``job_ids``, in one snapshot (so a bill written
        meanwhile is in both sums or in neither).

        Lines of an attempt still open are left out: its cost so far is priced to
        now by the caller, as :func:`spotd.billing.ledger.ledger_so_far` does.
        """
        keys = (
            LEDGER.c.provider,
            LEDGER.c.region,
            LEDGER.c.zone,
            LEDGER.c.instance_type,
            LEDGER.c.market,
        )
        closed_lines = LEDGER.join(ATTEMPTS, _line_of_attempt())
        saving = case(
            (LEDGER.c.job_status.in_(["failed", "cancelled"]), literal(0.0)),
            else_=LEDGER.c.on_demand_usd - LEDGER.c.usd,
        )
        pools = (
            select(
                *keys, func.sum(LEDGER.c.usd), func.sum(LEDGER.c.on_demand_usd), func.sum(saving)
            )
            .select_from(closed_lines)
            .where(ATTEMPTS.c.ended_at.is_not(None))
            .group_by(*keys)
        )
        by_attempt: dict[str, dict[int, Billed]] = {}
        with self._read() as conn:
            by_pool = {
                PoolMarket(Pool(r[0], r[1], r[2], r[3]), r[4]): Billed(
                    float(r[5]), float(r[6]), float(r[7])
                )
                for r in conn.execute(pools)
            }
            for chunk in chunks(list(job_ids)):
                query = (
                    select(
                        LEDGER.c.job_id,
                        LEDGER.c.attempt,
                        func.sum(LEDGER.c.usd),
                        func.sum(LEDGER.c.on_demand_usd),
                    )
                    .select_from(closed_lines)
                    .where(LEDGER.c.job_id.in_(chunk), ATTEMPTS.c.ended_at.is_not(None))
                    .group_by(LEDGER.c.job_id, LEDGER.c.attempt)
                )
                for job_id, seq, usd, on_demand in conn.execute(query):
                    by_attempt.setdefault(job_id, {})[int(seq)] = Billed(
                        float(usd), float(on_demand)
                    )
        return BilledLines(by_pool=by_pool, by_attempt=by_attempt)

    # -- attempts -----------------------------------------------------------

    def attempts_by_reason(self) -> dict[tuple[PoolMarket, str], int]:
        """Ended attempts counted by pool, market and end reason."""
        keys = (*_pool_columns(), ATTEMPTS.c.market, ATTEMPTS.c.end_reason)
        query = (
            select(*keys, func.count()).where(ATTEMPTS.c.end_reason.is_not(None)).group_by(*keys)
        )
        with self._read() as conn:
            return {
                (PoolMarket(Pool(r[0], r[1], r[2], r[3]), r[4]), r[5]): int(r[6])
                for r in conn.execute(query)
            }

    def placement_histogram(self, bounds: Sequence[float]) -> list[Histogram]:
        """How long placements took, by the pool they ran in, on the engine's clock.

        One observation per attempt that reached ``running``: from the moment
        the job began to wait for it (its submission, or the end of its last
        attempt that ran: a recovery) to ``running_at``. Launches that failed
        in between count in the wait, not as placements.
        """
        ran_before = func.max(case((ATTEMPTS.c.running_at.is_not(None), ATTEMPTS.c.ended_at)))
        waited_from = func.coalesce(
            ran_before.over(
                partition_by=ATTEMPTS.c.job_id, order_by=ATTEMPTS.c.seq, rows=(None, -1)
            ),
            JOBS.c.submitted_at,
        )
        ranked = (
            select(
                *_pool_columns(),
                ATTEMPTS.c.running_at.label("running_at"),
                waited_from.label("waited_from"),
            )
            .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
            .where(ATTEMPTS.c.running_at.is_not(None))
            .subquery()
        )
        seconds = self._seconds(ranked.c.running_at, ranked.c.waited_from)
        pool = [ranked.c[n] for n in _POOL]
        return [h for h, _ in self._histograms(select(*pool), pool, seconds, bounds)]

    def notice_histogram(self, bounds: Sequence[float]) -> tuple[dict[Pool, int], list[Histogram]]:
        """Preemption notices per pool, and how long after one each job exited.

        Per node, from its agent's reports: the notice's time and the job's
        exit after it, both on the agent's clock. A job checkpoints on the
        notice's signal and then exits, so the gap is the notice-to-checkpoint
        time; a node killed before its job exited reports no exit and is in
        the notice count only.
        """
        exited = and_(REPORTS.c.exited_at.is_not(None), REPORTS.c.exited_at >= REPORTS.c.notice_at)
        # NULL for a node that did not exit after its notice: counted, not observed.
        seconds = case((exited, self._seconds(REPORTS.c.exited_at, REPORTS.c.notice_at)))
        noticed = (
            select(*_pool_columns())
            .select_from(_reports_with_attempts())
            .where(REPORTS.c.notice_kind == "preemption", REPORTS.c.notice_at.is_not(None))
        )
        rows = self._histograms(noticed, list(_pool_columns()), seconds, bounds)
        return {h.pool: n for h, n in rows}, [h for h, _ in rows if h.count]

    def preflights(self) -> list[PoolPreflight]:
        """Per pool: attempts whose gang preflight passed or failed, and the bus
        bandwidth of the latest attempt that measured one (every node of a gang
        reports the same verdict: one per attempt)."""
        per_attempt = self._preflight_attempts().subquery()
        joined = per_attempt.join(
            ATTEMPTS,
            and_(
                ATTEMPTS.c.job_id == per_attempt.c.job_id,
                ATTEMPTS.c.seq == per_attempt.c.attempt,
                ATTEMPTS.c.provider == per_attempt.c.provider,
            ),
        )
        pool = list(_pool_columns())
        # Measured ones first, then the latest: rank 1 is the pool's latest figure.
        latest_first = (
            case((per_attempt.c.busbw.is_(None), 1), else_=0),
            ATTEMPTS.c.started_at.desc(),
            ATTEMPTS.c.id.desc(),
        )
        ranked = (
            select(
                *pool,
                per_attempt.c.busbw.label("busbw"),
                func.row_number().over(partition_by=pool, order_by=latest_first).label("rank"),
                func.sum(per_attempt.c.passed).over(partition_by=pool).label("passed"),
                func.count().over(partition_by=pool).label("attempts"),
            )
            .select_from(joined)
            .subquery()
        )
        query = select(*[ranked.c[n] for n in (*_POOL, "passed", "attempts", "busbw")])
        with self._read() as conn:
            return [
                PoolPreflight(
                    pool=Pool(r[0], r[1], r[2], r[3]),
                    passed=int(r[4] or 0),
                    failed=int(r[5]) - int(r[4] or 0),
                    latest_busbw_gbps=None if r[6] is None else float(r[6]),
                )
                for r in conn.execute(query.where(ranked.c.rank == 1))
            ]

    def latest_preflight_busbw(self, job_ids: Collection[str]) -> dict[str, float]:
        """Per job of ``job_ids``: the bus bandwidth of its latest attempt that measured one."""
        found: dict[str, tuple[int, float]] = {}
        with self._read() as conn:
            for chunk in chunks(list(job_ids)):
                sub = self._preflight_attempts(chunk).subquery()
                query = select(sub.c.job_id, sub.c.attempt, sub.c.busbw)
                for job_id, seq, busbw in conn.execute(query.where(sub.c.busbw.is_not(None))):
                    if job_id not in found or found[job_id][0] < seq:
                        found[job_id] = (int(seq), float(busbw))
        return {job_id: busbw for job_id, (_, busbw) in found.items()}

    def latest_notice_seconds(self, job_ids: Collection[str]) -> dict[str, float]:
        """Per job of ``job_ids``: its latest attempt's notice-to-exit time (the
        slowest node's), where its agents reported both (see :meth:`notice_histogram`)."""
        seconds = self._seconds(REPORTS.c.exited_at, REPORTS.c.notice_at)
        found: dict[str, tuple[int, float]] = {}
        with self._read() as conn:
            for chunk in chunks(list(job_ids)):
                query = (
                    select(REPORTS.c.job_id, REPORTS.c.attempt, func.max(seconds))
                    .where(
                        REPORTS.c.job_id.in_(chunk),
                        REPORTS.c.notice_kind == "preemption",
                        REPORTS.c.notice_at.is_not(None),
                        REPORTS.c.exited_at.is_not(None),
                        REPORTS.c.exited_at >= REPORTS.c.notice_at,
                    )
                    .group_by(REPORTS.c.job_id, REPORTS.c.attempt)
                )
                for job_id, seq, value in conn.execute(query):
                    if job_id not in found or found[job_id][0] < seq:
                        found[job_id] = (int(seq), float(value))
        return {job_id: value for job_id, (_, value) in found.items()}

    # -- helpers --------------------------------------------------------------

    def _preflight_attempts(self, job_ids: Sequence[str] | None = None) -> Select[Any]:
        """One row per attempt with a reported preflight (``job_id``, ``attempt``,
        ``provider``): whether it passed (1 or 0) and its bus bandwidth in GB/s
        (null when not measured). The reports alone: grouped before any join."""
        passed = case((self._json_true(REPORTS.c.preflight, "passed"), 1), else_=0)
        query = (
            select(
                REPORTS.c.job_id.label("job_id"),
                REPORTS.c.attempt.label("attempt"),
                REPORTS.c.provider.label("provider"),
                func.max(passed).label("passed"),
                func.max(self._json_number(REPORTS.c.preflight, "busbw_gbps")).label("busbw"),
            )
            .where(REPORTS.c.preflight.is_not(None))
            .group_by(REPORTS.c.job_id, REPORTS.c.attempt, REPORTS.c.provider)
        )
        if job_ids is not None:
            query = query.where(REPORTS.c.job_id.in_(job_ids))
        return query

    def _histograms(
        self,
        rows: Select[Any],
        pool: Sequence[ColumnElement[Any]],
        seconds: ColumnElement[Any],
        bounds: Sequence[float],
    ) -> list[tuple[Histogram, int]]:
        """Bucket ``seconds`` over ``rows`` by ``pool``, in the database: each pool's
        histogram (of the rows whose ``seconds`` is not null) and its count of rows."""
        buckets = [func.sum(case((seconds <= literal(b), 1), else_=0)) for b in bounds]
        query = rows.with_only_columns(
            *pool,
            func.count(),
            func.count(seconds),
            func.sum(seconds),
            *buckets,
            maintain_column_froms=True,
        ).group_by(*pool)
        with self._read() as conn:
            return [
                (
                    Histogram(
                        pool=Pool(r[0], r[1], r[2], r[3]),
                        cumulative=tuple(int(v or 0) for v in r[7:]),
                        count=int(r[5]),
                        total=float(r[6] or 0.0),
                    ),
                    int(r[4]),
                )
                for r in conn.execute(query)
            ]

    def _seconds(self, later: Any, earlier: Any) -> ColumnElement[Any]:
        """``later - earlier`` in seconds, in SQL."""
        if self._postgres:
            return func.extract("epoch", later - earlier)
        # SQLite keeps datetimes as ISO text; julianday() reads it as fractional days,
        # which is a few microseconds off after the product: rounded to the millisecond,
        # a gap of exactly a bucket's bound falls in that bucket as on PostgreSQL.
        return func.round((func.julianday(later) - func.julianday(earlier)) * 86400.0, 3)

    def _json_number(self, column: Any, key: str) -> ColumnElement[Any]:
        if self._postgres:
            return cast(cast(column, JSONB)[key].astext, Float)
        return func.json_extract(column, f"$.{key}")

    def _json_true(self, column: Any, key: str) -> ColumnElement[bool]:
        if self._postgres:
            text: ColumnElement[str] = cast(column, JSONB)[key].astext
            return text == literal("true")
        # SQLite's json_extract gives a JSON true as the integer 1.
        value: ColumnElement[int] = func.json_extract(column, f"$.{key}")
        return value == literal(1)


def _pool_columns() -> tuple[ColumnElement[Any], ...]:
    return (ATTEMPTS.c.provider, ATTEMPTS.c.region, ATTEMPTS.c.zone, ATTEMPTS.c.instance_type)


def _reports_with_attempts() -> Any:
    """Agent reports joined to their attempts (for the pool)."""
    return REPORTS.join(
        ATTEMPTS,
        and_(
            ATTEMPTS.c.job_id == REPORTS.c.job_id,
            ATTEMPTS.c.seq == REPORTS.c.attempt,
            ATTEMPTS.c.provider == REPORTS.c.provider,
        ),
    )


def _line_of_attempt() -> ColumnElement[bool]:
    return and_(ATTEMPTS.c.job_id == LEDGER.c.job_id, ATTEMPTS.c.seq == LEDGER.c.attempt)


__all__ = ["Billed", "BilledLines", "Histogram", "MetricQueries", "PoolMarket", "PoolPreflight"]
