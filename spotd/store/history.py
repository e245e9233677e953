"""Price history and agent reports: the SQL behind the store's market and agent methods."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Row,
    Text,
    and_,
    case,
    cast,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite

from spotd.core.values import InstanceReport, Market, Offering, Pool, PricePoint
from spotd.store.tables import PRICES, REPORTS, conflict_insert

REPORT_FIELDS = (
    "heartbeat_at",
    "notice_at",
    "notice_kind",
    "notice_deadline",
    "exit_code",
    "exited_at",
    "address",
    "ports",
    "joined_at",
    "command_at",
    "exit_phase",
    "exit_detail",
    "oom_kills",
    "preflight",
    "step",
    "total_steps",
    "checkpoint",
    "gpus",
    "gpu_util_sum",
    "gpu_samples",
    "gpu_low_samples",
    "ranks",
    "progress_key",
    "progress_at",
    "heard_at",
)
SUMMED_FIELDS = frozenset({"gpu_util_sum", "gpu_samples", "gpu_low_samples"})
"""Fields a report adds to the row's value instead of replacing it (running sums)."""
FIRST_FIELDS = frozenset({"joined_at"})
"""Fields the first report that gives them sets for good (a node asks to join until
its gang is complete: the first ask is the join)."""


def insert_prices(conn: Connection, offerings: Sequence[Offering], at: datetime) -> int:
    """One row per offering and market it is sold in; returns how many."""
    rows = [
        {
            "provider": o.pool.provider,
            "region": o.pool.region,
            "zone": o.pool.zone,
            "instance_type": o.pool.instance_type,
            "market": str(market),
            "price": price,
            "capacity": o.capacity if market is Market.SPOT else None,
            "at": at,
        }
        for o in offerings
        for market in Market
        if (price := o.price(market)) is not None
    ]
    if rows:
        conn.execute(insert(PRICES), rows)
    return len(rows)


def select_history(conn: Connection, pool: Pool, since: datetime) -> list[PricePoint]:
    """The pool's prices since ``since``, oldest first."""
    query = (
        select(PRICES)
        .where(
            and_(
                PRICES.c.provider == pool.provider,
                PRICES.c.zone == pool.zone,
                PRICES.c.instance_type == pool.instance_type,
                PRICES.c.at >= since,
            )
        )
        .order_by(PRICES.c.at, PRICES.c.id)
    )
    return [_price_point(r) for r in conn.execute(query)]


def upsert_report(conn: Connection, report: InstanceReport) -> None:
    """Merge a report into the instance's row: fields left None keep their value,
    running sums add up, a first-only field keeps its first value, and
    ``progress_at`` changes only with ``progress_key`` (the time the node's progress
    last moved)."""
    values: dict[str, Any] = {
        "instance_id": report.instance_id,
        "provider": report.provider,
        "job_id": report.job_id,
        "attempt": report.attempt,
    }
    changed = {f: getattr(report, f) for f in REPORT_FIELDS if getattr(report, f) is not None}
    values.update(changed)
    postgres = conn.dialect.name == "postgresql"
    values["revision"] = _next_revision(postgres)
    stmt = conflict_insert(conn, REPORTS).values(**values)
    update: dict[str, Any] = {f: _merged(f, v) for f, v in changed.items()}
    if "progress_at" in changed and "progress_key" in changed:
        # The node's progress moved only if its key did: else it keeps the time it moved.
        moved = REPORTS.c.progress_key.is_distinct_from(changed["progress_key"])
        at = literal(changed["progress_at"], REPORTS.c.progress_at.type)  # UTC, as stored
        update["progress_at"] = case((moved, at), else_=REPORTS.c.progress_at)
    # A node kept for its job's next attempt (spotd.engine.repair) starts its row afresh
    # with its first report there; a late report of its earlier attempt is dropped.
    update = _afresh_when_later(stmt, update)
    update["revision"] = _next_revision(postgres)
    conn.execute(
        stmt.on_conflict_do_update(index_elements=["instance_id", "provider"], set_=update,
                                   where=REPORTS.c.attempt <= stmt.excluded.attempt)
    )


