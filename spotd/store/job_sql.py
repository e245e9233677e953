"""Jobs and their events: the statements behind the store's job methods, each run
inside a transaction the caller holds."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    cast,
    func,
    insert,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from spotd.core.errors import BadCursor, JobNotFound, LostTransition, StoreError
from spotd.core.states import JobStatus, Transition
from spotd.core.values import EMPTY_FACTS, AttemptEnd, EventCause, EventFacts, JobRecord
from spotd.store.rows import job_record
from spotd.store.tables import EVENTS, JOBS, LEASES, UtcDateTime


def new_job_id() -> str:
    """A fresh job id: ``j-`` and 10 hex digits."""
    return "j-" + uuid.uuid4().hex[:10]


# -- reading jobs ------------------------------------------------------------


def held_until() -> ColumnElement[Any]:
    """The lease that holds the job, in SQL: its owner's row in ``owner_leases`` where
    the owner has one, else the job's own ``lease_until`` (an older daemon's)."""
    by_owner = select(LEASES.c.lease_until).where(LEASES.c.owner == JOBS.c.owner)
    return func.coalesce(by_owner.scalar_subquery(), JOBS.c.lease_until)


def job_rows() -> Select[Any]:
    """``SELECT`` of job rows whose ``lease_until`` is the lease that holds the job
    (:func:`held_until`)."""
    columns = [c for c in JOBS.c if c.name != "lease_until"]
    return select(*columns, type_coerce(held_until(), UtcDateTime()).label("lease_until"))


def creation_order() -> tuple[ColumnElement[Any], ...]:
    """The order jobs were submitted in."""
    # Jobs submitted at the same instant (a simulated clock) keep their
    # insertion order through the id of their creation event.
    first_event = (
        select(func.min(EVENTS.c.id)).where(EVENTS.c.job_id == JOBS.c.id).scalar_subquery()
    )
    return (JOBS.c.submitted_at, first_event, JOBS.c.id)


def load_job(conn: Connection, job_id: str) -> JobRecord:
    """The job with this id, or :class:`JobNotFound`."""
    row = conn.execute(job_rows().where(JOBS.c.id == job_id)).one_or_none()
    if row is None:
        raise JobNotFound(f"no job {job_id!r}", job_id=job_id)
    return job_record(row)


def job_with_key(conn: Connection, key: str) -> JobRecord | None:
    """The job submitted with idempotency key ``key``, None when there is none."""
    row = conn.execute(job_rows().where(JOBS.c.idempotency_key == key)).one_or_none()
    return None if row is None else job_record(row)


def resolve_ref(conn: Connection, ref: str) -> str:
    """The id that ``ref`` names: an id, a unique id prefix, or a job name."""
    if conn.execute(select(JOBS.c.id).where(JOBS.c.id == ref)).first() is not None:
        return ref
    if ref:
        by_prefix = select(JOBS.c.id).where(JOBS.c.id.startswith(ref, autoescape=True))
        ids = sorted(str(i) for i in conn.execute(by_prefix.limit(11)).scalars())
        if len(ids) == 1:
            return ids[0]
        if ids:
            shown = ", ".join(ids[:10]) + (", ..." if len(ids) > 10 else "")
            raise StoreError(f"job reference {ref!r} is ambiguous: {shown}")
    newest = (
        select(JOBS.c.id)
        .where(JOBS.c.name == ref)
        .order_by(*(c.desc() for c in creation_order()))
        .limit(1)
    )
    found = conn.execute(newest).scalar_one_or_none()
    if found is None:
        raise JobNotFound(f"no job with id, id prefix or name {ref!r}")
    return str(found)


def spec_team(dialect: str) -> ColumnElement[Any]:
    """The ``team`` of the job's stored spec, in SQL (the spec is JSON text)."""
    extracted: ColumnElement[Any]
    if dialect == "postgresql":
        extracted = cast(JOBS.c.spec_json, JSONB)["team"].astext
    else:
        extracted = func.json_extract(JOBS.c.spec_json, "$.team")
    return extracted


# -- the cursor of a page of jobs --------------------------------------------


def make_cursor(last: JobRecord) -> str:
    """The opaque cursor after ``last``: its order key, base64 of JSON."""
    key = json.dumps([last.submitted_at.isoformat(), last.id]).encode()
    return base64.urlsafe_b64encode(key).decode().rstrip("=")


def read_cursor(cursor: str) -> tuple[datetime, str]:
    """The order key a :func:`make_cursor` cursor holds, or :class:`BadCursor`."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, job_id = json.loads(raw)
        when = datetime.fromisoformat(at)
    except (ValueError, TypeError) as exc:
        raise BadCursor(f"not a job listing cursor ({len(cursor)} characters)") from exc
    if when.tzinfo is None or not isinstance(job_id, str):
        raise BadCursor(f"not a job listing cursor ({len(cursor)} characters)")
    return when, job_id


# -- writing jobs ------------------------------------------------------------


def guarded_status_update(conn: Connection, change: Transition, now: datetime) -> None:
    """Move the job to ``change.new`` if it is still in ``change.expected``; else
    :class:`LostTransition` (or :class:`JobNotFound`), having written nothing."""
    guarded = (
        update(JOBS)
        .where(JOBS.c.id == change.job_id, JOBS.c.status == change.expected.value)
        .values(
            status=change.new.value,
            failure=change.failure.value if change.failure is not None else None,
            # Why it failed, as typed facts (those of its event), kept with the job.
            failure_facts=(change.facts.to_json() or None) if change.failure is not None else None,
            updated_at=now,
            version=JOBS.c.version + 1,
            # A job that moves on waits no more for what it waited for.
            **({"waiting": None} if change.new is not change.expected else {}),
        )
    )
    if conn.execute(guarded).rowcount == 1:
        return
    actual = conn.execute(select(JOBS.c.status).where(JOBS.c.id == change.job_id)).scalar()
    if actual is None:
        raise JobNotFound(f"no job {change.job_id!r}", job_id=change.job_id)
    raise LostTransition(
        f"job {change.job_id}: expected {change.expected}, found {actual} "
        f"(wanted {change.expected} -> {change.new})",
        job_id=change.job_id,
    )


def insert_event(
    conn: Connection,
    job_id: str,
    *,
    at: datetime,
    from_status: JobStatus | None,
    to_status: JobStatus,
    cause: EventCause | AttemptEnd,
    detail: str,
    facts: EventFacts = EMPTY_FACTS,
) -> None:
    """Add an event to the job's history, with its facts (SQL null when it has none)."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "at": at,
        "from_status": from_status.value if from_status is not None else None,
        "to_status": to_status.value,
        "cause": str(cause),  # a StrEnum's str is its value
        "detail": detail,
    }
    if stored := facts.to_json():
        values["facts"] = stored
    conn.execute(insert(EVENTS).values(**values))
