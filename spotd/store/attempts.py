"""The attempts part of the SQL store: the launches of each job (opened and closed by
:meth:`~spotd.store.sql.SqlStore.compare_and_set`), their instances, and what the
agents on those instances reported (SQL in :mod:`spotd.store.history`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, select, update

from spotd.core.errors import StoreError
from spotd.core.values import AttemptRecord, InstanceReport
from spotd.store import history
from spotd.store.base import SqlBase
from spotd.store.rows import attempt_record, chunks
from spotd.store.tables import ATTEMPTS, JOBS


class AttemptRows(SqlBase):
    """The attempts of jobs and their agents' reports in the SQL database."""

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """All attempts of a job in order (by ``seq``)."""
        query = select(ATTEMPTS).where(ATTEMPTS.c.job_id == job_id).order_by(ATTEMPTS.c.seq)
        with self._read() as conn:
            return [attempt_record(row) for row in conn.execute(query)]

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        """The attempts of many jobs at once (one query per chunk), by job id."""
        found: dict[str, list[AttemptRecord]] = {job_id: [] for job_id in job_ids}
        with self._read() as conn:
            for chunk in chunks(list(found)):
                query = (
                    select(ATTEMPTS)
                    .where(ATTEMPTS.c.job_id.in_(chunk))
                    .order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.seq)
                )
                for row in conn.execute(query):
                    found[row.job_id].append(attempt_record(row))
        return found

    def set_attempt_instances(self, attempt_id: int, instance_ids: Sequence[str]) -> None:
        """Record the instances a launch returned (replacing any recorded before)."""
        change = (
            update(ATTEMPTS)
            .where(ATTEMPTS.c.id == attempt_id)
            .values(instance_ids=json.dumps(list(instance_ids)))
        )
        with self._write() as conn:
            _count_change_of(conn, attempt_id)
            if conn.execute(change).rowcount == 0:
                raise StoreError(f"no attempt {attempt_id}")

    def mark_attempt_running(self, attempt_id: int, *, at: datetime) -> None:
        """Record when all nodes of the attempt started running the job.

        The first time recorded stays: reconciling the same running attempt
        again does not move it.
        """
        change = (
            update(ATTEMPTS)
            .where(ATTEMPTS.c.id == attempt_id, ATTEMPTS.c.running_at.is_(None))
            .values(running_at=at)
        )
        with self._write() as conn:
            _count_change_of(conn, attempt_id, ATTEMPTS.c.running_at.is_(None))
            if conn.execute(change).rowcount == 0:
                _require_attempt(conn, attempt_id)

    def save_report(self, report: InstanceReport) -> None:
        """Merge an agent's report into what is known of its instance."""
        with self._write() as conn:
            history.upsert_report(conn, report)

    def reports(self, job_id: str) -> list[InstanceReport]:
        """What the agents of a job's instances reported."""
        with self._read() as conn:
            return history.select_reports(conn, job_id)

    def reports_for(self, job_ids: Collection[str]) -> dict[str, list[InstanceReport]]:
        """The agents' reports of many jobs at once, by job id."""
        found: dict[str, list[InstanceReport]] = {job_id: [] for job_id in job_ids}
        with self._read() as conn:
            for chunk in chunks(list(found)):
                for report in history.select_reports_of(conn, chunk):
                    found[report.job_id].append(report)
        return found

    def report_changes(self, since: int) -> tuple[list[InstanceReport], int]:
        """The agents' reports written since ``since`` (0: all of them), and the ``since``
        of the next read (:func:`spotd.store.history.report_changes`)."""
        with self._read() as conn:
            return history.report_changes(conn, since)

    def report_cursor(self) -> int:
        """The ``since`` from which :meth:`report_changes` returns every report written later."""
        with self._read() as conn:
            return history.report_cursor(conn)


def _count_change_of(conn: Connection, attempt_id: int, *only_if: ColumnElement[bool]) -> None:
    """Bump the version of the attempt's job (where the attempt matches ``only_if``):
    readers that keep attempts between reads (the engine) know them by it.

    Called before the attempt's own update, so that like a transition it locks
    the job's row first and its attempt's second: two writers of one job never
    wait on each other in opposite orders (a deadlock on PostgreSQL).
    """
    owner = select(ATTEMPTS.c.job_id).where(ATTEMPTS.c.id == attempt_id, *only_if).scalar_subquery()
    conn.execute(update(JOBS).where(JOBS.c.id == owner).values(version=JOBS.c.version + 1))


def _require_attempt(conn: Connection, attempt_id: int) -> None:
    if conn.execute(select(ATTEMPTS.c.id).where(ATTEMPTS.c.id == attempt_id)).first() is None:
        raise StoreError(f"no attempt {attempt_id}")
