"""What a job's attempts say: the pools to avoid, its open attempt.

Its progress is counted in :mod:`spotd.core.progress`, its cost in :mod:`spotd.billing.ledger`
(:func:`spotd.billing.ledger.spend_so_far`).

Pure functions over attempt records (and agent reports), used by the engine
and by anything else that needs the same answers (views, reports).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import overload

from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    Instance,
    InstanceReport,
    InstanceState,
    Pool,
)
from spotd.exits import KeptExit

# Attempt ends that say something about the pool, so it is avoided for a while.
POOL_TROUBLE = frozenset(
    {
        AttemptEnd.PREEMPTED,
        AttemptEnd.NO_CAPACITY,
        AttemptEnd.LOST,
        AttemptEnd.LAUNCH_FAILED,
        AttemptEnd.PREFLIGHT_FAILED,
    }
)


def cooldowns(
    attempts: Sequence[AttemptRecord], now: datetime, base: timedelta, pools: Iterable[Pool]
) -> dict[Pool, str]:
    """Spot pools to avoid for now, with the reason.

    A preemption or a capacity failure cools the whole region for that
    instance type, not just the zone: spot reclaims follow regional demand,
    so the zone next door is the likeliest to go next. The cooldown doubles
    with every repeat in the same region.
    """
    cooling = cooling_until(attempts, now, base)
    if not cooling:
        return {}
    reasons = {
        key: f"{last.end_reason} in {last.pool.zone} ({times}x in {key[1]}), "
        f"until {until:%Y-%m-%d %H:%M}"
        for key, (until, last, times) in cooling.items()
    }
    every = set(pools) | {a.pool for a in attempts}
    return {p: reasons[region_key(p)] for p in every if region_key(p) in reasons}


def cooling_until(
    attempts: Sequence[AttemptRecord], now: datetime, base: timedelta
) -> dict[tuple[str, str, str], tuple[datetime, AttemptRecord, int]]:
    """The regions (:func:`region_key`) cooling down at ``now``: when each cooldown ends,
    the attempt that started it and how many troubles it counts (:func:`cooldowns`)."""
    troubles: dict[tuple[str, str, str], list[AttemptRecord]] = {}
    for a in attempts:
        if a.end_reason in POOL_TROUBLE:
            troubles.setdefault(region_key(a.pool), []).append(a)
    cooling: dict[tuple[str, str, str], tuple[datetime, AttemptRecord, int]] = {}
    for key, bad in troubles.items():
        last = bad[-1]
        assert last.ended_at is not None
        until = last.ended_at + base * 2 ** (len(bad) - 1)
        if now < until:
            cooling[key] = (until, last, len(bad))
    return cooling


LAUNCH_FAILURES = frozenset({AttemptEnd.LAUNCH_FAILED, AttemptEnd.NO_CAPACITY})
"""Attempt ends that are a failed launch, as ``retry.launch_failures`` counts them."""


def since_retry(attempts: Sequence[AttemptRecord]) -> Sequence[AttemptRecord]:
    """The attempts since the job's latest retry (``spotd retry``; all of them if it was
    never retried): those the ``[retry]`` bounds count. A retry starts them afresh."""
    return [a for a in attempts if not a.before_retry]


def since_last_run(attempts: Sequence[AttemptRecord]) -> Sequence[AttemptRecord]:
    """The attempts after the last one that ran (all of them if none did), since the
    job's latest retry."""
    attempts = since_retry(attempts)
    for i in range(len(attempts) - 1, -1, -1):
        if attempts[i].running_at is not None:
            return attempts[i + 1 :]
    return attempts


def failed_launches(attempts: Sequence[AttemptRecord], pool: Pool | None = None) -> int:
    """How many attempts since the job last ran (in ``pool`` only, given one) ended as a
    failed launch.

    Counted since the last run, not over the job's life: a launch that went
    through shows the market can serve the job, and a week-long job recovering
    from many preemptions in a tight market must not run out of launches.
    """
    return sum(
        1
        for a in since_last_run(attempts)
        if a.end_reason in LAUNCH_FAILURES and (pool is None or a.pool == pool)
    )


