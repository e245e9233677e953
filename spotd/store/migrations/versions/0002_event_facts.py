"""Event facts: what an event says beside its cause, as typed fields.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the nullable JSON column ``events.facts``: events stored before it have none."""
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("facts", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop ``events.facts`` (the facts go; the causes and details stay)."""
    with op.batch_alter_table("events") as batch:
        batch.drop_column("facts")
