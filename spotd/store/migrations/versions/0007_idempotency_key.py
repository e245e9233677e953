"""A submit's idempotency key on its job, and the indexes the paged listings read.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

``jobs.idempotency_key``: nullable, with a unique index (NULLs are distinct on
both SQLite and PostgreSQL, so jobs submitted without a key do not collide). Two indexes
on ``(submitted_at, id)`` and ``(status, submitted_at, id)``: the keyset order
of ``GET /v1/jobs``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the column, its unique index and the listing indexes."""
    # In place, not a batch copy: other tables' foreign keys point at ``jobs``.
    op.add_column("jobs", sa.Column("idempotency_key", sa.String(), nullable=True))
    op.create_index("ix_jobs_idempotency_key", "jobs", ["idempotency_key"], unique=True)
    op.create_index("ix_jobs_submitted_at_id", "jobs", ["submitted_at", "id"])
    op.create_index("ix_jobs_status_submitted_at_id", "jobs", ["status", "submitted_at", "id"])


def downgrade() -> None:
    """Drop them again."""
    op.drop_index("ix_jobs_status_submitted_at_id", table_name="jobs")
    op.drop_index("ix_jobs_submitted_at_id", table_name="jobs")
    op.drop_index("ix_jobs_idempotency_key", table_name="jobs")
    op.drop_column("jobs", "idempotency_key")  # SQLite 3.35+ drops a column in place
