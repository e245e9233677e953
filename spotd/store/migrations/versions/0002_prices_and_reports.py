"""Price history and the on-VM agents' reports.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create ``prices`` and ``instance_reports``."""
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("market", sa.String(), nullable=False),
        sa.Column("price", sa.Float(), nullable=False),
        sa.Column("capacity", sa.Float(), nullable=True),
        sa.Column("at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_prices"),
    )
    # Reads are "the history of one pool since T" and "everything since T".
    op.create_index("ix_prices_pool_at", "prices", ["provider", "zone", "instance_type", "at"])
    op.create_index("ix_prices_at", "prices", ["at"])

    op.create_table(
        "instance_reports",
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", _utc(), nullable=True),
        sa.Column("notice_at", _utc(), nullable=True),
        sa.Column("notice_kind", sa.String(), nullable=True),
        sa.Column("notice_deadline", _utc(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("exited_at", _utc(), nullable=True),
        sa.PrimaryKeyConstraint("instance_id", "provider", name="pk_instance_reports"),
    )
    op.create_index("ix_instance_reports_job_id", "instance_reports", ["job_id"])


def downgrade() -> None:
    """Drop both tables."""
    op.drop_index("ix_instance_reports_job_id", table_name="instance_reports")
    op.drop_table("instance_reports")
    op.drop_index("ix_prices_at", table_name="prices")
    op.drop_index("ix_prices_pool_at", table_name="prices")
    op.drop_table("prices")
