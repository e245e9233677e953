"""Drills: the node a ``drill`` intent names, by its rank.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the nullable ``intents.node``: intents stored before are no drills."""
    # ALTER TABLE ... ADD COLUMN, not a batch: a batch would copy the table.
    op.add_column("intents", sa.Column("node", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    op.drop_column("intents", "node")
