"""Failure facts: why a failed job failed, and the OOM killer's count of a node.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the nullable ``jobs.failure_facts`` (JSON) and ``instance_reports.oom_kills``:
    jobs that failed before, and reports stored before, have none."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("failure_facts", sa.JSON(), nullable=True))
    with op.batch_alter_table("instance_reports") as batch:
        batch.add_column(sa.Column("oom_kills", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop both columns (the jobs' failures and the events' facts stay)."""
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 on), not a batch: a batch would copy
    # ``jobs``, which the other tables' foreign keys point at.
    op.drop_column("instance_reports", "oom_kills")
    op.drop_column("jobs", "failure_facts")
