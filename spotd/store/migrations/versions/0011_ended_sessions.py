"""The dashboard's logged-out sessions.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

``ended_sessions``: one row per dashboard session its user logged out of
(``session_id``, the random id in the signed cookie), kept ``until`` the cookie
expires, so a copy of the cookie is refused by every daemon on the database
(:mod:`spotd.store.sessions`). Sessions from before have no id: their cookies
are refused, and their users log in again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create the table."""
    op.create_table(
        "ended_sessions",
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id"),
    )
    op.create_index("ix_ended_sessions_until", "ended_sessions", ["until"])


def downgrade() -> None:
    """Drop it."""
    op.drop_index("ix_ended_sessions_until", table_name="ended_sessions")
    op.drop_table("ended_sessions")
