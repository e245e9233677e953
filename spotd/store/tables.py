"""The store's tables as SQLModel classes.

These classes describe the schema for the code (and for ``alembic
revision --autogenerate``); the schema in a database is only ever made by
the migrations in :mod:`spotd.store.migrations`. Statuses, causes and
markets are plain strings so adding an enum member needs no migration.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Connection,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    LargeBinary,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from spotd.core.errors import StoreError


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware datetime that always comes back as aware UTC.

    SQLite keeps no offset, so values are written as naive UTC there and
    given their UTC zone back on read; PostgreSQL returns them in the session
    time zone, which is converted to UTC. Naive input is refused because the
    store cannot know which zone it meant.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise StoreError(f"naive datetime {value.isoformat()} given to the store")
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise StoreError(f"expected a datetime from the database, got {value!r}")
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _job_fk(table: str) -> ForeignKey:
    # Named so that later (batch) migrations on SQLite can refer to it.
    return ForeignKey("jobs.id", name=f"fk_{table}_job_id_jobs")


class JobTable(SQLModel, table=True):
    """One submitted job and its current status; ``version`` counts changes."""

    __tablename__ = "jobs"
    __table_args__ = (
        # The listings page on (submitted_at, id), with or without a status filter.
        Index("ix_jobs_submitted_at_id", "submitted_at", "id"),
        Index("ix_jobs_status_submitted_at_id", "status", "submitted_at", "id"),
        # A unique index, not a constraint: SQLite adds an index in place, where a
        # constraint would copy the table (and trip the foreign keys on it).
        Index("ix_jobs_idempotency_key", "idempotency_key", unique=True),
        # A pass lists its daemon's jobs (from the index alone: it holds what the
        # listing reads), and a claim finds the free ones, by owner and lease: without
        # these both read every active job's row.
        Index("ix_jobs_owner_status_version", "owner", "status", "id", "version"),
        Index("ix_jobs_owner_lease_until", "owner", "lease_until"),
        Index("ix_jobs_lease_until", "lease_until"),
    )

    id: str = Field(primary_key=True)
    name: str = Field(index=True)
    spec_json: str = Field(sa_type=Text)
    status: str = Field(index=True)
    failure: str | None = None
    submitted_at: datetime = Field(sa_type=UtcDateTime)
    updated_at: datetime = Field(sa_type=UtcDateTime)
    owner: str | None = None
    lease_until: datetime | None = Field(default=None, sa_type=UtcDateTime)
    """A lease per job, as daemons without ``owner_leases`` renew it. Jobs taken since are
    held by their owner's row in ``owner_leases`` and carry ``HELD_BY_OWNER`` here."""
    version: int = 0
    idempotency_key: str | None = None
    """The submitter's ``Idempotency-Key``: a retried submit finds its job by it."""
    waiting: str | None = Field(default=None, sa_type=Text)
    """Why the engine places the pending or recovering job nowhere yet; null once placed."""
    failure_facts: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    """A failed job's :class:`~spotd.core.values.EventFacts`: those of the event that
    failed it, as a JSON object; null for any other job (and one failed before)."""


class EventRow(SQLModel, table=True):
    """One applied change of status (or the job's creation, from None)."""

    __tablename__ = "events"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(sa_column_args=[_job_fk("events")], index=True)
    at: datetime = Field(sa_type=UtcDateTime)
    from_status: str | None = None
    to_status: str
    cause: str
    detail: str = Field(default="", sa_type=Text)
    facts: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    """The event's :class:`~spotd.core.values.EventFacts` as a JSON object; null when it
    has none (and on events stored before spotd kept them)."""