def exhausted_pools(attempts: Sequence[AttemptRecord], per_pool: int) -> dict[Pool, int]:
    """Pools with ``per_pool`` or more failed launches since the job last ran, with their
    count: the job uses them no more (``retry.launch_failures_per_pool``), in either
    market, until one of its attempts runs again."""
    counts: dict[Pool, int] = {}
    for a in since_last_run(attempts):
        if a.end_reason in LAUNCH_FAILURES:
            counts[a.pool] = counts.get(a.pool, 0) + 1
    return {pool: n for pool, n in counts.items() if n >= per_pool}


def error_exits(attempts: Sequence[AttemptRecord]) -> int:
    """How many attempts since the job's latest retry ended because its command exited
    non-zero (``user-failed``): while the job is active, the restarts
    ``retry.max_restarts_on_errors`` counts."""
    return sum(1 for a in since_retry(attempts) if a.end_reason is AttemptEnd.USER_FAILED)


def restartable(codes: Sequence[int], restart_on: Sequence[int]) -> bool:
    """Whether a failed attempt whose nodes exited with ``codes`` may be restarted by
    ``retry.restart_on_exit_codes``: any code restarts when none is listed, else
    a listed code on any node does (a gang's other ranks exit with codes of their own
    when one rank's NCCL times out)."""
    return not restart_on or any(code in restart_on for code in codes)


@overload
def with_report(instance: Instance, report: InstanceReport | None) -> Instance: ...


@overload
def with_report(instance: None, report: InstanceReport | None) -> None: ...


def with_report(instance: Instance | None, report: InstanceReport | None) -> Instance | None:
    """The provider's view of an instance, corrected by what its agent said.

    The agent is the only one who knows how the job ended: a cloud reports a
    VM that shut itself down as stopped or deleted, or still running. An exit
    after a preemption notice is a preemption (the job checkpointed and left);
    any other exit is the job's own ending, success or failure.
    """
    if instance is None or report is None:
        return instance
    # Exit 0 is the job's own end even on a node taken back later (a job that finished
    # while no daemon heard it, then lost its VM); any other exit there is the preemption.
    if report.exit_code is not None and (
        instance.state is not InstanceState.PREEMPTED or report.exit_code == 0
    ):
        # The provider's own notice counts as much as the agent's report of one: the
        # job may exit on the signal before the agent's watcher has seen the notice.
        noticed = instance.state is InstanceState.NOTICE or (
            report.notice_at is not None and report.notice_kind != "rebalance"
        )
        preempted = noticed and report.exit_code != 0
        state = InstanceState.PREEMPTED if preempted else InstanceState.EXITED
        return replace(instance, state=state, exit_code=report.exit_code,
                       oom_kills=report.oom_kills)  # fmt: skip
    if instance.ended:
        return instance
    if report.notice_at is not None and report.notice_kind != "rebalance":
        return replace(instance, state=InstanceState.NOTICE)
    return instance


def with_kept_exit(instance: Instance, kept: KeptExit) -> Instance:
    """An ended node, corrected by the exit its agent kept when no daemon took it.

    Weighed as the agent's report would be (:func:`with_report`), except that an exit
    with no notice and no stop passed on to the job is the job's own ending even on a
    node the provider shows preempted: the market took it back after the job ended.
    """
    code, oom_kills = kept.exit.exit_code, kept.exit.oom_kills
    if kept.notice is None and not kept.stopped:
        return replace(instance, state=InstanceState.EXITED, exit_code=code, oom_kills=oom_kills)
    notice = kept.notice
    report = InstanceReport(
        instance.id, instance.pool.provider, kept.exit.job_id, kept.exit.attempt,
        exit_code=code, notice_at=notice.at if notice else None,
        notice_kind=notice.kind if notice else None, oom_kills=oom_kills,
    )  # fmt: skip
    return with_report(instance, report)


def region_key(pool: Pool) -> tuple[str, str, str]:
    """The key a cooldown is kept under: provider, region and instance type."""
    return (pool.provider, pool.region, pool.instance_type)


def open_attempt(attempts: Sequence[AttemptRecord]) -> AttemptRecord | None:
    """The attempt still going on (always the last one), if any."""
    return attempts[-1] if attempts and attempts[-1].open else None
