"""The queue: the order a pass places jobs in, and the teams' limits that hold jobs back.

A pass steps pending and recovering jobs highest ``priority`` first, then oldest
first, so when the market cannot serve everyone (one pool left, a capacity
signal that refuses the next launch) the job that matters most asks first. A
running job is never stopped for a higher-priority one: preemption by priority
would throw away work since its last checkpoint for a gain the next free slot
gives anyway.

A team (``team`` in job.toml, ``[teams.<name>]`` in the daemon's config) may
cap its jobs started and running at once (``max_running_jobs``) and what they
spend in a calendar month (``monthly_budget_usd``, by the ledger). A limit
holds a *pending* job back: it stays pending, with a ``held`` event saying
why, and is placed on the first pass the limit allows. Jobs already started go
on (a preempted one is placed again): the team's budget decides what starts,
a job's own ``budget.max_usd`` what it may spend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from spotd.billing.ledger import ledger_so_far
from spotd.core.contracts import Store
from spotd.core.states import ACTIVE, JobStatus
from spotd.core.values import JobRecord, LedgerEntry


@dataclass(frozen=True, slots=True)
class TeamLimits:
    """One team's limits (``[teams.<name>]``); None is no limit."""

    max_running_jobs: int | None = None
    """Jobs of the team started and not ended (provisioning, running, checkpointing or
    recovering) at once, across every daemon on the database."""
    monthly_budget_usd: float | None = None
    """What the team's jobs may spend in a calendar month (UTC) by the ledger before
    no more of its jobs start."""


def pass_order(jobs: Iterable[JobRecord]) -> list[JobRecord]:
    """The jobs in the order a pass steps them: highest priority first, then oldest.

    The order matters only among jobs that place (pending, recovering); the
    others are stepped in the same order because it costs nothing to.
    """
    return sorted(jobs, key=lambda j: (-j.spec.priority, j.submitted_at, j.id))


def month_start(now: datetime) -> datetime:
    """Midnight UTC of the first day of ``now``'s month: where a monthly budget restarts."""
    at = now.astimezone(UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


@dataclass(slots=True)
class TeamUsage:
    """What a team holds now: jobs started and not ended, and this month's spend."""

    running: int = 0
    spent_usd: float = 0.0


@dataclass(slots=True)
class TeamBook:
    """The teams' usage during one pass, read from the store the first time a pending
    job of a limited team asks, and kept up to date with the jobs the pass places."""

    store: Store
    now: datetime
    limits: Mapping[str, TeamLimits]
    _usage: dict[str, TeamUsage] | None = field(default=None, init=False)

    def hold_reason(self, job: JobRecord) -> str | None:
        """Why the pending job may not start now, or None when its team's limits allow it."""
        team = job.spec.team
        limits = self.limits.get(team) if team is not None else None
        if team is None or limits is None:
            return None
        usage = self._read().get(team, TeamUsage())
        cap = limits.max_running_jobs
        # No live figure in the reasons: an unchanged reason is not written again, and
        # a running team's spend changes every pass.
        if cap is not None and usage.running >= cap:
            return (f"team {team} runs its limit of {cap} job(s) at once "
                    f"([teams.{team}] max_running_jobs)")  # fmt: skip
        budget = limits.monthly_budget_usd
        if budget is not None and usage.spent_usd >= budget:
            return (f"team {team} has spent its {budget:,.2f} USD of this month "
                    f"([teams.{team}] monthly_budget_usd)")  # fmt: skip
        return None

    def started(self, job: JobRecord) -> None:
        """Count a job the pass just placed against its team's running jobs."""
        if self._usage is not None and job.spec.team is not None:
            self._usage.setdefault(job.spec.team, TeamUsage()).running += 1

    def _read(self) -> dict[str, TeamUsage]:
        if self._usage is None:
            self._usage = team_usage(self.store, self.now, set(self.limits))
        return self._usage


def team_usage(store: Store, now: datetime, teams: Iterable[str]) -> dict[str, TeamUsage]:
    """Every listed team's jobs started and not ended, and spend since the month began.

    Spend is the ledger's: the stored lines that start this month, plus the
    running attempts priced to ``now`` as :func:`~spotd.billing.ledger.ledger_so_far`
    prices them (a line is one UTC day, so none straddles the month's start).
    """
    wanted = set(teams)
    usage = {team: TeamUsage() for team in wanted}
    since = month_start(now)
    billed: dict[str, list[LedgerEntry]] = {}
    for line in store.ledger(since=since):
        billed.setdefault(line.job_id, []).append(line)
    members = [j for j in store.list_jobs() if j.spec.team in wanted]
    active = [j for j in members if j.status in ACTIVE]
    attempts = store.attempts_for([j.id for j in active]) if active else {}
    for job in members:
        team = usage[str(job.spec.team)]
        lines: Sequence[LedgerEntry] = billed.get(job.id, [])
        if job.status in ACTIVE:
            if job.status is not JobStatus.PENDING:
                team.running += 1
            lines = ledger_so_far(job, attempts.get(job.id, []), lines, now)
        team.spent_usd += sum(e.usd for e in lines if e.start >= since)
    return usage
