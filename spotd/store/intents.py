"""The intents part of the SQL store: what users asked of jobs, kept for the loop.

A request bumps the job's version in the transaction that stores it, so the
daemon holding the job sees a changed job in its next pass and steps it (a
running job nothing else changed for is otherwise not stepped at all). The
open intents of a job are settled in the transaction that ends it
(:func:`settle_open`), so an intent is never left open on an ended job.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from spotd.core.errors import IllegalTransition, JobNotFound, NothingHeld
from spotd.core.intents import STOP_KINDS, IntentKind, IntentOutcome, IntentRecord
from spotd.core.spec_io import spec_to_json
from spotd.core.states import JobStatus
from spotd.core.values import EMPTY_FACTS, AttemptEnd, EventCause, EventFacts, JobRecord
from spotd.store.base import SqlBase
from spotd.store.holds import holding
from spotd.store.job_sql import insert_event, load_job
from spotd.store.rows import chunks
from spotd.store.tables import INTENTS, JOBS


class IntentRows(SqlBase):
    """Intents in the SQL database (:class:`~spotd.core.contracts.IntentStore`)."""

    def request_intent(
        self,
        job_id: str,
        kind: IntentKind,
        *,
        at: datetime,
        priority: int | None = None,
        node: int | None = None,
    ) -> IntentRecord:
        """Store what a user asks of an active job and wake the job for its daemon.

        Asking again what is already asked and not yet done stores nothing new: the
        open intent is returned (a second priority replaces the first one's figure, a
        second drill the first one's node).
        :class:`~spotd.core.errors.JobNotFound` for an unknown job,
        :class:`~spotd.core.errors.IllegalTransition` for one that has ended (but a
        ``release``, asked of a job that keeps nodes: :class:`~spotd.core.errors.NothingHeld`
        when it keeps none).
        """
        with self._write() as conn:
            status = conn.execute(select(JOBS.c.status).where(JOBS.c.id == job_id)).scalar()
            if status is None:
                raise JobNotFound(f"no job {job_id!r}", job_id=job_id)
            if kind is IntentKind.RELEASE:
                # Of an ended job as much as of a retried one: whether it keeps nodes.
                if not holding(conn, job_id):
                    raise NothingHeld(f"job {job_id} keeps no nodes to release", job_id=job_id)
            elif JobStatus(status).terminal:
                raise IllegalTransition(f"job {job_id} already {status}", job_id=job_id)
            found = _open_of(conn, job_id, kind)
            if found is not None:
                asked = update(INTENTS).where(INTENTS.c.id == found.id)
                conn.execute(asked.values(priority=priority, node=node))
                intent_id = found.id
            else:
                new = {"job_id": job_id, "kind": kind.value, "requested_at": at}
                added = conn.execute(insert(INTENTS).values(**new, priority=priority, node=node))
                intent_id = added.inserted_primary_key[0]  # type: ignore[index]
            woken = update(JOBS).where(JOBS.c.id == job_id)
            conn.execute(woken.values(version=JOBS.c.version + 1))
            row = conn.execute(select(INTENTS).where(INTENTS.c.id == intent_id)).one()
            return intent_record(row)

    def open_intents(self, job_ids: Collection[str] | None = None) -> dict[str, list[IntentRecord]]:
        """The intents not settled yet, by job, oldest first; of ``job_ids`` only, if given."""
        query = select(INTENTS).where(INTENTS.c.settled_at.is_(None)).order_by(INTENTS.c.id)
        found: dict[str, list[IntentRecord]] = {}
        with self._read() as conn:
            if job_ids is None:
                rows = list(conn.execute(query))
            else:
                parts = chunks(sorted(job_ids))
                rows = [
                    r for p in parts for r in conn.execute(query.where(INTENTS.c.job_id.in_(p)))
                ]
        for row in rows:
            found.setdefault(row.job_id, []).append(intent_record(row))
        return found

    def intents(self, job_id: str) -> list[IntentRecord]:
        """Every intent of the job, settled or not, oldest first."""
        query = select(INTENTS).where(INTENTS.c.job_id == job_id).order_by(INTENTS.c.id)
        with self._read() as conn:
            return [intent_record(row) for row in conn.execute(query)]

    def apply_priority(self, intent: IntentRecord, *, at: datetime) -> JobRecord:
        """Give the job the priority ``intent`` asks, with an event, and settle the intent,
        in one transaction; the job as it is now."""
        if intent.kind is not IntentKind.PRIORITY or intent.priority is None:
            raise ValueError(f"intent {intent.id} asks no priority")
        with self._write() as conn:
            job = load_job(conn, intent.job_id)
            before = job.spec.priority
            spec = job.spec.model_copy(update={"priority": intent.priority})
            conn.execute(
                update(JOBS).where(JOBS.c.id == job.id)
                .values(spec_json=spec_to_json(spec), version=JOBS.c.version + 1)
            )  # fmt: skip
            detail = f"priority {before} -> {intent.priority}"
            insert_event(conn, job.id, at=at, from_status=job.status, to_status=job.status,
                         cause=EventCause.PRIORITY, detail=detail)  # fmt: skip
            _settle(conn, [intent.id], IntentOutcome.APPLIED, at)
            return load_job(conn, job.id)


    def settle_intent(
        self,
        intent: IntentRecord,
        outcome: IntentOutcome,
        *,
        at: datetime,
        cause: EventCause | None = None,
        detail: str = "",
        facts: EventFacts = EMPTY_FACTS,
    ) -> None:
        """Settle ``intent`` as ``outcome`` (if it is still open) and, with a ``cause``,
        write an event of it from and to the job's status, in one transaction."""
        with self._write() as conn:
            status = conn.execute(select(JOBS.c.status).where(JOBS.c.id == intent.job_id)).scalar()
            if status is None:
                raise JobNotFound(f"no job {intent.job_id!r}", job_id=intent.job_id)
            if cause is not None:
                job_status = JobStatus(status)
                insert_event(conn, intent.job_id, at=at, from_status=job_status,
                             to_status=job_status, cause=cause, detail=detail,
                             facts=facts)  # fmt: skip
            _settle(conn, [intent.id], outcome, at)


def settle_open(conn: Connection, job_id: str, ended: JobStatus, at: datetime) -> None:
    """Settle the job's open intents as it ends as ``ended``: a cancel is applied by
    ending as cancelled, and everything else is moot."""
    for intent in _open(conn, job_id):
        done = intent.kind is IntentKind.CANCEL and ended is JobStatus.CANCELLED
        _settle(conn, [intent.id], IntentOutcome.APPLIED if done else IntentOutcome.MOOT, at)


def settle_stops(conn: Connection, job_id: str, closed: AttemptEnd, at: datetime) -> None:
    """Settle the job's open stop intents (``yield-*``) as its attempt closes as
    ``closed``: applied when it yielded, moot when it ended some other way first. A stop
    is about the attempt that ran when it was asked, never the next one."""
    stops = [i.id for i in _open(conn, job_id) if i.kind in STOP_KINDS]
    if stops:
        outcome = IntentOutcome.APPLIED if closed is AttemptEnd.YIELDED else IntentOutcome.MOOT
        _settle(conn, stops, outcome, at)


def intent_record(row: Row[Any]) -> IntentRecord:
    """An ``intents`` row as its record."""
    return IntentRecord(
        id=row.id,
        job_id=row.job_id,
        kind=IntentKind(row.kind),
        requested_at=row.requested_at,
        priority=row.priority,
        node=row.node,
        settled_at=row.settled_at,
        outcome=IntentOutcome(row.outcome) if row.outcome is not None else None,
    )


def _open(conn: Connection, job_id: str) -> list[IntentRecord]:
    query = select(INTENTS).where(INTENTS.c.job_id == job_id, INTENTS.c.settled_at.is_(None))
    return [intent_record(row) for row in conn.execute(query.order_by(INTENTS.c.id))]


def _open_of(conn: Connection, job_id: str, kind: IntentKind) -> IntentRecord | None:
    return next((i for i in _open(conn, job_id) if i.kind is kind), None)


def _settle(conn: Connection, ids: list[int], outcome: IntentOutcome, at: datetime) -> None:
    conn.execute(
        update(INTENTS).where(INTENTS.c.id.in_(ids), INTENTS.c.settled_at.is_(None))
        .values(settled_at=at, outcome=outcome.value)
    )  # fmt: skip
