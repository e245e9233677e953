"""The money part of the SQL store: the prices polled over time, the ledger of what
each attempt cost, and the claims of the notifications sent about jobs (SQL in
:mod:`spotd.store.ledger_sql` and :mod:`spotd.store.history`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import select

from spotd.core.errors import StoreError
from spotd.core.states import JobStatus
from spotd.core.values import LedgerEntry, Offering, Pool, PricePoint
from spotd.store import history, ledger_sql
from spotd.store.base import SqlBase
from spotd.store.rows import chunks
from spotd.store.tables import ATTEMPTS, JOBS, LEDGER


class LedgerRows(SqlBase):
    """Price history, ledger lines and notification claims in the SQL database: the
    :class:`~spotd.core.contracts.LedgerStore` and the prices of the
    :class:`~spotd.core.contracts.HistoryStore`."""

    def record_prices(self, offerings: Sequence[Offering], *, at: datetime) -> int:
        """Keep the offerings' prices as history; returns the rows written."""
        with self._write() as conn:
            return history.insert_prices(conn, offerings, at)

    def price_history(self, pool: Pool, *, since: datetime) -> list[PricePoint]:
        """The pool's polled prices since ``since``, oldest first."""
        with self._read() as conn:
            return history.select_history(conn, pool, since)

    def replace_ledger(self, job_id: str, entries: Sequence[LedgerEntry]) -> None:
        """Replace all ledger lines of ``job_id`` with ``entries``, in one transaction."""
        with self._write() as conn:
            try:
                ledger_sql.replace_job(conn, job_id, entries)
            except ValueError as exc:
                raise StoreError(str(exc)) from exc

    def ledger(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job_id: str | None = None,
    ) -> list[LedgerEntry]:
        """Ledger lines starting in ``[since, until)``, of one job or all, oldest first."""
        with self._read() as conn:
            return ledger_sql.select_entries(conn, since=since, until=until, job_id=job_id)

    def ledger_for(self, job_ids: Collection[str]) -> dict[str, list[LedgerEntry]]:
        """The ledger lines of many jobs at once (one query per chunk), by job id."""
        found: dict[str, list[LedgerEntry]] = {job_id: [] for job_id in job_ids}
        with self._read() as conn:
            for chunk in chunks(list(found)):
                query = (
                    select(LEDGER)
                    .where(LEDGER.c.job_id.in_(chunk))
                    .order_by(LEDGER.c.start, LEDGER.c.job_id, LEDGER.c.attempt, LEDGER.c.id)
                )
                for row in conn.execute(query):
                    found[row.job_id].append(ledger_sql.entry_record(row))
        return found

    def unbilled_jobs(self, owner: str) -> list[str]:
        """The ended jobs last held by ``owner`` with an ended attempt that ran nodes and
        has no ledger line: a daemon killed between a job's end and its bill left them."""
        billed = select(LEDGER.c.id).where(
            LEDGER.c.job_id == ATTEMPTS.c.job_id, LEDGER.c.attempt == ATTEMPTS.c.seq
        )
        query = (
            select(JOBS.c.id)
            .distinct()
            .join(ATTEMPTS, ATTEMPTS.c.job_id == JOBS.c.id)
            .where(
                JOBS.c.owner == owner,
                JOBS.c.status.in_([s.value for s in JobStatus if s.terminal]),
                ATTEMPTS.c.ended_at.is_not(None),
                ATTEMPTS.c.instance_ids != "[]",
                ~billed.exists(),
            )
            .order_by(JOBS.c.id)
        )
        with self._read() as conn:
            return [row.id for row in conn.execute(query)]

    def claim_notification(self, key: str, *, at: datetime) -> bool:
        """Record that notification ``key`` goes out; True only for the first claimer."""
        with self._write() as conn:
            return ledger_sql.claim(conn, key, at)
