"""The leases part of the SQL store: which daemon holds which job, and for how long.

Each daemon (an *owner*) has one row in ``owner_leases``; the jobs it holds
name it in ``jobs.owner`` and are held as long as that row's lease runs. A
daemon of a version before that table leased each job on its own row
(``jobs.lease_until``); such leases are still honoured.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    func,
    or_,
    select,
    text,
    union,
    update,
)

from spotd.core.states import ACTIVE
from spotd.store.base import SqlBase
from spotd.store.job_sql import held_until
from spotd.store.tables import JOBS, LEASES, conflict_insert

_PG_CLAIM_LOCK = 0x5350_4F54_4401
"""Advisory lock key that serialises the lease claims of daemons sharing a database."""

_ACTIVE = tuple(s.value for s in ACTIVE)

HELD_BY_OWNER = datetime(9999, 1, 1, tzinfo=UTC)
"""``jobs.lease_until`` of a job held by its owner's row in ``owner_leases``: far
enough ahead that a daemon of a version before that table never takes the job."""


class LeaseRows(SqlBase):
    """The job leases of the daemons sharing the SQL database: who holds which active
    job, taken and renewed on every pass (:meth:`claim_job_versions`)."""

    def job_owners(self) -> list[str]:
        """Every daemon owner name that holds or held a job's lease, sorted."""
        query = select(JOBS.c.owner).where(JOBS.c.owner.is_not(None)).distinct()
        with self._read() as conn:
            return sorted(str(o) for o in conn.execute(query).scalars())

    def claim_jobs(
        self, owner: str, *, now: datetime | None = None, lease_seconds: float
    ) -> list[str]:
        """Take or renew the lease of active jobs free or already ours; return their ids
        (sorted): :meth:`claim_job_versions`."""
        return sorted(self.claim_job_versions(owner, now=now, lease_seconds=lease_seconds))

    def claim_job_versions(
        self,
        owner: str,
        *,
        now: datetime | None = None,
        lease_seconds: float,
        share_of: int = 1,
    ) -> dict[str, int]:
        """Renew ``owner``'s lease, take the active jobs that are free, and return every
        active job ``owner`` holds with its version.

        The lease is the owner's row in ``owner_leases``: every job it holds is
        held until then, so a renewal writes one row, however many jobs. A job
        is free when it has no owner, or when its owner's lease ran out (by the
        owner's row, or by the job's own ``lease_until`` for an owner without
        one: a daemon of an older version). On PostgreSQL claims take turns (an
        advisory lock): a renewal writes no job row, so a job's row lock alone
        would not keep another daemon from taking a job whose owner is renewing
        its lease at that moment. The jobs taken are locked in id order, against
        the writes of daemons that renew per job. ``now`` None
        measures the lease on the database's clock (PostgreSQL's ``now()``,
        ``wall`` on SQLite), which every daemon shares however far their
        own clocks drift. ``share_of``: how many daemons share the work; a
        claim takes free jobs (lowest id first) only up to ``owner``'s share of
        all active jobs (rounded up), so a burst of submissions is split between
        the daemons rather than taken whole by the first to pass (``_room_for``).
        """
        current: Any = now
        if current is None:
            current = func.now() if self._postgres else self._wall.now()
        held = select(JOBS.c.id, JOBS.c.version).where(
            JOBS.c.owner == owner, JOBS.c.status.in_(_ACTIVE)
        )
        with self._write() as conn:
            if self._postgres:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_CLAIM_LOCK})
            _renew_owner(conn, owner, current + timedelta(seconds=lease_seconds))
            _take_free_jobs(conn, owner, current, share_of=share_of)
            # fetchall, not a row at a time: tens of thousands of rows on every pass.
            return {str(i): int(v) for i, v in conn.execute(held).all()}

    def renew_lease(self, owner: str, *, lease_seconds: float) -> None:
        """Renew ``owner``'s lease and take no job: a daemon that has just started is
        counted among the daemons sharing the free jobs before its first pass, so a
        peer's first pass does not take a whole backlog (:func:`_room_for`)."""
        with self._write() as conn:
            now: Any = func.now() if self._postgres else self._wall.now()
            _renew_owner(conn, owner, now + timedelta(seconds=lease_seconds))


def _renew_owner(conn: Connection, owner: str, until: Any) -> None:
    stmt = conflict_insert(conn, LEASES).values(owner=owner, lease_until=until)
    conn.execute(stmt.on_conflict_do_update(index_elements=["owner"], set_={"lease_until": until}))