class AttemptRow(SQLModel, table=True):
    """One placement of a job; ``instance_ids`` is a JSON list of strings."""

    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "seq", name="uq_attempts_job_id_seq"),
        UniqueConstraint("client_token", name="uq_attempts_client_token"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(sa_column_args=[_job_fk("attempts")], index=True)
    seq: int
    provider: str
    region: str
    zone: str
    instance_type: str
    market: str
    nodes: int
    price_per_node_hour: float
    client_token: str
    instance_ids: str = Field(default="[]", sa_type=Text)
    resume_from: str | None = None
    started_at: datetime = Field(sa_type=UtcDateTime)
    running_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    ended_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    end_reason: str | None = None
    work_per_hour: float | None = None
    checkpoint_interval_hours: float | None = None
    saves_on_notice: bool | None = None
    exit_code: int | None = None
    """The job command's exit code that ended the attempt (its first failing node's)."""
    held_until: datetime | None = Field(default=None, sa_type=UtcDateTime, index=True)
    """While the closed attempt's nodes are kept for inspection: when the hold runs out;
    null otherwise, so the index holds the holds in force only (read every pass)."""
    released_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    """When the nodes a hold kept were stopped."""
    before_retry: bool = False
    """The attempt came before the job's latest retry: the [retry] bounds skip it."""


class PriceRow(SQLModel, table=True):
    """One polled price of one pool and market, kept as history."""

    __tablename__ = "prices"
    __table_args__ = (
        Index("ix_prices_pool_at", "provider", "zone", "instance_type", "at"),
        Index("ix_prices_at", "at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    provider: str
    region: str
    zone: str
    instance_type: str
    market: str
    price: float
    capacity: float | None = None
    at: datetime = Field(sa_type=UtcDateTime)


class OwnerLeaseRow(SQLModel, table=True):
    """A daemon's lease on every job it owns: one row renewed per pass, not one per job."""

    __tablename__ = "owner_leases"

    owner: str = Field(primary_key=True)
    lease_until: datetime = Field(sa_type=UtcDateTime)


class InstanceReportRow(SQLModel, table=True):
    """What the on-VM agent of one instance last told the daemon."""

    __tablename__ = "instance_reports"
    __table_args__ = (Index("ix_instance_reports_revision", "revision"),)

    instance_id: str = Field(primary_key=True)
    provider: str = Field(primary_key=True)
    job_id: str = Field(index=True)
    attempt: int
    heartbeat_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    notice_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    notice_kind: str | None = None
    notice_deadline: datetime | None = Field(default=None, sa_type=UtcDateTime)
    exit_code: int | None = None
    exited_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    address: str | None = None
    ports: str | None = None
    joined_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    command_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    exit_phase: str | None = None
    exit_detail: str | None = Field(default=None, sa_type=Text)
    oom_kills: int | None = None
    """Processes the kernel's OOM killer killed while the job's command ran (the agent's
    count); null where it could not tell."""
    preflight: str | None = Field(default=None, sa_type=Text)
    step: int | None = None
    total_steps: int | None = None
    checkpoint: str | None = Field(default=None, sa_type=Text)
    gpus: str | None = Field(default=None, sa_type=Text)
    gpu_util_sum: float | None = None
    gpu_samples: int | None = None
    gpu_low_samples: int | None = None
    ranks: str | None = Field(default=None, sa_type=Text)
    """The job's ranks on the node at the last heartbeat, as JSON (spotd.core.ranks)."""
    progress_key: str | None = None
    progress_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    """When (the daemon's clock) ``progress_key`` last changed."""
    heard_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    """When (the daemon's clock) the last heartbeat with a ``progress_key`` came."""
    revision: int = Field(default=0, sa_type=BigInteger)
    """Where the row's last change stands in the store's report feed
    (:func:`spotd.store.history.report_changes`): readers ask for what changed since."""


class PublishedOfferingsRow(SQLModel, table=True):
    """The leader's last good price poll of one provider, for the other daemons to read."""

    __tablename__ = "published_offerings"

    provider: str = Field(primary_key=True)
    published_at: datetime = Field(sa_type=UtcDateTime)
    count: int
    payload: bytes = Field(sa_type=LargeBinary)
    """The offerings as zlib-compressed JSON (see :mod:`spotd.store.board`)."""


class EndedSessionRow(SQLModel, table=True):
    """A dashboard session its user logged out of, refused until its cookie expires."""

    __tablename__ = "ended_sessions"

    session_id: str = Field(primary_key=True)
    until: datetime = Field(sa_type=UtcDateTime, index=True)
    """When the session's cookie expires anyway: the row is of no use after it."""


def conflict_insert(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into ``table`` in the connection's dialect, for its ON CONFLICT clause:
    PostgreSQL and SQLite both have one, with the same API in SQLAlchemy."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def _table(name: str) -> Table:
    return SQLModel.metadata.tables[name]


JOBS = _table("jobs")
"""Core view of :class:`JobTable`, for guarded UPDATEs and plain SELECTs."""
EVENTS = _table("events")
"""Core view of :class:`EventRow`."""
ATTEMPTS = _table("attempts")
"""Core view of :class:`AttemptRow`."""
PRICES = _table("prices")
"""Core view of :class:`PriceRow`."""
REPORTS = _table("instance_reports")
"""Core view of :class:`InstanceReportRow`."""
LEASES = _table("owner_leases")
"""Core view of :class:`OwnerLeaseRow`."""
PUBLISHED = _table("published_offerings")
"""Core view of :class:`PublishedOfferingsRow`."""
ENDED_SESSIONS = _table("ended_sessions")
"""Core view of :class:`EndedSessionRow`."""


class LedgerRow(SQLModel, table=True):
    """One billed line of the cost ledger (see :mod:`spotd.billing.ledger`); rebuilt per job."""

    __tablename__ = "ledger"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    attempt: int
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpus: int
    nodes: int
    fabric: str
    market: str
    kind: str
    start: datetime = Field(sa_type=UtcDateTime, index=True)
    end: datetime = Field(sa_type=UtcDateTime)
    billed_seconds: float
    usd: float
    on_demand_usd: float
    job_status: str


class NotificationRow(SQLModel, table=True):
    """A notification already sent (or being sent), by its dedup key."""

    __tablename__ = "notifications"

    key: str = Field(primary_key=True, sa_type=Text)
    at: datetime = Field(sa_type=UtcDateTime)


class IntentRow(SQLModel, table=True):
    """What a user asked of a job, for the loop to act on (:mod:`spotd.core.intents`)."""

    __tablename__ = "intents"
    __table_args__ = (
        # Each pass reads the open intents: from this index, not the whole table.
        Index("ix_intents_settled_at_job_id", "settled_at", "job_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(sa_column_args=[_job_fk("intents")], index=True)
    kind: str
    requested_at: datetime = Field(sa_type=UtcDateTime)
    priority: int | None = None
    node: int | None = None
    """The rank of the node a drill is asked for (``drill`` intents only)."""
    settled_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    outcome: str | None = None


LEDGER = _table("ledger")
"""Core view of :class:`LedgerRow`."""
NOTIFICATIONS = _table("notifications")
"""Core view of :class:`NotificationRow`."""
INTENTS = _table("intents")
"""Core view of :class:`IntentRow`."""


class LogHeadRow(SQLModel, table=True):
    """How much of one node's output its agent shipped (:mod:`spotd.store.joblogs`): the
    offset the next chunk must start at, kept when the oldest bytes are trimmed."""

    __tablename__ = "log_heads"

    job_id: str = Field(primary_key=True, sa_column_args=[_job_fk("log_heads")])
    attempt: int = Field(primary_key=True)
    instance_id: str = Field(primary_key=True)
    shipped: int = Field(sa_type=BigInteger)


class LogChunkRow(SQLModel, table=True):
    """Bytes ``[start, start + size)`` of one node's shipped output; a job keeps its
    newest ones, up to ``[agent] log_keep_bytes`` in all."""

    __tablename__ = "log_chunks"
    __table_args__ = (
        # A node's output is read in order, from some offset on.
        Index("ix_log_chunks_node", "job_id", "attempt", "instance_id", "start"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(sa_column_args=[_job_fk("log_chunks")], index=True)
    attempt: int
    instance_id: str
    start: int = Field(sa_type=BigInteger)
    size: int
    data: bytes = Field(sa_type=LargeBinary)


LOG_HEADS = _table("log_heads")
"""Core view of :class:`LogHeadRow`."""
LOG_CHUNKS = _table("log_chunks")
"""Core view of :class:`LogChunkRow`."""
