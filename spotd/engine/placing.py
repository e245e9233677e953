"""Where a pending or recovering job goes: the policy's decision, turned into a verdict.

The policy chooses among the offerings the market shows (less the pools the
job may no longer use); this module adds what the engine alone knows of the
job (its limits, its team, its checkpoints) and says why a job waits.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta

from spotd import checkpoints
from spotd.core.cadence import checkpoint_interval, saves_on_notice
from spotd.core.contracts import Clock, Policy
from spotd.core.errors import CheckpointError
from spotd.core.progress import work_per_hour
from spotd.core.spec import JobSpec
from spotd.core.values import (
    AttemptRecord,
    Candidate,
    Decision,
    EventCause,
    FailureCause,
    JobRecord,
    JobStatus,
    Market,
    NewAttempt,
    Offering,
    PlacementContext,
)
from spotd.engine import judge
from spotd.engine.attempts import cooling_until, exhausted_pools
from spotd.engine.bills import Bills
from spotd.engine.context import placement_context
from spotd.engine.memory import PassMemory
from spotd.engine.repair import moved_from
from spotd.engine.settings import EngineSettings, checkpoint_uri
from spotd.engine.teams import TeamBook, gave_way
from spotd.engine.verdicts import End, Place, Stay, Verdict, Wait
from spotd.engine.waiting import Cooling, WaitingReason, waiting_reason
from spotd.market.cache import MarketCache, OfferingIndex
from spotd.market.stats import HistoryStats, expected_preemptions

_WaitKey = tuple[OfferingIndex, tuple[object, ...]]


def _held(job: JobRecord, attempts: Sequence[AttemptRecord], teams: TeamBook) -> Wait | None:
    """The wait of a job its team's limits hold back, with the running job of the team
    that is to make way for it, if one is (:mod:`spotd.engine.yielding`)."""
    hold = teams.hold_reason(job, attempts[-1] if gave_way(attempts) else None)
    if hold is None:
        return None
    victim = teams.make_way(job)
    if victim is not None:
        hold += f"; {victim.id} (priority {victim.spec.priority}) is told to make way"
    return Wait(WaitingReason.of(hold), EventCause.HELD, make_way=victim)


def shown_to(
    job: JobRecord, attempts: Sequence[AttemptRecord], offerings: OfferingIndex
) -> OfferingIndex:
    """The offerings the policy is shown for ``job``: past
    ``retry.launch_failures_per_pool`` failed launches in a pool the job never asks
    that pool again, in either market, so its offerings are left out. (A new index
    for such jobs only: the market's is shared.)"""
    spent = set(exhausted_pools(attempts, job.spec.retry.launch_failures_per_pool))
    if (left := moved_from(job.spec, attempts)) is not None:
        spent.add(left)  # ``[gang] on_node_failure = "move"`` (spotd.engine.repair)
    if not spent:
        return offerings
    return OfferingIndex(o for o in offerings if o.pool not in spent)


class Placer:
    """Asks the policy where a job should run, and judges what the answer means."""

    def __init__(
        self,
        market: MarketCache,
        policy: Policy,
        clock: Clock,
        settings: EngineSettings,
        *,
        stats: HistoryStats,
        memory: PassMemory,
        bills: Bills,
    ) -> None:
        self.market = market
        self.policy = policy
        self._clock = clock
        self._settings = settings
        self.stats = stats
        self._memory = memory
        self._bills = bills
        self._lock = threading.Lock()
        """Held while a policy places a job: the reconcile loop and the API may both ask."""
        self._waits: dict[str, tuple[OfferingIndex, int, tuple[object, ...]]] = {}
        """The waiting jobs whose reason was worked out, with what it was worked out from:
        the market's index, the job's version and the ends of its cooldowns."""
        self._pending: dict[str, _WaitKey] = {}

    # -- asking the policy ----------------------------------------------------

    def decide(
        self, job: JobRecord, policy: Policy | None = None
    ) -> tuple[PlacementContext, OfferingIndex, Decision]:
        """What the policy (the engine's, or ``policy``) would choose for the job now, with
        the context and the offerings it was shown (what a waiting reason is made of)."""
        offerings = shown_to(job, self._memory.attempts(job.id), self.market.offerings())
        ctx = self.context(job)
        with self._lock:
            return ctx, offerings, (policy or self.policy).place(ctx, offerings)

    def ask(self, ctx: PlacementContext, offerings: OfferingIndex) -> Decision:
        """The engine's policy on ``offerings``, one placement at a time."""
        with self._lock:
            return self.policy.place(ctx, offerings)

    def context(self, job: JobRecord) -> PlacementContext:
        """Everything the policy may know of the job now (:mod:`spotd.engine.context`)."""
        now = self._clock.now()
        attempts = self._memory.attempts(job.id)
        return placement_context(
            job.id, job.spec, now,
            attempts=attempts,
            reports=self._memory.reports(job.id),
            pools=(o.pool for o in self.market.offerings()),
            cooldown_hours=self._settings.cooldown_hours,
            changeover_hours=self._settings.changeover_hours,
            spent_usd=self._bills.spent(job, attempts, now),
            stats=self.stats.at(now),
        )  # fmt: skip

    def cooling(self, job: JobRecord) -> Cooling:
        """The regions cooling down for the job now, with when each cooldown ends."""
        base = timedelta(hours=self._settings.cooldown_hours)
        return cooling_until(self._memory.attempts(job.id), self._clock.now(), base)

    def interval_hours(self, spec: JobSpec, offering: Offering, market: Market) -> float:
        """The checkpoint interval the job should keep: its own, or Young's for this pool.

        The cost model priced the placement with this interval (same rate, same
        statistics), so the job is told it (it may ignore it) and the attempt
        keeps it for the count of progress.
        """
        stats = self.stats.at(self._clock.now())
        return checkpoint_interval(spec, expected_preemptions(stats, offering, market))

    # -- judging ----------------------------------------------------------------

    def place(self, job: JobRecord, teams: TeamBook | None) -> Verdict:
        """The step of a pending or recovering job."""
        now = self._clock.now()
        attempts = self._memory.attempts(job.id)
        if (ended := judge.over_budget(job, self._bills.spent(job, attempts, now))) is not None:
            return ended
        pending = job.status is JobStatus.PENDING
        if pending and (ended := judge.deadline_impossible(job, now)) is not None:
            return ended
        # A job that gave way to its team's limits waits for them as a new one does.
        if teams is not None and (pending or gave_way(attempts)):
            held = _held(job, attempts, teams)
            if held is not None:
                return held
        ctx, shown, decision = self.decide(job)
        if (choice := decision.choice) is not None:
            if teams is not None and (pending or gave_way(attempts)):
                hold = teams.budget_hold(job, choice.price_per_hour, choice.offering.pool.provider)
                if hold is not None:
                    return Wait(WaitingReason.of(hold), EventCause.HELD)
            return self._placement(job, choice)
        spent = exhausted_pools(attempts, job.spec.retry.launch_failures_per_pool)
        if spent:
            # Shown every pool again: does the policy want only those it may not use?
            anywhere = self.ask(self.context(job), self.market.offerings()).choice
            pool = anywhere.offering.pool if anywhere is not None else None
            if (ended := judge.every_pool_failed(job, spent, pool)) is not None:
                return ended
        limit = self._settings.no_capacity_timeout_hours
        if (ended := judge.waited_too_long(job, now, limit)) is not None:
            return ended
        return self._why_waiting(job, ctx, shown, decision) or Stay()

    def _placement(self, job: JobRecord, choice: Candidate) -> Place | End:
        uri = checkpoint_uri(job, self._settings)
        try:
            checkpoints.check_location(uri)
        except CheckpointError as exc:
            # Stored before the daemon lost the backend (or by an older one): no pass
            # would ever place it, so say so rather than wait forever.
            return End.failed(EventCause.CHECKPOINT_UNUSABLE, FailureCause.INVALID_SPEC,
                              str(exc))  # fmt: skip
        latest = checkpoints.latest_complete(uri)
        interval = self.interval_hours(job.spec, choice.offering, choice.market)
        new = NewAttempt(
            pool=choice.offering.pool,
            market=choice.market,
            nodes=choice.nodes,
            price_per_node_hour=choice.price_per_hour / choice.nodes,
            resume_from=latest.uri if latest else None,
            work_per_hour=work_per_hour(job.spec, choice.offering, interval),
            checkpoint_interval_hours=interval,
            saves_on_notice=saves_on_notice(job.spec, choice.offering.notice_seconds),
        )
        detail = f"{choice.offering.pool} {choice.market} {choice.price_per_hour:.2f} USD/h"
        if latest is not None:
            detail += f", resume from step {latest.step}"
        return Place(new, detail)

    def _why_waiting(
        self, job: JobRecord, ctx: PlacementContext, shown: OfferingIndex, decision: Decision
    ) -> Wait | None:
        """Why the policy placed the job nowhere, worked out again only when what it is
        made of changed: the market's index (a poll, a launch signal), the job (its
        version: attempts, spend) or its cooldowns. A job that waits on the same market
        costs its placement and nothing more per pass. None: said already."""
        market = self.market.offerings()
        cooling = self.cooling(job)
        ends = tuple(sorted(until for until, _, _ in cooling.values()))
        said = self._waits.get(job.id)
        if said is not None and said[0] is market and said[1:] == (job.version, ends):
            return None
        reason = waiting_reason(ctx, market, decision, cooling=cooling, policy=self.policy.name,
                                spent=len(market) - len(shown))  # fmt: skip
        self._pending[job.id] = (market, ends)
        return Wait(reason)

    def said(self, job: JobRecord, wrote: bool) -> None:
        """The waiting reason worked out last for ``job`` was said (``wrote``: with a
        write, which bumped its version) or found the same as the stored one."""
        pending = self._pending.pop(job.id, None)
        if pending is not None:
            self._waits[job.id] = (pending[0], job.version + wrote, pending[1])

    def forget(self, job_id: str) -> None:
        """The job changed: its waiting reason is worked out afresh."""
        self._waits.pop(job_id, None)

    def keep_only(self, held: Mapping[str, int]) -> None:
        """Forget the waiting reasons of jobs this daemon no longer holds."""
        for job_id in self._waits.keys() - held.keys():
            del self._waits[job_id]
