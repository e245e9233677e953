"""What the agents of a gang report: addresses, preflight figures, progress, GPUs.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Nullable columns on ``instance_reports``: the node's address and free ports
when it joined its gang, when the job's command started, which phase an exit
ended (command, rendezvous or preflight), the gang's preflight figures
(JSON), the step and last complete checkpoint the job reported, the latest
GPU readings (JSON), and running sums of GPU utilisation samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS: tuple[tuple[str, sa.types.TypeEngine[Any]], ...] = (
    ("address", sa.String()),
    ("ports", sa.String()),
    ("joined_at", sa.DateTime(timezone=True)),
    ("command_at", sa.DateTime(timezone=True)),
    ("exit_phase", sa.String()),
    ("preflight", sa.Text()),
    ("step", sa.Integer()),
    ("total_steps", sa.Integer()),
    ("checkpoint", sa.Text()),
    ("gpus", sa.Text()),
    ("gpu_util_sum", sa.Float()),
    ("gpu_samples", sa.Integer()),
    ("gpu_low_samples", sa.Integer()),
)


def upgrade() -> None:
    """Add the columns to ``instance_reports``."""
    with op.batch_alter_table("instance_reports") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    """Drop them again."""
    with op.batch_alter_table("instance_reports") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
