"""Intents: what users asked of jobs, for the reconcile loop to act on.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``intents`` and the indexes a pass and a job's page read it by."""
    op.create_table(
        "intents",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_intents"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_intents_job_id_jobs"),
    )
    op.create_index("ix_intents_job_id", "intents", ["job_id"])
    # Each pass reads the open intents (settled_at null) from this index.
    op.create_index("ix_intents_settled_at_job_id", "intents", ["settled_at", "job_id"])


def downgrade() -> None:
    """Drop ``intents`` (its indexes go with it)."""
    op.drop_table("intents")
