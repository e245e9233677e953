"""The initial schema: every table of :mod:`spotd.store.tables`.

Revision ID: 0001
Revises:
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _job_fk(table: str) -> sa.ForeignKeyConstraint:
    # Named as tables.py names it, so that a later (batch) migration can refer to it.
    return sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=f"fk_{table}_job_id_jobs")


def upgrade() -> None:
    """Create the tables and the indexes the daemon queries by."""
    _jobs()
    _events_and_attempts()
    _prices_and_reports()
    _billing()
    _coordination()


def downgrade() -> None:
    """Drop every table :func:`upgrade` made (their indexes go with them), children first."""
    for table in (
        "ended_sessions", "published_offerings", "owner_leases", "notifications", "ledger",
        "instance_reports", "prices", "attempts", "events", "jobs",
    ):  # fmt: skip
        op.drop_table(table)


def _jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("failure", sa.String(), nullable=True),
        sa.Column("submitted_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("owner", sa.String(), nullable=True),
        sa.Column("lease_until", _utc(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("waiting", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_name", "jobs", ["name"])
    # A unique index, not a constraint: see tables.JobTable.
    op.create_index("ix_jobs_idempotency_key", "jobs", ["idempotency_key"], unique=True)
    # The listings page on (submitted_at, id), with or without a status filter.
    op.create_index("ix_jobs_submitted_at_id", "jobs", ["submitted_at", "id"])
    op.create_index("ix_jobs_status_submitted_at_id", "jobs", ["status", "submitted_at", "id"])
    # A pass lists its own jobs from this index alone; a claim finds the free ones by
    # owner and lease.
    op.create_index("ix_jobs_owner_status_version", "jobs", ["owner", "status", "id", "version"])
    op.create_index("ix_jobs_owner_lease_until", "jobs", ["owner", "lease_until"])
    op.create_index("ix_jobs_lease_until", "jobs", ["lease_until"])


def _events_and_attempts() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("at", _utc(), nullable=False),
        sa.Column("from_status", sa.String(), nullable=True),
        sa.Column("to_status", sa.String(), nullable=False),
        sa.Column("cause", sa.String(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        _job_fk("events"),
    )
    op.create_index("ix_events_job_id", "events", ["job_id"])

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("market", sa.String(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("price_per_node_hour", sa.Float(), nullable=False),
        sa.Column("client_token", sa.String(), nullable=False),
        sa.Column("instance_ids", sa.Text(), nullable=False),
        sa.Column("resume_from", sa.String(), nullable=True),
        sa.Column("started_at", _utc(), nullable=False),
        sa.Column("running_at", _utc(), nullable=True),
        sa.Column("ended_at", _utc(), nullable=True),
        sa.Column("end_reason", sa.String(), nullable=True),
        sa.Column("work_per_hour", sa.Float(), nullable=True),
        sa.Column("checkpoint_interval_hours", sa.Float(), nullable=True),
        sa.Column("saves_on_notice", sa.Boolean(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_attempts"),
        _job_fk("attempts"),
        sa.UniqueConstraint("job_id", "seq", name="uq_attempts_job_id_seq"),
        sa.UniqueConstraint("client_token", name="uq_attempts_client_token"),
    )
    op.create_index("ix_attempts_job_id", "attempts", ["job_id"])


def _prices_and_reports() -> None:
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("market", sa.String(), nullable=False),
        sa.Column("price", sa.Float(), nullable=False),
        sa.Column("capacity", sa.Float(), nullable=True),
        sa.Column("at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_prices"),
    )
    # Reads are "the history of one pool since T" and "everything since T".
    op.create_index("ix_prices_pool_at", "prices", ["provider", "zone", "instance_type", "at"])
    op.create_index("ix_prices_at", "prices", ["at"])

    op.create_table(
        "instance_reports",
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", _utc(), nullable=True),
        sa.Column("notice_at", _utc(), nullable=True),
        sa.Column("notice_kind", sa.String(), nullable=True),
        sa.Column("notice_deadline", _utc(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("exited_at", _utc(), nullable=True),
        sa.Column("address", sa.String(), nullable=True),
        sa.Column("ports", sa.String(), nullable=True),
        sa.Column("joined_at", _utc(), nullable=True),
        sa.Column("command_at", _utc(), nullable=True),
        sa.Column("exit_phase", sa.String(), nullable=True),
        sa.Column("preflight", sa.Text(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.Column("gpus", sa.Text(), nullable=True),
        sa.Column("gpu_util_sum", sa.Float(), nullable=True),
        sa.Column("gpu_samples", sa.Integer(), nullable=True),
        sa.Column("gpu_low_samples", sa.Integer(), nullable=True),
        sa.Column("exit_detail", sa.Text(), nullable=True),
        # Where the row's last change stands in the reports feed.
        sa.Column("revision", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("instance_id", "provider", name="pk_instance_reports"),
    )
    op.create_index("ix_instance_reports_job_id", "instance_reports", ["job_id"])
    op.create_index("ix_instance_reports_revision", "instance_reports", ["revision"])


def _billing() -> None:
    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("fabric", sa.String(), nullable=False),
        sa.Column("market", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("start", _utc(), nullable=False),
        sa.Column("end", _utc(), nullable=False),
        sa.Column("billed_seconds", sa.Float(), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("on_demand_usd", sa.Float(), nullable=False),
        sa.Column("job_status", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ledger"),
    )
    # Reads are "one job's lines" (rebuild, per-job report) and "lines in a period".
    op.create_index("ix_ledger_job_id", "ledger", ["job_id"])
    op.create_index("ix_ledger_start", "ledger", ["start"])

    op.create_table(
        "notifications",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_notifications"),
    )


def _coordination() -> None:
    op.create_table(
        "owner_leases",
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("lease_until", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("owner"),
    )
    op.create_table(
        "published_offerings",
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("published_at", _utc(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("provider"),
    )
    op.create_table(
        "ended_sessions",
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("until", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("session_id"),
    )
    op.create_index("ix_ended_sessions_until", "ended_sessions", ["until"])
