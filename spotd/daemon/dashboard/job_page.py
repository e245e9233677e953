"""A job's page: its view (attempts, progress, preflights), events, log tail, checkpoints."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from spotd import checkpoints
from spotd.core.clock import clock_note
from spotd.core.errors import CheckpointError
from spotd.core.states import JobStatus
from spotd.core.values import AttemptRecord, EventRecord, JobRecord
from spotd.daemon.dashboard.jobs import Money, money_of
from spotd.daemon.joblogs import attempt_logs, tail
from spotd.daemon.reader import Reader
from spotd.daemon.views import EventView, JobView, event_view, job_view
from spotd.engine.settings import checkpoint_uri

LOG_LINES = 40
"""Lines of each node's output the page shows (``spotd logs`` prints the rest)."""
CHECKPOINTS_SHOWN = 10
"""The newest complete checkpoints listed."""
EVENTS_SHOWN = 40
"""The newest events listed (``spotd events`` prints them all)."""


@dataclass(frozen=True)
class NodeLog:
    """The tail of one node's output."""

    header: str
    text: str


@dataclass(frozen=True)
class JobDetail:
    """Everything the job's page shows."""

    job: JobRecord
    view: JobView
    money: Money
    events: list[EventView]
    """The newest :data:`EVENTS_SHOWN` events, newest first."""
    event_count: int
    logs: list[NodeLog]
    checkpoint_uri: str
    checkpoints: list[checkpoints.CheckpointInfo]
    checkpoint_error: str | None
    notices: dict[int, list[datetime]] = field(default_factory=dict)
    now: datetime | None = None


def job_detail(reader: Reader, job: JobRecord) -> JobDetail:
    """The page of ``job`` as it stands now."""
    store = reader.store
    attempts = store.attempts(job.id)
    reports = store.reports(job.id)
    ledger = store.ledger(job_id=job.id)
    events = store.events(job.id)
    now = reader.clock.now()
    clock = clock_note(reader.clock)
    view = job_view(job, attempts, now, reports, ledger=ledger, zone=reader.zone, clock=clock,
                    forecast=reader.planner.forecast(job))  # fmt: skip
    uri = checkpoint_uri(job, reader.settings)
    found, error = _checkpoints(uri)
    logs = [NodeLog(h, tail(t, LOG_LINES)) for h, t in attempt_logs(reader, attempts[-1:])]
    return JobDetail(
        job=job,
        view=view,
        money=money_of(reader, job, attempts, ledger, now),
        events=[event_view(e, clock) for e in events[::-1][:EVENTS_SHOWN]],
        event_count=len(events),
        logs=logs,
        checkpoint_uri=uri,
        checkpoints=found[-CHECKPOINTS_SHOWN:][::-1],
        checkpoint_error=error,
        notices=notices_by_attempt(attempts, events),
        now=now,
    )


def notices_by_attempt(
    attempts: Sequence[AttemptRecord], events: Sequence[EventRecord]
) -> dict[int, list[datetime]]:
    """When each attempt got a preemption notice, by attempt seq: its moves to
    ``checkpointing``, on the engine's clock (an agent's own report of the notice is on
    its node's clock, which on the simulated market is not the daemon's)."""
    found: dict[int, list[datetime]] = defaultdict(list)
    notices = [e.at for e in events if e.to_status is JobStatus.CHECKPOINTING]
    for a in attempts:
        end = a.ended_at
        found[a.seq] = [t for t in notices if a.started_at <= t and (end is None or t <= end)]
    return {seq: times for seq, times in found.items() if times}


def _checkpoints(uri: str) -> tuple[list[checkpoints.CheckpointInfo], str | None]:
    try:
        return checkpoints.list_complete(uri), None
    except CheckpointError as exc:
        return [], str(exc)
