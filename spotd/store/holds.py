"""The holds part of the SQL store: the nodes a failed attempt keeps for inspection
(``keep_on_failure``), and what a retry changes on a job's attempts.

A hold is the closed attempt's ``held_until``, written with the transition that
fails the job (:func:`~spotd.store.sql.SqlStore.compare_and_set`). While it is set
the attempt's nodes run on; the hold's keeper (:mod:`spotd.engine.holds`) stops
them once it runs out or a user releases them, and ends it here
(:meth:`HoldRows.end_hold`): ``held_until`` back to null, ``released_at`` set. So
the index on ``held_until`` holds the holds in force, and a pass reads them
without reading any other attempt.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Connection, select, update

from spotd.core.intents import IntentKind, IntentOutcome
from spotd.core.states import JobStatus
from spotd.core.values import AttemptRecord, EventCause
from spotd.store.base import SqlBase
from spotd.store.job_sql import insert_event
from spotd.store.rows import attempt_record
from spotd.store.tables import ATTEMPTS, INTENTS, JOBS


class HoldRows(SqlBase):
    """The holds of failed attempts' nodes in the SQL database
    (:class:`~spotd.core.contracts.HoldStore`)."""

    def held_attempts(self, owners: Collection[str]) -> list[AttemptRecord]:
        """The attempts whose nodes a hold keeps, of the jobs that ``owners`` hold or last
        held; the hold that runs out first comes first."""
        query = (
            select(ATTEMPTS)
            .join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id)
            .where(ATTEMPTS.c.held_until.is_not(None), JOBS.c.owner.in_(list(owners)))
            .order_by(ATTEMPTS.c.held_until, ATTEMPTS.c.id)
        )
        with self._read() as conn:
            return [attempt_record(row) for row in conn.execute(query)]

    def end_hold(self, attempt_id: int, *, at: datetime, detail: str) -> bool:
        """Record that the kept nodes of the attempt were stopped at ``at``, with a
        ``nodes released`` event (``detail``) on its job, and settle the job's open
        release intents as applied; one transaction. False, and nothing written, when
        the attempt keeps no nodes (another daemon ended the hold first)."""
        try:
            with self._write() as conn:
                _end_hold(conn, attempt_id, at, detail)
        except _NoHold:
            return False
        return True


class _NoHold(Exception):
    """The attempt keeps no nodes: the transaction that would end its hold rolls back."""


def _end_hold(conn: Connection, attempt_id: int, at: datetime, detail: str) -> None:
    job_id = conn.execute(
        select(ATTEMPTS.c.job_id)
        .where(ATTEMPTS.c.id == attempt_id, ATTEMPTS.c.held_until.is_not(None))
    ).scalar()  # fmt: skip
    if job_id is None:
        raise _NoHold
    # The job's row first, then the attempt's, as a transition locks them.
    status = conn.execute(
        update(JOBS).where(JOBS.c.id == job_id)
        .values(version=JOBS.c.version + 1).returning(JOBS.c.status)
    ).scalar_one()  # fmt: skip
    ended = conn.execute(
        update(ATTEMPTS)
        .where(ATTEMPTS.c.id == attempt_id, ATTEMPTS.c.held_until.is_not(None))
        .values(held_until=None, released_at=at)
    )  # fmt: skip
    if ended.rowcount == 0:
        raise _NoHold  # ended by another daemon since the read above
    now = JobStatus(status)
    insert_event(conn, job_id, at=at, from_status=now, to_status=now,
                 cause=EventCause.RELEASED, detail=detail)  # fmt: skip
    conn.execute(
        update(INTENTS)
        .where(INTENTS.c.job_id == job_id, INTENTS.c.kind == IntentKind.RELEASE.value,
               INTENTS.c.settled_at.is_(None))
        .values(settled_at=at, outcome=IntentOutcome.APPLIED.value)
    )  # fmt: skip


def holding(conn: Connection, job_id: str) -> bool:
    """Whether an attempt of the job keeps its nodes (a hold in force)."""
    query = select(ATTEMPTS.c.id).where(
        ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.held_until.is_not(None)
    )
    return conn.execute(query.limit(1)).first() is not None


def leave_end(conn: Connection, job_id: str, now: datetime) -> None:
    """The job leaves the status it ended in (a retry), in the transition's transaction:
    its attempts so far count no more toward its ``[retry]`` bounds, and a hold of its
    nodes runs out now (the keeper stops them in its next pass: a retry reuses none)."""
    of_job = ATTEMPTS.c.job_id == job_id
    conn.execute(update(ATTEMPTS).where(of_job).values(before_retry=True))
    running = (of_job, ATTEMPTS.c.held_until.is_not(None), ATTEMPTS.c.held_until > now)
    conn.execute(update(ATTEMPTS).where(*running).values(held_until=now))
