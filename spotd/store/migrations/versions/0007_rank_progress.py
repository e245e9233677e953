"""Rank progress: each node's ranks at its last heartbeat, and when its progress moved.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
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
    """Add the nullable ``instance_reports.ranks``, ``progress_key``, ``progress_at`` and
    ``heard_at``: reports stored before have none, and their jobs are not watched for
    hangs until their next heartbeat."""
    # ALTER TABLE ... ADD COLUMN, not a batch: a batch would copy the table.
    op.add_column("instance_reports", sa.Column("ranks", sa.Text(), nullable=True))
    op.add_column("instance_reports", sa.Column("progress_key", sa.String(), nullable=True))
    op.add_column(
        "instance_reports", sa.Column("progress_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "instance_reports", sa.Column("heard_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    """Drop the four columns."""
    op.drop_column("instance_reports", "heard_at")
    op.drop_column("instance_reports", "progress_at")
    op.drop_column("instance_reports", "progress_key")
    op.drop_column("instance_reports", "ranks")
