"""Why a job waits, on the job.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

``jobs.waiting``: nullable text, the sentence the engine last wrote for a
pending or recovering job that it placed nowhere (``spotd status`` shows it),
cleared by the job's next change of status. Rows from before read as null: a
waiting job gets its reason on the engine's next pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the column."""
    # In place, not a batch copy: other tables' foreign keys point at ``jobs``.
    op.add_column("jobs", sa.Column("waiting", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop it."""
    op.drop_column("jobs", "waiting")  # SQLite 3.35+ drops a column in place
