"""The one builder of a policy's context: what a policy may know of a job when it places it.

The engine, ``spotd plan`` (of a job file or of a submitted job), ``spotd demo``
and the simulator all build the :class:`~spotd.core.values.PlacementContext` here,
so a plan shows what the daemon would do: the cooldowns of pools that failed
or preempted the job, where it runs now, and how much of it is done.

Pure: everything comes in as arguments (the job's attempt records and agent
reports, the pools offered, the scheduling settings, the pool statistics, the
spend). A caller without attempts (a job file not submitted yet, the demo's
on-demand comparison) passes none: not running, nothing done, nothing cooling
down. A caller that follows the job itself rather than through attempt records
(the simulator) passes its :class:`JobPosition`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from spotd.core.progress import job_done_hours, reported_steps
from spotd.core.spec import JobSpec
from spotd.core.values import (
    AttemptRecord,
    InstanceReport,
    Market,
    PlacementContext,
    Pool,
    PoolStats,
)
from spotd.engine.attempts import cooldowns, open_attempt


@dataclass(frozen=True, slots=True)
class JobPosition:
    """Where a job runs now (``current`` None when it does not) and how much of its
    ``deadline.compute_hours`` is behind it."""

    current: Pool | None = None
    current_market: Market | None = None
    done_hours: float = 0.0


def position_of(
    spec: JobSpec,
    attempts: Sequence[AttemptRecord],
    reports: Sequence[InstanceReport],
    now: datetime,
) -> JobPosition:
    """What the attempts (and the agents' step counts) say of where the job is.

    A job runs where its open attempt has started running; one still booting
    runs nowhere yet.
    """
    running = open_attempt(attempts)
    if running is not None and running.running_at is None:
        running = None
    return JobPosition(
        current=running.pool if running else None,
        current_market=running.market if running else None,
        done_hours=job_done_hours(spec, attempts, reported_steps(reports), now),
    )


def placement_context(
    job_id: str,
    spec: JobSpec,
    now: datetime,
    *,
    attempts: Sequence[AttemptRecord] = (),
    reports: Sequence[InstanceReport] = (),
    pools: Iterable[Pool] = (),
    cooldown_hours: float = 0.0,
    changeover_hours: float,
    spent_usd: float = 0.0,
    stats: PoolStats | None = None,
    position: JobPosition | None = None,
) -> PlacementContext:
    """The policy's context of one job at ``now``.

    ``attempts`` are the job's attempt records in order and ``reports`` its
    agents' reports; ``pools`` the pools offered now (a cooldown covers every
    zone of the failed pool's region, so those of the market are named too).
    ``cooldown_hours`` and ``changeover_hours`` are the ``[scheduling]``
    settings, ``spent_usd`` what the job has cost so far. ``position``, given,
    stands for what the attempts say of where the job runs and how far it is.
    """
    where = position or position_of(spec, attempts, reports, now)
    return PlacementContext(
        job_id=job_id,
        spec=spec,
        now=now,
        spent_usd=spent_usd,
        current=where.current,
        current_market=where.current_market,
        cooldown=cooldowns(attempts, now, timedelta(hours=cooldown_hours), pools),
        done_hours=where.done_hours,
        changeover_hours=changeover_hours,
        stats=stats,
        checkpoint_at=attempts[-1].pool if attempts else None,
    )
