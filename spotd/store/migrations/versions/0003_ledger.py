"""The cost ledger and the sent-notification keys.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create ``ledger`` and ``notifications``."""
    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("fabric", sa.String(), nullable=False),
        sa.Column("market", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("start", _utc(), nullable=False),
        sa.Column("end", _utc(), nullable=False),
        sa.Column("billed_seconds", sa.Float(), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("on_demand_usd", sa.Float(), nullable=False),
        sa.Column("job_status", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ledger"),
    )
    # Reads are "one job's lines" (rebuild, per-job report) and "lines in a period".
    op.create_index("ix_ledger_job_id", "ledger", ["job_id"])
    op.create_index("ix_ledger_start", "ledger", ["start"])

    op.create_table(
        "notifications",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_notifications"),
    )


def downgrade() -> None:
    """Drop both tables."""
    op.drop_table("notifications")
    op.drop_index("ix_ledger_start", table_name="ledger")
    op.drop_index("ix_ledger_job_id", table_name="ledger")
    op.drop_table("ledger")
