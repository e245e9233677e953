"""A lease per daemon instead of per job, and a feed of the agents' reports.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

``owner_leases``: one row per daemon owner name, renewed on every pass. A job
taken from now on is held for as long as its owner's row is (its own
``lease_until`` says ``HELD_BY_OWNER``, far in the future, so a daemon of an
older version beside this one never takes it over); a job whose owner has no
row is still held by its own ``lease_until``, as older daemons renew it. A
pass then writes one row, not one per job it holds.

``instance_reports.revision`` (indexed): where each row's last change stands,
so a pass reads only the reports that changed since the last one. Rows from
before read as revision 0, which a first read takes in.

Three indexes on ``jobs``: ``owner, status, id, version`` (the pass's listing
of its own jobs, read from the index alone), ``owner, lease_until`` and
``lease_until`` (the claim's search for free jobs); without them both read
every active job's row.

The downgrade gives every job its owner's lease back before it drops the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the table, the column and the indexes."""
    op.create_table(
        "owner_leases",
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("owner"),
    )
    # In place, not a batch copy: nothing refers to instance_reports, but a copy of
    # a large table would hold the database for as long as it takes.
    op.add_column(
        "instance_reports",
        sa.Column("revision", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.create_index("ix_instance_reports_revision", "instance_reports", ["revision"])
    op.create_index("ix_jobs_owner_status_version", "jobs", ["owner", "status", "id", "version"])
    op.create_index("ix_jobs_owner_lease_until", "jobs", ["owner", "lease_until"])
    op.create_index("ix_jobs_lease_until", "jobs", ["lease_until"])


def downgrade() -> None:
    """Put the owners' leases back on their jobs, then drop what upgrade added."""
    op.execute(
        "UPDATE jobs SET lease_until = (SELECT l.lease_until FROM owner_leases l"
        " WHERE l.owner = jobs.owner)"
        " WHERE owner IN (SELECT owner FROM owner_leases)"
    )
    op.drop_index("ix_jobs_lease_until", table_name="jobs")
    op.drop_index("ix_jobs_owner_lease_until", table_name="jobs")
    op.drop_index("ix_jobs_owner_status_version", table_name="jobs")
    op.drop_index("ix_instance_reports_revision", table_name="instance_reports")
    op.drop_column("instance_reports", "revision")  # SQLite 3.35+ drops a column in place
    op.drop_table("owner_leases")