def _take_free_jobs(conn: Connection, owner: str, now: Any, *, share_of: int = 1) -> None:
    """Make ``owner`` the owner of the free active jobs (:meth:`LeaseRows.claim_job_versions`),
    at most ``1 / share_of`` of them (rounded up).

    The candidates are found by index, each kind on its own (an ``OR`` of them
    would read every active job); the ``UPDATE`` checks each again, after
    PostgreSQL has locked it.
    """
    active = JOBS.c.status.in_(_ACTIVE)
    # SQLite, which keeps no statistics, would walk the status index (every active
    # job) where the lease's or the id's finds a few rows: as an expression, the
    # status is checked on the rows those find.
    still_active = (JOBS.c.status + "").in_(_ACTIVE)
    ran_out = select(LEASES.c.owner).where(LEASES.c.lease_until < now, LEASES.c.owner != owner)
    per_job = JOBS.c.owner.not_in(select(LEASES.c.owner))
    unowned_lease = (JOBS.c.lease_until.is_(None), JOBS.c.owner.is_not(None))
    ours = JOBS.c.owner == owner
    # Ours but leased per job (by this owner's older version): held by our row now.
    mine = [
        select(JOBS.c.id).where(ours, JOBS.c.lease_until < HELD_BY_OWNER, still_active),
        select(JOBS.c.id).where(ours, JOBS.c.lease_until.is_(None), still_active),
    ]
    free = [
        select(JOBS.c.id).where(JOBS.c.owner.is_(None), active),
        select(JOBS.c.id).where(JOBS.c.owner.in_(ran_out), active),
        select(JOBS.c.id).where(JOBS.c.lease_until < now, per_job, still_active),
        select(JOBS.c.id).where(*unowned_lease, per_job, still_active),
    ]
    if share_of > 1:
        # Claims take turns (the advisory lock above on PostgreSQL): these counts hold.
        free_ids = union(*free).subquery()
        count = conn.execute(select(func.count()).select_from(free_ids)).scalar_one()
        share = _room_for(conn, owner, now, share_of) if count else 0
        first = select(free_ids.c.id).order_by(free_ids.c.id).limit(share).subquery()
        free = [select(first.c.id)]
    candidates = union(*mine, *free)
    locked = select(JOBS.c.id).where(JOBS.c.id.in_(candidates)).order_by(JOBS.c.id)
    locked = locked.with_for_update()
    take = (
        update(JOBS)
        .where(JOBS.c.id.in_(locked), still_active, _free_for(owner, now))
        .values(owner=owner, lease_until=HELD_BY_OWNER)
    )
    conn.execute(take)


def _room_for(conn: Connection, owner: str, now: Any, share_of: int) -> int:
    """How many free jobs ``owner`` may take: its fair share of every active job, less
    what it holds already.

    The share is of all active jobs, not of the free ones: a share of the free
    ones shrinks with each claim, so a daemon that passes every 100 ms took a
    burst of submissions one share after another before a slower peer (the
    leader, busy with the market) passed once. The daemons counted are those
    alive on the database (``share_of``, by their owner locks) that renewed
    their lease lately: one that holds its lock but no longer passes is left
    out once its lease runs out, so its share, and the jobs it dropped, are
    taken by the others.
    """
    renewing = select(func.count()).where(LEASES.c.lease_until >= now)
    active = select(func.count()).where(JOBS.c.status.in_(_ACTIVE))
    held = select(func.count()).where(JOBS.c.owner == owner, JOBS.c.status.in_(_ACTIVE))
    counts = select(renewing.scalar_subquery(), active.scalar_subquery(), held.scalar_subquery())
    n_renewing, n_active, n_held = (int(n) for n in conn.execute(counts).one())  # one round trip
    peers = max(1, min(share_of, n_renewing))
    return max(0, -(-n_active // peers) - n_held)


def _free_for(owner: str, now: Any) -> ColumnElement[bool]:
    """Whether ``owner`` may take the job: see :meth:`LeaseRows.claim_job_versions`."""
    lease = held_until()
    return or_(
        JOBS.c.owner.is_(None),
        and_(JOBS.c.owner == owner,
             or_(JOBS.c.lease_until.is_(None), JOBS.c.lease_until < HELD_BY_OWNER)),
        and_(JOBS.c.owner != owner, or_(lease.is_(None), lease < now)),
    )  # fmt: skip
