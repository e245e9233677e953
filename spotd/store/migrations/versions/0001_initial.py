"""Initial schema: jobs, events, attempts.

Revision ID: 0001
Revises:
Create Date: 2024-11-29
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


def upgrade() -> None:
    """Create the three tables and the indexes the daemon queries by."""
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
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_name", "jobs", ["name"])

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
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_events_job_id_jobs"),
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
        sa.PrimaryKeyConstraint("id", name="pk_attempts"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_attempts_job_id_jobs"),
        sa.UniqueConstraint("job_id", "seq", name="uq_attempts_job_id_seq"),
        sa.UniqueConstraint("client_token", name="uq_attempts_client_token"),
    )
    op.create_index("ix_attempts_job_id", "attempts", ["job_id"])


def downgrade() -> None:
    """Drop everything :func:`upgrade` made, children first."""
    op.drop_index("ix_attempts_job_id", table_name="attempts")
    op.drop_table("attempts")
    op.drop_index("ix_events_job_id", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_jobs_name", table_name="jobs")
    op.drop_index("ix_jobs_status", table_name="jobs")
    op.drop_table("jobs")
