"""The ledger and notification keys: the SQL behind the store's ledger methods."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, delete, insert, select

from spotd.core.values import EntryKind, LedgerEntry
from spotd.store.tables import LEDGER, NOTIFICATIONS, conflict_insert

_FIELDS = tuple(c.name for c in LEDGER.columns if c.name != "id")


def replace_job(conn: Connection, job_id: str, entries: Sequence[LedgerEntry]) -> int:
    """Delete the job's lines and insert ``entries``; returns the rows written."""
    foreign = {e.job_id for e in entries} - {job_id}
    if foreign:
        raise ValueError(f"ledger lines of other jobs given for {job_id}: {sorted(foreign)}")
    conn.execute(delete(LEDGER).where(LEDGER.c.job_id == job_id))
    # getattr, not dataclasses.asdict: that deep-copies the whole line for each field.
    rows = [{f: getattr(e, f) for f in _FIELDS} for e in entries]
    if rows:
        conn.execute(insert(LEDGER), rows)
    return len(rows)


def select_entries(
    conn: Connection,
    *,
    since: datetime | None,
    until: datetime | None,
    job_id: str | None,
) -> list[LedgerEntry]:
    """Lines starting in ``[since, until)`` (either end open when None), of one job or all."""
    query = select(LEDGER).order_by(LEDGER.c.start, LEDGER.c.job_id, LEDGER.c.attempt, LEDGER.c.id)
    if since is not None:
        query = query.where(LEDGER.c.start >= since)
    if until is not None:
        query = query.where(LEDGER.c.start < until)
    if job_id is not None:
        query = query.where(LEDGER.c.job_id == job_id)
    return [entry_record(row) for row in conn.execute(query)]


def claim(conn: Connection, key: str, at: datetime) -> bool:
    """Insert ``key`` unless it is there; True when this call inserted it.

    INSERT ... ON CONFLICT DO NOTHING is atomic on both dialects: of two
    racing claimers, exactly one gets the key back from RETURNING (the row
    count of such an insert is not reliable through every driver).
    """
    stmt = (
        conflict_insert(conn, NOTIFICATIONS)
        .values(key=key, at=at)
        .on_conflict_do_nothing(index_elements=["key"])
        .returning(NOTIFICATIONS.c.key)
    )
    return conn.execute(stmt).first() is not None


def entry_record(row: Row[Any]) -> LedgerEntry:
    """A ``ledger`` row as its entry."""
    values = {f: getattr(row, f) for f in _FIELDS}
    values["kind"] = cast(EntryKind, row.kind)
    return LedgerEntry(**values)
