"""What an agent said of an exit before the job's command: a failed setup's output tail.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

One nullable text column on ``instance_reports``.
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
    """Add ``exit_detail``."""
    with op.batch_alter_table("instance_reports") as batch:
        batch.add_column(sa.Column("exit_detail", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop it again."""
    with op.batch_alter_table("instance_reports") as batch:
        batch.drop_column("exit_detail")
