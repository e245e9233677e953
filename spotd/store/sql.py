"""The :class:`~spotd.core.contracts.Store` on SQLAlchemy: SQLite or PostgreSQL.

:class:`SqlStore` is made of parts, one per concern, each in its own module and
each reaching the database through :class:`~spotd.store.base.SqlBase`:

- :class:`~spotd.store.jobs.JobRows`: jobs and their events;
- :class:`~spotd.store.leases.LeaseRows`: which daemon holds which job;
- :class:`~spotd.store.attempts.AttemptRows`: attempts and their agents' reports;
- :class:`~spotd.store.ledger.LedgerRows`: prices, the ledger, notification claims;
- :class:`~spotd.store.sessions.SessionRows`: the dashboard's logged-out sessions;
- :class:`~spotd.store.intents.IntentRows`: what users asked of jobs, for the loop;
- :class:`~spotd.store.holds.HoldRows`: the nodes failed attempts keep for inspection.

What is left here is the write across them: a change of status. Every write is
one transaction. A change of status is a guarded ``UPDATE ... WHERE status =
:expected``, so two daemons (or two threads) racing on one job cannot both win,
and the event and attempt rows that go with it commit or roll back together
with it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import Connection, func, insert, select, update

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import StoreError
from spotd.core.states import Transition
from spotd.core.values import AttemptClose, JobRecord, NewAttempt
from spotd.store.attempts import AttemptRows
from spotd.store.base import make_engine
from spotd.store.holds import HoldRows, leave_end
from spotd.store.intents import IntentRows, settle_open, settle_stops
from spotd.store.job_sql import guarded_status_update, insert_event, load_job
from spotd.store.jobs import JobRows
from spotd.store.leases import LeaseRows
from spotd.store.ledger import LedgerRows
from spotd.store.schema import (
    upgrade_schema,
)
from spotd.store.sessions import SessionRows
from spotd.store.tables import ATTEMPTS

__all__ = ["SqlStore", "client_token", "open_store"]


def client_token(job_id: str, seq: int) -> str:
    """The launch idempotency token of attempt ``seq`` of a job."""
    return f"{job_id}-a{seq}"


def open_store(url: str, *, wall: Clock = WALL) -> SqlStore:
    """Connect to ``url``, bring the schema to the newest revision, return the store.

    ``url`` is ``sqlite:///path/to/spotd.db`` (the folder is created) or
    ``postgresql+psycopg://user@host/db``. ``wall``: as :class:`SqlStore`'s.
    """
    engine = make_engine(url)
    try:
        upgrade_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return SqlStore(engine, wall=wall)


class SqlStore(JobRows, LeaseRows, AttemptRows, LedgerRows, SessionRows, IntentRows, HoldRows):
    """Jobs, events and attempts in a SQL database (see :func:`open_store`): the
    parts of the store by concern, and the change of status that writes across them.

    ``wall`` measures the leases where the database keeps no clock of its own (SQLite),
    and tells which dashboard logouts have expired and may be forgotten.
    """

    def compare_and_set(self, change: Transition, *, now: datetime) -> JobRecord:
        """Apply ``change`` if the job is still in ``change.expected``.

        In one transaction: the status update guarded by the expected status,
        the event row, the attempt closed and/or opened with it, and (for an end) the
        job's open intents settled (:func:`~spotd.store.intents.settle_open`; a closed attempt's
        stop intents by :func:`~spotd.store.intents.settle_stops`; for a retry, out of an
        end, the attempts' retry marks and holds by :func:`~spotd.store.holds.leave_end`). Raises
        :class:`~spotd.core.errors.LostTransition` when the guard fails,
        :class:`~spotd.core.errors.JobNotFound` for an unknown job and
        :class:`~spotd.core.errors.StoreError` when the attempt to close is not an
        open attempt of this job; nothing is applied in any of these cases.
        """
        with self._write() as conn:
            guarded_status_update(conn, change, now)
            insert_event(
                conn,
                change.job_id,
                at=now,
                from_status=change.expected,
                to_status=change.new,
                cause=change.cause,
                detail=change.detail,
                facts=change.facts,
            )
            if change.close_attempt is not None:
                _close_attempt(conn, change.job_id, change.close_attempt, now)
                settle_stops(conn, change.job_id, change.close_attempt.reason, now)
            if change.expected.terminal:  # a retry: spotd.engine.retrying
                leave_end(conn, change.job_id, now)
            if change.open_attempt is not None:
                _open_attempt(conn, change.job_id, change.open_attempt, now)
            if change.new.terminal:
                settle_open(conn, change.job_id, change.new, now)
            return load_job(conn, change.job_id)


def _close_attempt(conn: Connection, job_id: str, close: AttemptClose, now: datetime) -> None:
    closing = (
        update(ATTEMPTS)
        .where(
            ATTEMPTS.c.id == close.attempt_id,
            ATTEMPTS.c.job_id == job_id,
            ATTEMPTS.c.ended_at.is_(None),
        )
        .values(ended_at=now, end_reason=close.reason.value, exit_code=close.exit_code,
                held_until=close.held_until)
    )
    if conn.execute(closing).rowcount == 0:
        raise StoreError(f"job {job_id}: attempt {close.attempt_id} is not an open attempt of it")


def _open_attempt(conn: Connection, job_id: str, new: NewAttempt, now: datetime) -> None:
    # Safe from races: the guarded UPDATE before it holds the job's row lock.
    last = conn.execute(
        select(func.max(ATTEMPTS.c.seq)).where(ATTEMPTS.c.job_id == job_id)
    ).scalar()
    seq = int(last or 0) + 1
    conn.execute(
        insert(ATTEMPTS).values(
            job_id=job_id,
            seq=seq,
            provider=new.pool.provider,
            region=new.pool.region,
            zone=new.pool.zone,
            instance_type=new.pool.instance_type,
            market=new.market.value,
            nodes=new.nodes,
            price_per_node_hour=new.price_per_node_hour,
            client_token=client_token(job_id, seq),
            instance_ids="[]",
            resume_from=new.resume_from,
            started_at=now,
            work_per_hour=new.work_per_hour,
            checkpoint_interval_hours=new.checkpoint_interval_hours,
            saves_on_notice=new.saves_on_notice,
        )
    )


if TYPE_CHECKING:
    from spotd.core.contracts import HistoryStore, JobStore, LedgerStore, SessionStore, Store

    # mypy proves here that SqlStore fits the whole Store contract, each part included,
    # and the dashboard's SessionStore.
    def _fits(
        store: SqlStore,
    ) -> tuple[Store, JobStore, HistoryStore, LedgerStore, SessionStore]:
        return store, store, store, store, store