def _afresh_when_later(
    stmt: postgresql.Insert | sqlite.Insert, update: dict[str, Any]
) -> dict[str, Any]:
    """``update``, or for a report of a later attempt than the row's, the report's own
    fields alone (those it leaves out empty, as in a new row) and its attempt."""
    later = REPORTS.c.attempt < stmt.excluded.attempt
    afresh: dict[str, Any] = {
        f: case((later, stmt.excluded[f]), else_=update.get(f, REPORTS.c[f]))
        for f in REPORT_FIELDS
    }
    afresh["attempt"] = stmt.excluded.attempt
    return afresh


def _next_revision(postgres: bool) -> ColumnElement[int]:
    """The revision a report written now gets: later than every one a reader has seen.

    SQLite has one writer at a time, so one more than the highest is later than
    anything committed before, and commits come in revision order. PostgreSQL
    writers run side by side and may commit out of order: there it is the
    writing transaction's id, and :func:`report_changes` reads from the oldest
    transaction still running when it last read.
    """
    if postgres:
        return cast(cast(func.pg_current_xact_id(), Text), BigInteger)
    highest = select(func.coalesce(func.max(REPORTS.c.revision), 0)).scalar_subquery()
    return highest + 1


def _merged(field: str, value: object) -> Any:
    """What the row's ``field`` becomes when a report brings ``value``."""
    if field in SUMMED_FIELDS:
        return func.coalesce(REPORTS.c[field], 0) + value
    if field in FIRST_FIELDS:
        return func.coalesce(REPORTS.c[field], value)
    return value


def select_reports(conn: Connection, job_id: str) -> list[InstanceReport]:
    """Every agent report of a job's instances."""
    query = select(REPORTS).where(REPORTS.c.job_id == job_id).order_by(REPORTS.c.attempt)
    return [_report(r) for r in conn.execute(query)]


def select_reports_of(conn: Connection, job_ids: Sequence[str]) -> list[InstanceReport]:
    """The agent reports of several jobs."""
    query = select(REPORTS).where(REPORTS.c.job_id.in_(job_ids)).order_by(REPORTS.c.attempt)
    return [_report(r) for r in conn.execute(query)]


def report_changes(conn: Connection, since: int) -> tuple[list[InstanceReport], int]:
    """The reports written at or after revision ``since``, and where to read from next.

    Pass the second value back as ``since`` next time (:func:`report_cursor` the
    first time): every report written in between comes back then, some of those
    read now maybe again.
    """
    after = report_cursor(conn)  # before the rows: see report_cursor
    rows = conn.execute(select(REPORTS).where(REPORTS.c.revision >= since))
    return [_report(r) for r in rows], max(since, after)


def report_cursor(conn: Connection) -> int:
    """The revision from which every report written from now on is read.

    On PostgreSQL, the oldest transaction id still running now: a report
    committed later, by a transaction that began earlier, is at or past it. On
    SQLite (one writer at a time, committing in revision order), one past the
    highest revision; the caller reads the rows in the same transaction, so
    from the same snapshot.
    """
    if conn.dialect.name == "postgresql":
        oldest = func.pg_snapshot_xmin(func.pg_current_snapshot())
        return int(conn.execute(select(cast(cast(oldest, Text), BigInteger))).scalar_one())
    highest = conn.execute(select(func.max(REPORTS.c.revision))).scalar()
    return int(highest or 0) + 1


def _price_point(row: Row[Any]) -> PricePoint:
    return PricePoint(
        pool=Pool(row.provider, row.region, row.zone, row.instance_type),
        market=Market(row.market),
        price=row.price,
        capacity=row.capacity,
        at=row.at,
    )


def _report(row: Row[Any]) -> InstanceReport:
    return InstanceReport(
        instance_id=row.instance_id,
        provider=row.provider,
        job_id=row.job_id,
        attempt=row.attempt,
        **{f: getattr(row, f) for f in REPORT_FIELDS},
    )
