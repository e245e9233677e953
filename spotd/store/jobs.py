"""The jobs part of the SQL store: submitting, finding and listing jobs, what they wait
for, and their events (the status changes themselves are
:meth:`~spotd.store.sql.SqlStore.compare_and_set`)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Connection, insert, or_, select, tuple_, update

from spotd.core.contracts import JobPage
from spotd.core.errors import StoreError
from spotd.core.spec import JobSpec
from spotd.core.spec_io import spec_to_json
from spotd.core.states import WAITING_CAUSE, JobStatus
from spotd.core.values import EventCause, EventRecord, JobRecord
from spotd.store.base import SqlBase
from spotd.store.job_sql import (
    creation_order,
    insert_event,
    job_rows,
    job_with_key,
    load_job,
    make_cursor,
    new_job_id,
    read_cursor,
    resolve_ref,
    spec_team,
)
from spotd.store.rows import chunks, event_record, job_record
from spotd.store.tables import EVENTS, JOBS


class JobRows(SqlBase):
    """Jobs and their events in the SQL database: the reads of
    :class:`~spotd.core.contracts.JobStore` by job, and the writes that change no status."""

    def create_job(
        self, spec: JobSpec, *, now: datetime, idempotency_key: str | None = None
    ) -> JobRecord:
        """Insert a new PENDING job (and its first event).

        With an ``idempotency_key`` another job already holds, nothing is inserted
        and that job is returned: the unique column decides between two racing
        submits of one key, the loser reading the winner's job.
        """
        job_id = new_job_id()
        try:
            with self._write() as conn:
                if idempotency_key is not None:
                    held = job_with_key(conn, idempotency_key)
                    if held is not None:
                        return held
                return self._insert_job(conn, job_id, spec, now, idempotency_key)
        except StoreError:
            held = self.job_by_idempotency_key(idempotency_key) if idempotency_key else None
            if held is None:
                raise
            return held

    def job_by_idempotency_key(self, key: str) -> JobRecord | None:
        """The job submitted with this idempotency key, None when there is none."""
        with self._read() as conn:
            return job_with_key(conn, key)

    @staticmethod
    def _insert_job(
        conn: Connection, job_id: str, spec: JobSpec, now: datetime, key: str | None
    ) -> JobRecord:
        conn.execute(
            insert(JOBS).values(
                id=job_id,
                name=spec.name,
                spec_json=spec_to_json(spec),
                status=JobStatus.PENDING.value,
                failure=None,
                submitted_at=now,
                updated_at=now,
                version=0,
                idempotency_key=key,
            )
        )
        insert_event(
            conn,
            job_id,
            at=now,
            from_status=None,
            to_status=JobStatus.PENDING,
            cause=EventCause.SUBMITTED,
            detail="",
        )
        return load_job(conn, job_id)

    def get_job(self, job_id: str) -> JobRecord:
        """The job with this id, or :class:`~spotd.core.errors.JobNotFound`."""
        with self._read() as conn:
            return load_job(conn, job_id)

    def find_job(self, ref: str) -> JobRecord:
        """A job by id, unique id prefix, or name (the newest of that name)."""
        with self._read() as conn:
            job_id = resolve_ref(conn, ref)
            return load_job(conn, job_id)

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``statuses``."""
        query = job_rows().order_by(*creation_order())
        if statuses is not None:
            query = query.where(JOBS.c.status.in_([s.value for s in statuses]))
        with self._read() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def jobs_page(
        self,
        *,
        statuses: Collection[JobStatus] | None = None,
        team: str | None = None,
        limit: int,
        cursor: str | None = None,
        name: str | None = None,
    ) -> JobPage:
        """Up to ``limit`` jobs, newest first (by submit time, then id), optionally only
        those in ``statuses``, of ``team`` and whose name contains ``name`` (any case),
        starting after ``cursor`` (a page's ``next``).

        A keyset read on ``(submitted_at, id)`` (indexed, with and without the
        status): no OFFSET, so a deep page costs what the first does, and the
        order key never changes, so a job is on one page only. ``team`` is read
        from the stored spec's JSON and ``name`` matched with LIKE: both filtered
        along the index walk, not indexed (a name no job has reads every row once).
        """
        if limit < 1:
            raise StoreError(f"a page holds at least one job, not {limit}")
        order = (JOBS.c.submitted_at.desc(), JOBS.c.id.desc())
        query = job_rows().order_by(*order).limit(limit + 1)
        if statuses is not None:
            query = query.where(JOBS.c.status.in_([s.value for s in statuses]))
        if team is not None:
            query = query.where(spec_team(self._engine.dialect.name) == team)
        if name:
            query = query.where(JOBS.c.name.icontains(name, autoescape=True))
        if cursor is not None:
            at, job_id = read_cursor(cursor)
            query = query.where(tuple_(JOBS.c.submitted_at, JOBS.c.id) < tuple_(at, job_id))
        with self._read() as conn:
            rows = conn.execute(query).all()
        jobs = [job_record(row) for row in rows[:limit]]
        more = len(rows) > limit
        return JobPage(jobs=jobs, next=make_cursor(jobs[-1]) if more else None)

    def jobs_by_id(self, job_ids: Collection[str]) -> dict[str, JobRecord]:
        """These jobs, those that exist, by id (one query per chunk)."""
        found: dict[str, JobRecord] = {}
        with self._read() as conn:
            for chunk in chunks(list(job_ids)):
                for row in conn.execute(job_rows().where(JOBS.c.id.in_(chunk))):
                    found[row.id] = job_record(row)
        return found

    def job_versions(self, job_ids: Collection[str]) -> dict[str, int]:
        """The version of each of these jobs that exists, by id (one query per chunk)."""
        found: dict[str, int] = {}
        with self._read() as conn:
            for chunk in chunks(list(job_ids)):
                query = select(JOBS.c.id, JOBS.c.version).where(JOBS.c.id.in_(chunk))
                found.update((str(i), int(v)) for i, v in conn.execute(query))
        return found

    def set_waiting(
        self, job_id: str, status: JobStatus, reason: str, *, now: datetime,
        cause: EventCause = WAITING_CAUSE,
    ) -> bool:
        """Record why the job, still in ``status``, waits: the reason on the job and an
        event (``status`` to ``status``, ``cause``, the reason as detail), in one
        transaction, and only if the job is in ``status`` and its reason is another.
        Whether it wrote. The version counts it; ``updated_at`` (when the status last
        changed) does not move.
        """
        with self._write() as conn:
            changed = conn.execute(
                update(JOBS)
                .where(
                    JOBS.c.id == job_id,
                    JOBS.c.status == status.value,
                    or_(JOBS.c.waiting.is_(None), JOBS.c.waiting != reason),
                )
                .values(waiting=reason, version=JOBS.c.version + 1)
            )
            if changed.rowcount != 1:
                return False
            insert_event(conn, job_id, at=now, from_status=status, to_status=status,
                         cause=cause, detail=reason)  # fmt: skip
            return True

    def events(self, job_id: str) -> list[EventRecord]:
        """All events of a job in order."""
        query = select(EVENTS).where(EVENTS.c.job_id == job_id).order_by(EVENTS.c.id)
        with self._read() as conn:
            return [event_record(row) for row in conn.execute(query)]
