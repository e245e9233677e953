"""Holds and retries: a failed attempt's nodes kept for inspection, and the attempts a
retry of their job leaves out of its [retry] bounds.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``attempts.held_until`` (indexed: each pass reads the holds in force by it),
    ``attempts.released_at`` and ``attempts.before_retry`` (false for every attempt
    stored before: no job was retried)."""
    # ALTER TABLE ... ADD COLUMN, not a batch: a batch would copy ``attempts``.
    op.add_column("attempts", sa.Column("held_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("attempts", sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "attempts",
        sa.Column("before_retry", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_attempts_held_until", "attempts", ["held_until"])


def downgrade() -> None:
    """Drop the index and the three columns."""
    op.drop_index("ix_attempts_held_until", table_name="attempts")
    op.drop_column("attempts", "before_retry")
    op.drop_column("attempts", "released_at")
    op.drop_column("attempts", "held_until")
