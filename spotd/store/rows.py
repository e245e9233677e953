"""Rows to records: how every reader of the store (:mod:`spotd.store.sql`, the
metrics' and the webhooks' queries) turns a row of its tables into the values
the rest of spotd uses."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from sqlalchemy import Row

from spotd.core.errors import StoreError
from spotd.core.spec import JobSpec
from spotd.core.spec_io import spec_from_json
from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import (
    EMPTY_FACTS,
    AttemptEnd,
    AttemptRecord,
    EventFacts,
    EventRecord,
    JobRecord,
    Market,
    Pool,
    event_cause,
)


def chunks(items: list[str], size: int = 2000) -> list[list[str]]:
    """``items`` in slices for ``IN (...)``: SQLite caps the bound parameters of one
    statement; stay well under."""
    return [items[i : i + size] for i in range(0, len(items), size)]


@lru_cache(maxsize=4096)
def parsed_spec(text: str) -> JobSpec:
    """The job spec stored as ``text`` (cached: a stored spec never changes)."""
    # A job's spec never changes: validating the same JSON again would cost more
    # than reading it. Small, since a parsed spec weighs about 8 KB and the engine
    # keeps the records it steps between passes itself (32,768 here were 275 MB of
    # a daemon holding 50,000 jobs, and thrashed anyway, listed in the same order).
    return spec_from_json(text)


def job_record(row: Row[Any]) -> JobRecord:
    """A ``jobs`` row as its record."""
    return JobRecord(
        id=row.id,
        name=row.name,
        spec=parsed_spec(row.spec_json),
        status=JobStatus(row.status),
        failure=FailureCause(row.failure) if row.failure is not None else None,
        submitted_at=row.submitted_at,
        updated_at=row.updated_at,
        owner=row.owner,
        lease_until=row.lease_until,
        version=row.version,
        waiting=row.waiting,
        failure_facts=_failure_facts(row),
    )


def _failure_facts(row: Row[Any]) -> EventFacts:
    """A failed job's facts; none for facts this spotd cannot read (a newer one's): the
    job reads all the same, its ``failure`` says why it failed."""
    try:
        return EventFacts.from_json(row.failure_facts)
    except ValueError:
        return EMPTY_FACTS


def event_record(row: Row[Any]) -> EventRecord:
    """An ``events`` row as its record. Raises :class:`~spotd.core.errors.StoreError` for
    a cause this spotd does not know (a newer one wrote it) or facts it cannot read."""
    try:
        cause = event_cause(row.cause)
        facts = EventFacts.from_json(row.facts)
    except ValueError as exc:
        raise StoreError(
            f"event {row.id} of job {row.job_id}: {exc} (written by a newer spotd?)",
            job_id=row.job_id,
        ) from exc
    return EventRecord(
        id=row.id,
        job_id=row.job_id,
        at=row.at,
        from_status=JobStatus(row.from_status) if row.from_status is not None else None,
        to_status=JobStatus(row.to_status),
        cause=cause,
        detail=row.detail,
        facts=facts,
    )


def attempt_record(row: Row[Any]) -> AttemptRecord:
    """An ``attempts`` row as its record."""
    return AttemptRecord(
        id=row.id,
        job_id=row.job_id,
        seq=row.seq,
        pool=Pool(row.provider, row.region, row.zone, row.instance_type),
        market=Market(row.market),
        nodes=row.nodes,
        price_per_node_hour=row.price_per_node_hour,
        client_token=row.client_token,
        instance_ids=tuple(json.loads(row.instance_ids)),
        resume_from=row.resume_from,
        started_at=row.started_at,
        running_at=row.running_at,
        ended_at=row.ended_at,
        end_reason=AttemptEnd(row.end_reason) if row.end_reason is not None else None,
        work_per_hour=row.work_per_hour,
        checkpoint_interval_hours=row.checkpoint_interval_hours,
        saves_on_notice=row.saves_on_notice,
        exit_code=row.exit_code,
        held_until=row.held_until,
        released_at=row.released_at,
        before_retry=bool(row.before_retry),
    )
