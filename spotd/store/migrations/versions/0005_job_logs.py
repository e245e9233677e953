"""Job logs: the nodes' output their agents ship, and how far each node's goes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``log_heads`` and ``log_chunks``, and the index a node's output is read by."""
    op.create_table(
        "log_heads",
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("shipped", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "instance_id", name="pk_log_heads"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_log_heads_job_id_jobs"),
    )
    op.create_table(
        "log_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_log_chunks"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_log_chunks_job_id_jobs"),
    )
    op.create_index("ix_log_chunks_job_id", "log_chunks", ["job_id"])
    op.create_index(
        "ix_log_chunks_node", "log_chunks", ["job_id", "attempt", "instance_id", "start"]
    )


def downgrade() -> None:
    """Drop both tables (their indexes go with them)."""
    op.drop_table("log_chunks")
    op.drop_table("log_heads")
