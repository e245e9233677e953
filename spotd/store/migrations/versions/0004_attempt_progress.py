"""What each attempt does per running hour, for the daemon's count of progress.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Three nullable columns on ``attempts``, fixed when an attempt is placed
(:mod:`spotd.core.progress`). Rows written before this revision keep NULL there,
which reads as the old count: an hour is an hour, the default checkpoint
interval, no notice saves the work.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("work_per_hour", "checkpoint_interval_hours", "saves_on_notice")


def upgrade() -> None:
    """Add the three columns to ``attempts``."""
    # Batch mode: SQLite alters a table by copying it, PostgreSQL in place.
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("work_per_hour", sa.Float(), nullable=True))
        batch.add_column(sa.Column("checkpoint_interval_hours", sa.Float(), nullable=True))
        batch.add_column(sa.Column("saves_on_notice", sa.Boolean(), nullable=True))


def downgrade() -> None:
    """Drop them again."""
    with op.batch_alter_table("attempts") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
