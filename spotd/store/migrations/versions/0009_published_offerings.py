"""The leader's price polls, published for the other daemons.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

``published_offerings``: one row per provider, replaced by the leading daemon
after each good poll. The other daemons on the database read it instead of
asking the cloud's price and capacity APIs themselves (see
:mod:`spotd.store.board`).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the table."""
    op.create_table(
        "published_offerings",
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("provider"),
    )


def downgrade() -> None:
    """Drop it."""
    op.drop_table("published_offerings")
