"""The reconcile loop: one pass moves every job this daemon leases one step on.

Each pass reads what changed in bulk (:mod:`spotd.engine.memory`), then for
each job it steps gathers the job's facts, judges them into a verdict
(:mod:`spotd.engine.judge`, :mod:`spotd.engine.placing`: pure, or asking
only the policy) and hands the verdict to the executor
(:mod:`spotd.engine.executor`), the one place that writes transitions and
calls providers. Every step is safe to repeat after a crash at any point: an
attempt row (with its client token) is committed before its launch, a launch
with the same token starts nothing new, and instances that no open attempt
owns are stopped by the reaper (:mod:`spotd.engine.reaper`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from spotd.core.contracts import Clock, EngineStore, Policy, Provider
from spotd.core.errors import LostTransition, SpotdError, StoreError, StoreUnavailable
from spotd.core.intents import IntentKind, IntentRecord
from spotd.core.spec import JobSpec, deadline_controlled
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptRecord,
    EventCause,
    Instance,
    InstanceReport,
    JobRecord,
    Offering,
    PlacementContext,
    attempt_reports,
)
from spotd.engine import judge
from spotd.engine.asked import judge_intents
from spotd.engine.attempts import open_attempt, with_report
from spotd.engine.bills import Bills
from spotd.engine.drills import drill_refusal, with_drill_fact
from spotd.engine.executor import Executor
from spotd.engine.gang import gang_state
from spotd.engine.hang import gang_progress, next_check
from spotd.engine.holds import HoldKeeper
from spotd.engine.memory import PassMemory
from spotd.engine.placing import Placer
from spotd.engine.reaper import Reaper
from spotd.engine.repairing import Repairer
from spotd.engine.reports import with_kept_exits
from spotd.engine.settings import EngineSettings, checkpoint_uri
from spotd.engine.submission import submit
from spotd.engine.teams import TeamBook, pass_order
from spotd.engine.verdicts import Launch, Place, Repair, Replan, Running, Stay, Verdict, Wait
from spotd.engine.waiting import gist_of
from spotd.engine.watch import budget_check_at
from spotd.engine.yielding import give_way, open_stop, stop_notice_hours
from spotd.market.cache import MarketCache
from spotd.market.stats import HistoryStats

log = logging.getLogger(__name__)


class Engine:
    """Moves jobs through the state machine against providers and a policy."""

    def __init__(
        self,
        store: EngineStore,
        providers: Mapping[str, Provider],
        policy: Policy,
        clock: Clock,
        settings: EngineSettings,
    ) -> None:
        self.store = store
        self.providers = dict(providers)
        self.clock = clock
        self.settings = settings
        self.market = MarketCache(self.providers, on_fresh=self._keep_history)
        self._history_at: dict[str, datetime] = {}
        self._warned: set[int] = set()
        """Attempts whose rebalance warning the market has been told of."""
        self.keeps_history = True
        """Whether this engine writes the price history (only the leader of several)."""
        self.peers: Callable[[], int] = lambda: 1
        """How many daemons share the database now: a pass claims that share of the free jobs."""
        self._teams: TeamBook | None = None
        """The teams' usage as the current pass counts it."""
        self._budgets_at: datetime | None = None
        """When the teams' budgets were last weighed against the running jobs."""
        self.memory = PassMemory(store, self.providers)
        bills = Bills(store, self.providers, self.market, clock)
        stats = HistoryStats(store, now=clock.now(),
                             window=timedelta(hours=settings.stats_window_hours))  # fmt: skip
        self.placer = Placer(self.market, policy, clock, settings, stats=stats,
                             memory=self.memory, bills=bills)  # fmt: skip
        self.executor = Executor(store, self.providers, self.market, clock, settings,
                                 bills=bills, interval_hours=self.placer.interval_hours,
                                 changed=self._changed)  # fmt: skip
        self._reaper = Reaper(store, self.providers, self.executor)
        self._repairs = Repairer(store, self.providers, self.market, settings, clock,
                                 executor=self.executor, placer=self.placer,
                                 memory=self.memory, changed=self._changed)  # fmt: skip
        self._holds = HoldKeeper(store, bills, self.executor.terminate, clock)

    @property
    def policy(self) -> Policy:
        """The policy that places this engine's jobs."""
        return self.placer.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.placer.policy = policy

    @property
    def on_end(self) -> Callable[[JobRecord], None] | None:
        """Called with a job that just reached a terminal status (e.g. the mailer)."""
        return self.executor.on_end

    @on_end.setter
    def on_end(self, hook: Callable[[JobRecord], None] | None) -> None:
        self.executor.on_end = hook

    # -- public -----------------------------------------------------------

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> JobRecord:
        """Store a new job; the next pass places it. SubmitRefused, and nothing stored,
        for a job this daemon could never run (:func:`spotd.engine.submission.refusal`).
        ``idempotency_key`` is stored with the job (the store returns the first job for
        a key it already has)."""
        return submit(self.store, spec, now=self.clock.now(), offered=self.market.offered_gpus(),
                      idempotency_key=idempotency_key)  # fmt: skip

    def announce(self) -> None:
        """Say on the database that this daemon is here, before its first pass: the
        daemons that pass meanwhile leave it its share of the free jobs."""
        self.store.renew_lease(self.settings.owner, lease_seconds=self.settings.lease_seconds)

    def tick(self) -> None:
        """One reconcile pass over the jobs this daemon holds the lease of: every job but
        the running ones nothing changed for (:mod:`spotd.engine.watch`)."""
        # Leases are about daemons being alive: real seconds on the database's clock,
        # whatever this daemon's clock (or a simulated market's) says.
        held = self.store.claim_job_versions(
            self.settings.owner, lease_seconds=self.settings.lease_seconds,
            share_of=self.peers(),
        )  # fmt: skip
        now = self.clock.now()
        jobs, same_jobs = self.memory.begin(held, now - self._replan_period(), now)
        if not same_jobs:
            self.executor.bills.keep_only(held)
            self.placer.keep_only(held)
        # Highest priority first, then oldest: when capacity is short, the jobs that
        # matter most ask first (spotd.engine.teams).
        jobs = pass_order(jobs)
        period = self._replan_period()
        self._teams = TeamBook(self.store, now, self.settings.teams, period)
        # Once a re-plan period: stop the running jobs a team's budget cannot keep.
        if self._teams.has_budgets and (self._budgets_at is None
                                        or now - self._budgets_at >= period):  # fmt: skip
            self._budgets_at = now
            self._teams.stop_over_budget()
        try:
            for job in jobs:
                self.step(job)
            if self._teams.started_within_budget:
                self._budgets_at = None  # weighed again next pass, with the new job
        finally:
            self._teams = None  # the next pass counts afresh
            self.memory.end(jobs)
        # The nodes failed jobs keep for inspection: stopped once released or run out.
        self._holds.keep([self.settings.owner])

    def step(self, job: JobRecord) -> None:
        """Move one job one step. Its errors are logged and it is tried again next pass;
        only StoreUnavailable (the database's fault, not the job's) ends the pass."""
        try:
            self._apply(job, with_drill_fact(self._judge(job), lambda: self.store.events(job.id)))
        except LostTransition as exc:
            log.info("job %s changed under us, next pass sees it: %s", job.id, exc)
        except StoreUnavailable:
            # The database, not the job: every other step would fail alike. The pass
            # ends here, and its caller says so once (not once per job per pass).
            self.memory.quiet.wake([job.id])
            raise
        except SpotdError as exc:
            log.warning("job %s: %s: %s", job.id, type(exc).__name__, exc)
        except Exception:
            log.exception("job %s: unexpected error; the daemon goes on", job.id)
        else:
            self.memory.settle(job, self.clock.now(), self._budget_due)
            return
        self.memory.quiet.wake([job.id])  # what failed is tried again next pass

    def context(self, job: JobRecord) -> PlacementContext:
        """Everything the policy may know of the job now (:mod:`spotd.engine.context`)."""
        return self.placer.context(job)

    def request_cancel(self, job_id: str) -> IntentRecord:
        """Ask for the job to be cancelled: an intent, which the pass of the daemon that
        holds the job carries out (its instances stopped, the job ended as cancelled)."""
        return self.store.request_intent(job_id, IntentKind.CANCEL, at=self.clock.now())

    def request_drill(self, job_id: str, node: int = 0) -> IntentRecord:
        """Ask for node ``node`` (a rank) of the running job to be drilled: its provider
        preempts it with its own notice (:mod:`spotd.engine.drills`). DrillRefused (or
        RequestInvalid for a rank it lacks) when the job cannot have a drill now."""
        job = self.store.get_job(job_id)
        attempt = open_attempt(self.store.attempts(job_id))
        provider = self.providers.get(attempt.pool.provider) if attempt is not None else None
        drill_refusal(job, attempt, node, provider)
        return self.store.request_intent(job_id, IntentKind.DRILL, at=self.clock.now(), node=node)

    def reap(self, owners: Sequence[str] | None = None) -> int:
        """Stop running instances no open attempt owns, and delete placement objects
        no live instance or open attempt holds; return how many instances were stopped.

        ``owners``: whose objects to look at (by their ``spotd-owner`` tag); this
        daemon's by default. The leader of several daemons reaps every owner's:
        a dead daemon's orphans are nobody else's to stop. The holds of those owners'
        jobs that are due end first (:mod:`spotd.engine.holds`).
        """
        self._holds.keep(owners or [self.settings.owner])
        return self._reaper.reap(owners or [self.settings.owner])

    # -- judging ------------------------------------------------------------

    def _judge(self, job: JobRecord) -> Verdict:
        asked = self.memory.intents(job.id)
        if asked and (verdict := judge_intents(asked, self._open(job), job.status)) is not None:
            return verdict
        if job.status in (JobStatus.PENDING, JobStatus.RECOVERING):
            if self._teams is None:  # stepped outside a pass
                self._teams = TeamBook(self.store, self.clock.now(), self.settings.teams,
                                       self._replan_period())  # fmt: skip
            return self.placer.place(job, self._teams)
        attempt = open_attempt(self.memory.attempts(job.id))
        if attempt is None:
            raise StoreError(f"job {job.id} is {job.status} but has no open attempt")
        if job.status is JobStatus.PROVISIONING and not attempt.instance_ids:
            # Crashed between committing the attempt and recording its launch: the
            # same client token returns the instances of the first call.
            return Launch(attempt)
        facts = self._watch_facts(job, attempt)
        watched = judge.watch(facts)
        if asked and (stop := open_stop(asked, attempt)) is not None:
            notice = stop_notice_hours(attempt.pool.provider, self.clock.seconds_to_real(1.0))
            return give_way(job, attempt, stop, watched, now=self.clock.now(),
                            notice_hours=notice)  # fmt: skip
        # A node of a gang went: keep the others? (spotd.engine.repair)
        return self._repairs.weigh(job, watched, facts)

    def _open(self, job: JobRecord) -> AttemptRecord | None:
        return open_attempt(self.memory.attempts(job.id))

    def _watch_facts(self, job: JobRecord, attempt: AttemptRecord) -> judge.WatchFacts:
        instances: Sequence[Instance | None] = self._describe(attempt)
        now = self.clock.now()
        attempts = self.memory.attempts(job.id)
        reports = self.memory.reports(job.id)
        if any(i is None or i.ended for i in instances):
            uri = checkpoint_uri(job, self.settings)
            instances = with_kept_exits(self.store, uri, attempt, instances, reports)
        progress = gang_progress(attempt, reports)
        if (check_at := next_check(job, progress, now)) is not None:
            self.memory.hang_checks.by(job.id, check_at)  # a quiet job is woken then
        return judge.WatchFacts(
            job=job, attempt=attempt, attempts=attempts, instances=instances,
            gang=gang_state(attempt, reports), now=now,
            spent=self.executor.bills.spent(job, attempts, now),
            real_per_second=self.clock.seconds_to_real(1.0),
            unweighed_warning=attempt.id not in self._warned and _rebalance(attempt, reports),
            progress=progress,
        )  # fmt: skip

    def _describe(self, attempt: AttemptRecord) -> list[Instance | None]:
        """The attempt's instances as the provider sees them, plus what their agents said.

        A cloud sees a preemption notice only on the VM, and a job's exit code
        not at all: the on-VM agent reports both.
        """
        provider = self.providers[attempt.pool.provider]
        seen = self.memory.described(provider, attempt.instance_ids)
        reports = attempt_reports(attempt, self.memory.reports(attempt.job_id))
        return [
            with_report(self.memory.seen_or_missing(iid, seen), reports.get(iid))
            for iid in attempt.instance_ids
        ]

    # -- applying -------------------------------------------------------------

    def _apply(self, job: JobRecord, verdict: Verdict) -> None:
        """Carry ``verdict`` out; the loop's own verdicts (waits, re-plans) here."""
        if isinstance(verdict, Wait):
            self._wait(job, verdict)
        elif isinstance(verdict, Repair):
            self._repairs.carry_out(job, verdict)
        elif isinstance(verdict, Replan):
            self._replan(job, verdict.attempt)
        else:
            if isinstance(verdict, Place):
                # The policy just chose where the job runs: its first re-plan is due
                # scheduling.replan_seconds from now, not on its first running pass.
                self.memory.replans.schedule(job.id, self.clock.now())
            started = job.status is JobStatus.PENDING
            moved = self.executor.carry_out(job, verdict)
            placed = isinstance(verdict, Place) and started
            if placed and self._teams is not None and moved is not None:
                self._teams.started(moved)  # the next pending job of its team sees it
            if isinstance(verdict, Running) and verdict.calm and moved is not None:
                self.memory.calm(job.id, moved.version)

    def _wait(self, job: JobRecord, verdict: Wait) -> None:
        """Record why the job waits when the gist of the reason changed: not on every
        pass it waits for the same one (its figures may move meanwhile). The record's
        own reason is the last one said, by this daemon or another."""
        if verdict.make_way is not None:
            # The loop's own intent, so that whichever daemon holds that job stops it.
            self.store.request_intent(verdict.make_way.id, IntentKind.YIELD_PRIORITY,
                                      at=self.clock.now())  # fmt: skip
        same = job.waiting is not None and gist_of(job.waiting) == verdict.reason.gist
        wrote = not same and self.executor.wait(job, verdict)
        if verdict.cause is EventCause.WAITING:
            self.placer.said(job, wrote)

    def _replan(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Ask the policy, now and then, whether the running job should be elsewhere.

        A policy that weighs the cost of moving (``balanced``: changeover and
        egress in the score, a hysteresis margin) makes a move worth its price.
        The nodes are terminated, which the job sees as a notice (SIGTERM, so
        it checkpoints), and the next pass places it where the policy says. A
        deadline job may also be stopped to wait for spot when the plan says so.
        A rebalance warning not weighed yet makes the re-plan due now.
        """
        now = self.clock.now()
        if self._newly_warned(attempt):
            self.memory.replans.cancel(job.id)  # weigh the warning now
        last = self.memory.replans.get(job.id)
        if last is not None and now - last < self._replan_period():
            return
        self.memory.replans.schedule(job.id, now)
        choice = self.placer.decide(job)[2].choice
        target = None if choice is None else (choice.offering.pool, choice.market)
        verdict = judge.move(attempt, target, deadline_controlled(job.spec))
        if not isinstance(verdict, Stay):
            self.executor.end(job, verdict)

    def _newly_warned(self, attempt: AttemptRecord) -> bool:
        """Whether a node of ``attempt`` reported a rebalance warning not weighed yet.

        A warning (AWS's rebalance recommendation) is no notice: the job goes on.
        It lowers the pool's capacity signal, so the replan that follows moves the
        job, checkpoint first, if a better pool exists now, and stays otherwise.
        """
        if attempt.id in self._warned:
            return False
        if not _rebalance(attempt, self.memory.reports(attempt.job_id)):
            return False
        self._warned.add(attempt.id)
        self.market.risk_warned(attempt.pool)
        log.info("rebalance warning for %s on %s: replanning", attempt.job_id, attempt.pool)
        return True

    # -- bookkeeping ------------------------------------------------------------

    def _changed(self, job_id: str) -> None:
        """A transition or a launch changed the job: drop what the pass read of it."""
        self.placer.forget(job_id)
        self.memory.wrote(job_id)

    def _replan_period(self) -> timedelta:
        """``replan_seconds`` (real seconds) on the engine's clock."""
        return timedelta(seconds=self.settings.replan_seconds / self.clock.seconds_to_real(1.0))

    def _budget_due(self, job: JobRecord, now: datetime) -> datetime | None:
        """When a quiet running job's spend may reach its budget: it is checked then."""
        budget = job.spec.budget
        if budget is None:
            return None
        attempts = self.memory.attempts(job.id)
        spent = self.executor.bills.spent
        under = budget_check_at(lambda t: spent(job, attempts, t), budget.max_usd, now)
        return now if under is None else under

    def _keep_history(self, provider: str, offerings: tuple[Offering, ...]) -> None:
        if not self.keeps_history:
            return  # another daemon on the database leads and keeps it
        # Polls can be far more frequent than the history needs to be (real seconds).
        now = self.clock.now()
        last = self._history_at.get(provider)
        period = self.settings.price_history_seconds / self.clock.seconds_to_real(1.0)
        if last is not None and (now - last).total_seconds() < period:
            return
        self._history_at[provider] = now
        try:
            self.store.record_prices(offerings, at=now)
        except StoreUnavailable as exc:
            # The pass that follows meets the same fault and the daemon reports it once.
            log.debug("could not keep the price history of %s: %s", provider, exc)
        except StoreError as exc:
            log.warning("could not keep the price history of %s: %s", provider, exc)


def _rebalance(attempt: AttemptRecord, reports: Sequence[InstanceReport]) -> bool:
    """Whether a node of ``attempt`` reported a rebalance warning."""
    mine = attempt_reports(attempt, reports)
    return any(r.notice_kind == "rebalance" for r in mine.values())
