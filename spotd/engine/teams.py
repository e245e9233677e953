"""The queue: the order a pass places jobs in, and the teams' limits that hold jobs back.

A pass steps pending and recovering jobs highest ``priority`` first, then oldest
first, so when the market cannot serve everyone (one pool left, a capacity
signal that refuses the next launch) the job that matters most asks first. The
market's capacity never stops a running job for a higher-priority one: that
would throw away work since its last checkpoint for a gain the next free slot
gives anyway. Only a team's own limits do (below).

A team (``team`` in job.toml, ``[teams.<name>]`` in the daemon's config) may
cap its jobs started and running at once (``max_running_jobs``) and what they
spend in a calendar month (``monthly_budget_usd``, by the ledger). A limit
holds a *pending* job back: it stays pending, with a ``held`` event saying
why, and is placed on the first pass the limit allows. Limits act on running
jobs too, gracefully (:mod:`spotd.engine.yielding`): a held job of a higher
priority makes the team's lowest-priority running job give way, and a budget
about to be spent stops running jobs before it is. A job that gave way is held
like a pending one until the limit allows it again, then resumes from its
checkpoint; a job preempted by the market is placed again at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from spotd.billing.ledger import ledger_so_far
from spotd.core.contracts import Store
from spotd.core.intents import IntentKind, IntentRecord
from spotd.core.states import ACTIVE, JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, JobRecord, LedgerEntry
from spotd.engine.attempts import open_attempt
from spotd.engine.yielding import RunningCost, budget_stops, make_way_for, open_stop
from spotd.market.catalog import notice_seconds

log = logging.getLogger(__name__)


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
    running_jobs: list[JobRecord] = field(default_factory=list)
    """Its jobs in ``running`` status, which a limit may stop."""
    leaving: set[str] = field(default_factory=set)
    """Ids of its jobs already told to stop (an open stop intent on their attempt)."""
    open_attempts: dict[str, AttemptRecord] = field(default_factory=dict)
    """The open attempt of each of its running jobs."""


@dataclass(slots=True)
class TeamBook:
    """The teams' usage during one pass, read from the store the first time a pending
    job of a limited team asks, and kept up to date with the jobs the pass places."""

    store: Store
    now: datetime
    limits: Mapping[str, TeamLimits]
    period: timedelta = timedelta(0)
    """How long until the teams' budgets are weighed again (the re-plan period)."""
    started_within_budget: bool = field(default=False, init=False)
    """A job of a team with a budget started in this pass: the next pass weighs the
    budgets again, so that lower priorities make room for it at once."""
    _usage: dict[str, TeamUsage] | None = field(default=None, init=False)

    def hold_reason(self, job: JobRecord, gave: AttemptRecord | None = None) -> str | None:
        """Why the pending job may not start now, or None when its team's limits allow it.

        ``gave``: the attempt a job ended as it gave way. Started again, it would spend
        as much as it did until the next look and its notice: a budget that cannot
        take that holds it, or it would be stopped again at once."""
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
        again = _running_costs(job, gave, self.period) if gave is not None else None
        would = usage.spent_usd + (again.period_usd + again.notice_usd if again else 0.0)
        if budget is None or would < budget:
            return None
        if usage.spent_usd >= budget:
            return (f"team {team} has spent its {budget:,.2f} USD of this month "
                    f"([teams.{team}] monthly_budget_usd)")  # fmt: skip
        return _would_spend(team, budget)

    def budget_hold(self, job: JobRecord, per_hour: float, provider: str) -> str | None:
        """Why the pending job, placed at ``per_hour`` USD with ``provider``, may not start
        for its team's budget, or None: when it and the team's running jobs that would not
        give way to it (its priority or above) would spend the rest of the budget before
        the next look and their notices, it waits rather than start to be stopped. Lower
        priorities do not hold it: once it runs, they are stopped for it first."""
        team = job.spec.team
        limits = self.limits.get(team) if team is not None else None
        if team is None or limits is None or limits.monthly_budget_usd is None:
            return None
        usage = self._read().get(team, TeamUsage())
        hours = self.period.total_seconds() / 3600 + notice_seconds(provider) / 3600
        kept = self._kept_over(job, usage)
        would = usage.spent_usd + per_hour * hours + sum(c.period_usd + c.notice_usd for c in kept)
        return None if would < limits.monthly_budget_usd else _would_spend(team,
                                                                          limits.monthly_budget_usd)

    @property
    def has_budgets(self) -> bool:
        """Whether any team has a monthly budget (else no pass weighs one)."""
        return any(t.monthly_budget_usd is not None for t in self.limits.values())

    def make_way(self, job: JobRecord) -> JobRecord | None:
        """The running job of ``job``'s team that stops for it, when what holds it is the
        team's ``max_running_jobs`` and a running job has a lower priority; it is counted
        as leaving, so the next held job of the pass asks another."""
        team = job.spec.team
        limits = self.limits.get(team) if team is not None else None
        if team is None or limits is None or limits.max_running_jobs is None:
            return None
        usage = self._read().get(team, TeamUsage())
        if usage.running - len(usage.leaving) < limits.max_running_jobs:
            return None  # enough are leaving already: the job starts when they have
        victim = make_way_for(job, usage.running_jobs, usage.leaving)
        if victim is not None:
            usage.leaving.add(victim.id)
        return victim

    def stop_over_budget(self) -> list[JobRecord]:
        """Tell the running jobs their teams' budgets cannot keep to stop (a
        ``yield-budget`` intent each, the loop's own); the jobs told."""
        stops = self.budget_stops(self.period)
        for job in stops:
            self.store.request_intent(job.id, IntentKind.YIELD_BUDGET, at=self.now)
            log.warning("job %s is stopped: its team's monthly budget would run out", job.id)
        return stops

    def budget_stops(self, period: timedelta) -> list[JobRecord]:
        """The running jobs that stop so that their teams' monthly budgets are not spent:
        each team's spend, plus what its running jobs spend in ``period`` (until the
        next look) and in their notice, kept under its budget."""
        stops: list[JobRecord] = []
        for team, limits in self.limits.items():
            if limits.monthly_budget_usd is None:
                continue
            usage = self._read().get(team, TeamUsage())
            costs = [_running_costs(j, usage.open_attempts.get(j.id), period)
                     for j in usage.running_jobs]  # fmt: skip
            found = budget_stops(limits.monthly_budget_usd, usage.spent_usd,
                                 [c for c in costs if c is not None], usage.leaving)  # fmt: skip
            usage.leaving.update(j.id for j in found)
            stops.extend(found)
        return stops

    def started(self, job: JobRecord) -> None:
        """Count a job the pass just placed against its team's running jobs."""
        team = job.spec.team
        if self._usage is not None and team is not None:
            self._usage.setdefault(team, TeamUsage()).running += 1
        limits = self.limits.get(team) if team is not None else None
        if limits is not None and limits.monthly_budget_usd is not None:
            self.started_within_budget = True

    def _kept_over(self, job: JobRecord, usage: TeamUsage) -> list[RunningCost]:
        """What the team's running jobs of ``job``'s priority or above, not leaving,
        spend until the next look and in their notice: a budget they fill holds ``job``;
        lower priorities are stopped for it once it runs (:func:`budget_stops`)."""
        kept = [j for j in usage.running_jobs
                if j.spec.priority >= job.spec.priority and j.id not in usage.leaving]  # fmt: skip
        costs = (_running_costs(j, usage.open_attempts.get(j.id), self.period) for j in kept)
        return [c for c in costs if c is not None]

    def _read(self) -> dict[str, TeamUsage]:
        if self._usage is None:
            self._usage = team_usage(self.store, self.now, set(self.limits))
        return self._usage


def _would_spend(team: str, budget: float) -> str:
    return (f"team {team} would spend its {budget:,.2f} USD of this month before this "
            f"job could stop again ([teams.{team}] monthly_budget_usd)")


def _running_costs(
    job: JobRecord, attempt: AttemptRecord | None, period: timedelta
) -> RunningCost | None:
    """What the running job spends in ``period`` and in its notice, at its price."""
    if attempt is None:
        return None
    per_hour = attempt.price_per_node_hour * attempt.nodes
    notice = notice_seconds(attempt.pool.provider) / 3600
    return RunningCost(job, per_hour * period.total_seconds() / 3600, per_hour * notice)


def gave_way(attempts: Sequence[AttemptRecord]) -> bool:
    """Whether the job's last attempt ended as it gave way to a team limit, or came before
    a retry (``spotd retry``): it is held as a pending job is, not counted as running."""
    if not attempts:
        return False
    return attempts[-1].end_reason is AttemptEnd.YIELDED or attempts[-1].before_retry


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
    asked = store.open_intents([j.id for j in active]) if active else {}
    for job in members:
        team = usage[str(job.spec.team)]
        lines: Sequence[LedgerEntry] = billed.get(job.id, [])
        if job.status in ACTIVE:
            own = attempts.get(job.id, [])
            _count_active(team, job, own, asked.get(job.id, []))
            lines = ledger_so_far(job, own, lines, now)
        team.spent_usd += sum(e.usd for e in lines if e.start >= since)
    return usage


def _count_active(
    team: TeamUsage, job: JobRecord, attempts: Sequence[AttemptRecord],
    intents: Sequence[IntentRecord],
) -> None:  # fmt: skip
    """Count an active job: started and not given way, running, leaving."""
    if job.status is JobStatus.PENDING or (job.status is JobStatus.RECOVERING
                                           and gave_way(attempts)):  # fmt: skip
        return
    team.running += 1
    attempt = open_attempt(attempts)
    if open_stop(intents, attempt) is not None or job.status is JobStatus.CHECKPOINTING:
        team.leaving.add(job.id)
    if job.status is JobStatus.RUNNING and attempt is not None:
        team.running_jobs.append(job)
        team.open_attempts[job.id] = attempt
