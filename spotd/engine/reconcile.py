"""The reconcile loop: one pass moves every job this daemon leases one step on.

Each pass reads the store, asks providers what their instances are doing, and
applies at most one transition per job. Every step is safe to repeat after a
crash at any point: an attempt row (with its client token) is committed
before its launch, a launch with the same token starts nothing new, and
instances that no open attempt owns are stopped by :meth:`Engine.reap`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from spotd import checkpoints
from spotd.billing.ledger import record_ledger, spend_so_far, usage_from_instances
from spotd.core.cadence import checkpoint_interval, saves_on_notice
from spotd.core.contracts import Clock, EngineStore, Metered, Policy, Provider
from spotd.core.errors import (
    CapacityError,
    CheckpointError,
    InvalidRequestError,
    LostTransition,
    PriceTooLowError,
    ProviderError,
    ProviderUnavailable,
    QuotaError,
    SpotdError,
    StoreError,
    SubmitRefused,
)
from spotd.core.fabric_env import fabric_environment
from spotd.core.progress import work_per_hour
from spotd.core.spec import JobSpec, deadline_controlled, passed_deadline, relative_paths
from spotd.core.states import ACTIVE, WAITING_CAUSE, FailureCause, JobStatus, Transition, transition
from spotd.core.values import (
    AttemptClose,
    AttemptEnd,
    AttemptRecord,
    Decision,
    Instance,
    InstanceReport,
    InstanceState,
    JobRecord,
    LaunchRequest,
    LedgerEntry,
    Market,
    NewAttempt,
    NodeUsage,
    Offering,
    PlacementContext,
    attempt_reports,
)
from spotd.engine.attempts import (
    cooling_until,
    error_exits,
    exhausted_pools,
    failed_launches,
    open_attempt,
    restartable,
    with_kept_exit,
    with_report,
)
from spotd.engine.context import placement_context
from spotd.engine.gang import (
    GangState,
    assembly_seconds,
    gang_environment,
    gang_state,
    preflight_summary,
)
from spotd.engine.placements import attempt_tags, reap_placements, release
from spotd.engine.reports import StoreReports
from spotd.engine.shipping import shipping_environment
from spotd.engine.teams import TeamBook, TeamLimits, pass_order
from spotd.engine.waiting import Cooling, WaitingReason, gist_of, submit_warning, waiting_reason
from spotd.engine.watch import (
    DueTimes,
    Kept,
    QuietJobs,
    ReportMirror,
    budget_check_at,
    changed_instances,
)
from spotd.exits import kept_exits
from spotd.market.cache import MarketCache, OfferingIndex, unoffered_gpus
from spotd.market.stats import HistoryStats, expected_preemptions

log = logging.getLogger(__name__)

TAG_JOB = "spotd-job"
TAG_ATTEMPT = "spotd-attempt"
TAG_OWNER = "spotd-owner"

@dataclass(slots=True)
class _Pass:
    """What one reconcile pass read in bulk before stepping the jobs, and what it did."""

    attempts: dict[str, list[AttemptRecord]]
    described: dict[str, dict[str, Instance] | None]
    """Provider -> its instances by id; None when the bulk describe failed."""
    wrote: set[str] = field(default_factory=set)
    """Jobs the pass wrote to (a transition, a launch or start recorded): read back at its end."""
    calm: dict[str, int] = field(default_factory=dict)
    """Jobs a step moved to running with nothing there for the next pass, by the version."""


MISSING_BEFORE_LOST = 3
"""Describes in a row an instance must be absent from before its node counts as lost."""


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Knobs of the reconcile loop (see ``docs/config.md``)."""

    owner: str
    lease_seconds: float = 60.0
    cooldown_hours: float = 0.5
    no_capacity_timeout_hours: float | None = None
    checkpoints_dir: Path = Path("checkpoints")
    price_history_seconds: float = 300.0
    """Real seconds between two price-history rows of one provider."""
    changeover_hours: float = 0.25
    """Time a new start costs before progress resumes (boot, setup, restore)."""
    replan_seconds: float = 60.0
    """Real seconds between two checks of whether a running job should move."""
    stats_window_hours: float = 7 * 24.0
    """How much price history the pool statistics look at."""
    teams: Mapping[str, TeamLimits] = field(default_factory=dict)
    """Per team name, the limits that hold its pending jobs back (``[teams]``)."""


def checkpoint_uri(job: JobRecord, settings: EngineSettings) -> str:
    """Where the job's checkpoints go: its spec's URI or a folder of the daemon's."""
    return job.spec.checkpoint.uri or str(settings.checkpoints_dir / job.id)


def job_environment(
    job: JobRecord,
    attempt: AttemptRecord,
    offering: Offering,
    *,
    checkpoint_uri: str,
    interval_hours: float,
) -> dict[str, str]:
    """Everything the nodes of ``attempt`` are told before they boot.

    In order, later winning: the fabric's NCCL and libfabric variables (with
    the job's per-fabric overrides), the job's own ``[env]``, what the gang
    needs to assemble and pass preflight, and spotd's own variables. The
    agent adds the rest once the gang has assembled (rank, master, roster).
    """
    env = fabric_environment(
        offering.interconnect, job.spec.fabric_env, nodes=attempt.nodes,
        instance_type=offering.pool.instance_type,
    )  # fmt: skip
    env.update(job.spec.env)
    env.update(gang_environment(job.spec, attempt, offering))
    env.update(shipping_environment(job.spec, offering, checkpoint_uri))
    env.update(
        SPOTD_JOB_ID=job.id,
        SPOTD_ATTEMPT=str(attempt.seq),
        SPOTD_NUM_NODES=str(attempt.nodes),
        SPOTD_CHECKPOINT_URI=checkpoint_uri,
        SPOTD_RESUME_FROM=attempt.resume_from or "",
        SPOTD_CHECKPOINT_INTERVAL_SECONDS=str(round(interval_hours * 3600)),
    )
    return env


def max_run_seconds(spec: JobSpec) -> int | None:
    """The job's ``market.max_run_hours`` in whole seconds, as launch requests carry it."""
    hours = spec.market.max_run_hours
    return None if hours is None else max(1, round(hours * 3600))


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
        self.policy = policy
        self.clock = clock
        self.settings = settings
        self.market = MarketCache(self.providers, on_fresh=self._keep_history)
        self._history_at: dict[str, float] = {}
        self._missing: dict[str, int] = {}
        self._replans = DueTimes[float]()
        """When each running job is next asked whether it should move (monotonic seconds)."""
        self._warned: set[int] = set()
        """Attempts whose rebalance warning the market has been told of."""
        self.keeps_history = True
        """Whether this engine writes the price history (only the leader of several)."""
        self.peers: Callable[[], int] = lambda: 1
        """How many daemons share the database now: a pass claims that share of the free jobs."""
        self._kept = Kept()
        """The held jobs' attempts, by the job's version, and the records of jobs stepped."""
        self._reports_kept = ReportMirror()
        self._quiet = QuietJobs()
        self._seen: dict[str, dict[str, Instance]] = {}
        """The last describe of each provider, by instance id: a pass wakes the jobs of
        the instances that changed."""
        self._last_held: dict[str, int] = {}
        """The jobs held at the last pass, with their versions then."""
        self._bills: dict[str, tuple[int, list[LedgerEntry]]] = {}
        """The stored ledger lines of jobs, by job id, with the job's version they were read at."""
        self._pass: _Pass | None = None
        self._teams: TeamBook | None = None
        """The teams' usage as the current pass counts it."""
        self._waits: dict[str, tuple[OfferingIndex, int, tuple[datetime, ...]]] = {}
        """The waiting jobs whose reason was worked out, with what it was worked out from:
        the market's index, the job's version and the ends of its cooldowns."""
        self._placing = threading.Lock()
        """Held while a policy places a job: the reconcile loop and the API may both ask."""
        self._unbilled: set[str] = set()
        """Ended jobs a killed daemon left unbilled, not billed yet."""
        self._unbilled_read: set[str] = set()
        """The owners whose unbilled jobs were read (at their first reap here)."""
        self.on_end: Callable[[JobRecord], None] | None = None
        """Called with a job that just reached a terminal status (e.g. the mailer)."""
        self.stats = HistoryStats(
            store, now=clock.now(), window=timedelta(hours=settings.stats_window_hours)
        )
        self._handlers: Mapping[JobStatus, Callable[[JobRecord], None]] = {
            JobStatus.PENDING: self._place,
            JobStatus.RECOVERING: self._place,
            JobStatus.PROVISIONING: self._provisioning,
            JobStatus.RUNNING: self._watch,
            JobStatus.CHECKPOINTING: self._watch,
        }

    # -- public -----------------------------------------------------------

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> JobRecord:
        """Store a new job; the next pass places it. SubmitRefused, and nothing stored,
        for a job this daemon could never run: a relative path (there is no job file
        here to resolve it against), a checkpoint location it has no way to open or
        write (a local one is probed here), a ``finish_by`` already past on the
        engine's clock, or GPU models that no provider offers. ``idempotency_key`` is stored
        with the job (the store returns the first job for a key it already has)."""
        if relative := relative_paths(spec):
            field, value = relative[0]
            raise SubmitRefused(
                f"{field}: {value!r} is a relative path, and the daemon has no job file to "
                "resolve it against; send an absolute path (spotd submit resolves it "
                "against the job file's folder)"
            )
        if spec.checkpoint.uri:
            try:
                checkpoints.check_location(spec.checkpoint.uri)
                # Here only: a stored job's location is not probed again at each pass.
                checkpoints.check_writable(spec.checkpoint.uri)
            except CheckpointError as exc:
                raise SubmitRefused(f"checkpoint.uri: {exc}") from exc
        now = self.clock.now()
        late = passed_deadline(spec, now)
        if late is not None:
            raise SubmitRefused(late)
        problem = unoffered_gpus(spec.resources.gpus, self.market.offered_gpus())
        if problem is not None:
            raise SubmitRefused(f"resources.gpus: {problem}")
        return self.store.create_job(spec, now=now, idempotency_key=idempotency_key)

    def submit_warning(self, spec: JobSpec) -> str | None:
        """Why no offering of the market as it stands can ever run the job (its GPUs per
        node, fabric, providers, regions or markets: never its budget, prices or the
        capacity of now), or None. A warning, not a refusal: the market may change.
        None too before every provider has answered a price poll."""
        if self.market.offered_gpus() is None:
            return None  # nobody can tell yet, and a submit must not wait for a poll
        offerings = self.market.offerings()
        ctx = placement_context(
            "submit", spec, self.clock.now(),
            pools=(o.pool for o in offerings),
            changeover_hours=self.settings.changeover_hours,
        )  # fmt: skip
        with self._placing:
            decision = self.policy.place(ctx, offerings)
        return submit_warning(ctx, offerings, decision)

    def announce(self) -> None:
        """Say on the database that this daemon is here, before its first pass: the
        daemons that pass meanwhile leave it its share of the free jobs."""
        self.store.renew_lease(self.settings.owner, lease_seconds=self.settings.lease_seconds)

    def tick(self) -> None:
        """One reconcile pass over the jobs this daemon holds the lease of: every job but
        the running ones nothing changed for (:mod:`spotd.engine.watch`)."""
        # Leases are about daemons being alive: real seconds on the database's clock,
        # whatever this daemon's clock (or a simulated market's) says.
        lease = self.settings.lease_seconds
        held = self.store.claim_job_versions(
            self.settings.owner, lease_seconds=lease, share_of=self.peers()
        )
        # The same jobs at the same versions (one comparison in C): nothing to read.
        same = held == self._last_held
        same_jobs = same or held.keys() == self._last_held.keys()
        self._last_held = held
        if not same_jobs:
            self._forget_unheld(held)
        # Bulk reads only: the attempts of jobs whose version moved, the reports written
        # since the last pass, one describe per provider. A pass over 50,000 jobs must
        # make neither 50,000 calls nor read 50,000 rows it read before.
        moved = [] if same else self._read_attempts(held)
        described = self._describe_all()
        self._quiet.wake(self._reports_kept.refresh(self.store, held, same_jobs=same_jobs))
        due = self._replans.due(time.monotonic() - self.settings.replan_seconds)
        due |= self._quiet.budget.due(self.clock.now())
        stepped = self._quiet.to_step(held, moved, due, same_jobs=same_jobs)
        # Highest priority first, then oldest: when capacity is short, the jobs that
        # matter most ask first (spotd.engine.teams).
        jobs = pass_order(self._records(held, stepped))
        self._teams = TeamBook(self.store, self.clock.now(), self.settings.teams)
        self._pass = _Pass({j.id: self._kept.attempts[j.id] for j in jobs}, described)
        try:
            for job in jobs:
                self.step(job)
        finally:
            wrote, self._pass = self._pass.wrote, None
            self._teams = None  # the next pass counts afresh
            self._kept.records = {j.id: j for j in jobs if j.id not in self._quiet.versions}
            self._read_back(wrote)

    def step(self, job: JobRecord) -> None:
        """Move one job one step; errors are logged, never raised to the loop."""
        try:
            self._handlers[job.status](job)
        except LostTransition as exc:
            log.info("job %s changed under us, next pass sees it: %s", job.id, exc)
        except SpotdError as exc:
            log.warning("job %s: %s: %s", job.id, type(exc).__name__, exc)
        except Exception:
            log.exception("job %s: unexpected error; the daemon goes on", job.id)
        else:
            self._settle_quiet(job)
            return
        self._quiet.wake([job.id])  # what failed is tried again next pass

    def plan(self, job: JobRecord, policy: Policy | None = None) -> Decision:
        """What the policy (the engine's, or ``policy``) would choose for the job now.

        Safe to call from another thread (the API's ``spotd plan JOB``): one
        placement at a time asks the policy, which may keep per-job state.
        """
        return self.decide(job, policy)[2]

    def decide(
        self, job: JobRecord, policy: Policy | None = None
    ) -> tuple[PlacementContext, OfferingIndex, Decision]:
        """:meth:`plan`, with the context and the offerings the policy was shown (what
        :mod:`spotd.engine.waiting` explains a decision by)."""
        offerings = self.market.offerings()
        spent = exhausted_pools(self._attempts(job.id), job.spec.retry.launch_failures_per_pool)
        if spent:
            # Past retry.launch_failures_per_pool the job never asks that pool again,
            # in either market: the offering is not shown to the policy at all. (A
            # new index per placement, for such jobs only: the market's is shared.)
            offerings = OfferingIndex(o for o in offerings if o.pool not in spent)
        ctx = self.context(job)
        with self._placing:
            return ctx, offerings, (policy or self.policy).place(ctx, offerings)

    def cooling(self, job: JobRecord) -> Cooling:
        """The regions cooling down for the job now, with when each cooldown ends."""
        base = timedelta(hours=self.settings.cooldown_hours)
        return cooling_until(self._attempts(job.id), self.clock.now(), base)

    def context(self, job: JobRecord) -> PlacementContext:
        """Everything the policy may know of the job now (:mod:`spotd.engine.context`)."""
        now = self.clock.now()
        attempts = self._attempts(job.id)
        return placement_context(
            job.id,
            job.spec,
            now,
            attempts=attempts,
            reports=self._reports(job.id),
            pools=(o.pool for o in self.market.offerings()),
            cooldown_hours=self.settings.cooldown_hours,
            changeover_hours=self.settings.changeover_hours,
            spent_usd=self._spent(job, attempts, now),
            stats=self.stats.at(now),
        )

    def cancel(self, job: JobRecord) -> JobRecord:
        """Cancel an active job and stop its instances."""
        attempt = open_attempt(self._attempts(job.id))
        close = AttemptClose(attempt.id, AttemptEnd.CANCELLED) if attempt else None
        job = self._move(job, JobStatus.CANCELLED, "cancelled by user", close=close)
        self._settle(job, attempt)
        return job

    def reap(self, owners: Sequence[str] | None = None) -> int:
        """Stop running instances no open attempt owns, and delete placement objects
        no live instance or open attempt holds; return how many instances were stopped.

        ``owners``: whose objects to look at (by their ``spotd-owner`` tag); this
        daemon's by default. The leader of several daemons reaps every owner's:
        a dead daemon's orphans are nobody else's to stop.
        """
        stopped = 0
        reaped = owners or [self.settings.owner]
        for owner in reaped:
            for provider in self.providers.values():
                stopped += self._reap_one(provider, owner)
        self._bill_leftovers(reaped)
        return stopped

    def _bill_leftovers(self, owners: Sequence[str]) -> None:
        """Bill the ended jobs that a daemon of ``owners``, killed between a job's end
        and its bill, left without one (each owner's read at its first reap here), each
        once every node of theirs has ended (the reaper stops those still running);
        then call ``on_end``, which that daemon never reached either."""
        for owner in set(owners) - self._unbilled_read:
            try:
                self._unbilled.update(self.store.unbilled_jobs(owner))
            except StoreError as exc:
                log.warning("%s's ended jobs left unbilled could not be read: %s", owner, exc)
                continue
            self._unbilled_read.add(owner)
        for job_id in sorted(self._unbilled):
            try:
                attempts = self.store.attempts(job_id)
                if not all(self._nodes_ended(a) for a in attempts if not a.open):
                    continue
                job = self.store.get_job(job_id)
            except SpotdError as exc:
                log.warning("job %s: its bill waits, its nodes could not be read: %s", job_id, exc)
                continue
            log.info("job %s ended unbilled (its daemon stopped first): billing it now", job_id)
            self._bill(job)
            if self.on_end is not None:
                self.on_end(job)
            self._unbilled.discard(job_id)

    def _nodes_ended(self, attempt: AttemptRecord) -> bool:
        """Whether every node of ``attempt`` has ended (or its provider is gone)."""
        provider = self.providers.get(attempt.pool.provider)
        if provider is None or not attempt.instance_ids:
            return True
        return all(i.ended for i in provider.describe(attempt.instance_ids))

    def _reap_one(self, provider: Provider, owner: str) -> int:
        try:
            mine = provider.list_instances({TAG_OWNER: owner})
        except ProviderError as exc:
            log.warning("reaper could not list %s: %s", provider.name, exc)
            return 0
        except Exception:
            log.exception("reaper: listing %s raised", provider.name)  # an adapter's bug
            return 0
        live = [i for i in mine if not i.ended]
        orphans = [i.id for i in live if self._orphaned(i.tags)]
        stopped = self._stop_orphans(provider, orphans) if orphans else 0
        try:
            # Orphans stopped just now still hold their placement: it goes next pass.
            reap_placements(provider, {TAG_OWNER: owner}, live, self._orphaned,
                            key_tags=(TAG_JOB, TAG_ATTEMPT))  # fmt: skip
        except Exception:
            log.exception("reaper: placements of %s raised", provider.name)  # an adapter's bug
        return stopped

    @staticmethod
    def _stop_orphans(provider: Provider, orphans: list[str]) -> int:
        log.warning("stopping %d instance(s) no attempt owns: %s", len(orphans), orphans)
        try:
            provider.terminate(orphans)
        except Exception as exc:
            # One provider's failure (or an adapter's unmapped error) must not keep
            # the reaper from the others.
            log.warning("reaper could not stop %s on %s: %s", orphans, provider.name, exc)
            return 0
        return len(orphans)

    def _keep_history(self, provider: str, offerings: tuple[Offering, ...]) -> None:
        if not self.keeps_history:
            return  # another daemon on the database leads and keeps it
        # Polls can be far more frequent than the history needs to be.
        now = time.monotonic()
        last = self._history_at.get(provider)
        if last is not None and now - last < self.settings.price_history_seconds:
            return
        self._history_at[provider] = now
        try:
            self.store.record_prices(offerings, at=self.clock.now())
        except StoreError as exc:
            log.warning("could not keep the price history of %s: %s", provider, exc)

    # -- placing ------------------------------------------------------------

    def _place(self, job: JobRecord) -> None:
        now = self.clock.now()
        attempts = self._attempts(job.id)
        if self._over_budget(job, attempts, now):
            return
        if job.status is JobStatus.PENDING and self._deadline_impossible(job, now):
            return
        if job.status is JobStatus.PENDING and self._held_by_team(job, now):
            return
        ctx, shown, decision = self.decide(job)
        if decision.choice is not None:
            # The policy just chose where the job runs: its first re-plan is due
            # scheduling.replan_seconds from now, not on its first running pass.
            self._replans.schedule(job.id, time.monotonic())
        if decision.choice is None:
            if not self._every_pool_failed(job, attempts) and not self._waited_too_long(job, now):
                self._say_why(job, ctx, shown, decision)
            return
        choice = decision.choice
        uri = checkpoint_uri(job, self.settings)
        try:
            checkpoints.check_location(uri)
        except CheckpointError as exc:
            # Stored before the daemon lost the backend (or by an older one): no pass
            # would ever place it, so say so rather than wait forever.
            job = self._move(job, JobStatus.FAILED, "checkpoint location unusable",
                             detail=str(exc), failure=FailureCause.INVALID_SPEC)  # fmt: skip
            self._settle(job, None)
            return
        latest = checkpoints.latest_complete(uri)
        interval = self._interval_hours(job.spec, choice.offering, choice.market)
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
        started = job.status is JobStatus.PENDING
        job = self._move(job, JobStatus.PROVISIONING, "placed", detail=detail, open_=new)
        if started and self._teams is not None:
            self._teams.started(job)  # the next pending job of its team sees it
        opened = open_attempt(self._attempts(job.id))
        if opened is not None:
            self._launch(job, opened)

    def _launch(self, job: JobRecord, attempt: AttemptRecord) -> None:
        provider = self.providers[attempt.pool.provider]
        offering = self.market.find(attempt.pool)
        if offering is None:
            raise ProviderError(f"{attempt.pool} is no longer offered", provider=provider.name)
        request = LaunchRequest(
            offering=offering,
            market=attempt.market,
            nodes=attempt.nodes,
            client_token=attempt.client_token,
            tags={
                TAG_JOB: job.id,
                TAG_ATTEMPT: str(attempt.seq),
                TAG_OWNER: self.settings.owner,
            },
            command=job.spec.command,
            env=self._job_env(job, attempt, offering),
            # Shipped code runs where the node unpacks it, not at the submitter's path.
            workdir=None if job.spec.code is not None else job.spec.workdir,
            max_run_seconds=max_run_seconds(job.spec),
        )
        try:
            instances = provider.launch(request)
        except ProviderError as exc:
            self._launch_failed(job, attempt, exc)
            return
        if self.market.signals.signal(attempt.pool) is not None:
            # A success only moves a signal the pool has: without one it would store
            # "no signal" again, and the market would rebuild its whole offering index
            # for nothing (once per launch, which made a pass placing 10,000 jobs
            # take many minutes).
            self.market.launch_succeeded(attempt.pool)
        self.store.set_attempt_instances(attempt.id, [i.id for i in instances])
        self._forget(job.id)

    def _launch_failed(self, job: JobRecord, attempt: AttemptRecord, exc: ProviderError) -> None:
        if exc.retryable and not isinstance(exc, CapacityError):
            # Throttled or a 5xx: the same request may pass on the next pass.
            log.warning("launch of %s for %s deferred: %s", attempt.pool, job.id, exc)
            return
        if isinstance(exc, CapacityError):
            self.market.launch_refused(attempt.pool)
        no_capacity = isinstance(exc, CapacityError | QuotaError | PriceTooLowError)
        reason = AttemptEnd.NO_CAPACITY if no_capacity else AttemptEnd.LAUNCH_FAILED
        detail = f"{attempt.pool}: {type(exc).__name__}: {exc}"
        close = AttemptClose(attempt.id, reason)
        if isinstance(exc, InvalidRequestError):
            # The request the job makes cannot be carried (its env would carry the
            # daemon's token, say): every pool would refuse it alike.
            job = self._move(job, JobStatus.FAILED, "launch request refused", detail=detail,
                             close=close, failure=FailureCause.INVALID_SPEC)  # fmt: skip
            self._settle(job, attempt)
            return
        retry = job.spec.retry
        attempts = self._attempts(job.id)  # this attempt is still open: not counted
        failed_before = failed_launches(attempts)
        if failed_before >= retry.launch_failures:
            detail += (f" ({failed_before + 1} failed launches, "
                       f"retry.launch_failures is {retry.launch_failures})")  # fmt: skip
            job = self._move(job, JobStatus.FAILED, str(reason), detail=detail, close=close,
                             failure=FailureCause.LAUNCH_FAILED)  # fmt: skip
            self._settle(job, attempt)
            return
        detail += f" ({retry.launch_failures - failed_before - 1} more failed launch(es) allowed"
        if failed_launches(attempts, attempt.pool) + 1 >= retry.launch_failures_per_pool:
            detail += f"; {attempt.pool} is not used for this job again"
        detail += ")"
        self._move(job, JobStatus.RECOVERING, str(reason), detail=detail, close=close)
        # The adapter may have made the gang's placement before the launch failed.
        self._release(attempt)

    def _job_env(
        self, job: JobRecord, attempt: AttemptRecord, offering: Offering
    ) -> dict[str, str]:
        interval = attempt.checkpoint_interval_hours
        if interval is None:  # placed by a version that did not keep it
            interval = self._interval_hours(job.spec, offering, attempt.market)
        return job_environment(
            job, attempt, offering, checkpoint_uri=checkpoint_uri(job, self.settings),
            interval_hours=interval,
        )  # fmt: skip

    def _interval_hours(self, spec: JobSpec, offering: Offering, market: Market) -> float:
        """The checkpoint interval the job should keep: its own, or Young's for this pool.

        The cost model priced the placement with this interval (same rate, same
        statistics), so the job is told it (it may ignore it) and the attempt
        keeps it for the count of progress.
        """
        stats = self.stats.at(self.clock.now())
        return checkpoint_interval(spec, expected_preemptions(stats, offering, market))

    # -- watching -------------------------------------------------------------

    def _provisioning(self, job: JobRecord) -> None:
        attempt = self._require_open(job)
        if not attempt.instance_ids:
            # Crashed between committing the attempt and recording its launch:
            # the same client token returns the instances of the first call.
            self._launch(job, attempt)
            return
        self._watch(job)

    def _watch(self, job: JobRecord) -> None:
        attempt = self._require_open(job)
        instances = self._describe(attempt)
        now = self.clock.now()
        if self._over_budget(job, self._attempts(job.id), now, attempt):
            return
        gang = gang_state(attempt, self._reports(job.id))
        if self._gang_failed(job, attempt, gang, instances):
            return
        if any(i is None or i.ended for i in instances):
            self._attempt_ended(job, attempt, instances)
        elif (
            job.status is JobStatus.PROVISIONING
            and all(
                i is not None and i.state in (InstanceState.RUNNING, InstanceState.NOTICE)
                for i in instances
            )
            and (attempt.nodes == 1 or gang.assembled(attempt.nodes))
        ):
            self.store.mark_attempt_running(attempt.id, at=now)
            self._forget(job.id)
            detail = str(attempt.pool)
            if gang.preflight is not None:
                detail += f"; {preflight_summary(gang.preflight)}"
            moved = self._move(job, JobStatus.RUNNING, "all nodes running", detail=detail)
            if self._pass is not None and self._nothing_to_run_on(attempt, instances):
                self._pass.calm[job.id] = moved.version
        elif job.status is JobStatus.RUNNING and any(
            i is not None and i.state is InstanceState.NOTICE for i in instances
        ):
            self._move(job, JobStatus.CHECKPOINTING, "preemption notice", detail=str(attempt.pool))
        elif job.status is JobStatus.RUNNING:
            if self._newly_warned(attempt):
                self._replans.cancel(job.id)  # weigh the warning now
            self._maybe_move(job, attempt)

    def _gang_failed(
        self,
        job: JobRecord,
        attempt: AttemptRecord,
        gang: GangState,
        instances: Sequence[Instance | None],
    ) -> bool:
        """End the attempt if its preflight failed or its gang did not assemble in time.

        Checked before the nodes' exits: an agent that gave up on its gang or
        on a failed preflight exits too, and that is no verdict on the job's
        command. No job ever runs on a partial gang.
        """
        if gang.gave_up == "setup":
            self._setup_failed(job, attempt, gang)
            return True
        if gang.preflight_failed:
            self._preflight_failed(job, attempt, gang)
            return True
        if gang.gave_up == "rendezvous" or self._assembly_overdue(job, attempt, gang):
            running = sum(1 for i in instances if i is not None and not i.ended)
            self._finish(
                job, attempt=attempt, status=JobStatus.RECOVERING, end=AttemptEnd.LOST,
                detail=f"{attempt.pool}: gang did not assemble in "
                f"{assembly_seconds(job.spec):g} s ({running} of {attempt.nodes} node(s) up, "
                f"{gang.joined} joined, {gang.started} passed preflight)",
            )  # fmt: skip
            return True
        return False

    def _assembly_overdue(self, job: JobRecord, attempt: AttemptRecord, gang: GangState) -> bool:
        """A multi-node attempt still assembling past its gang and preflight timeouts."""
        if job.status is not JobStatus.PROVISIONING or attempt.nodes == 1:
            return False
        if gang.assembled(attempt.nodes):
            return False
        waited = (self.clock.now() - attempt.started_at).total_seconds()
        # The timeouts are real seconds; the engine's clock may run faster (simulator).
        return waited >= assembly_seconds(job.spec) / self.clock.seconds_to_real(1.0)

    def _setup_failed(self, job: JobRecord, attempt: AttemptRecord, gang: GangState) -> None:
        """A node could not be prepared (code, secrets or a setup command): place the job
        again, within ``retry.setup_failures``; past it, the job fails."""
        report = gang.setup_failure
        detail = f"setup failed on {attempt.pool}"
        if report is not None:
            detail = f"setup on {report.instance_id} exited with {report.exit_code}"
            if report.exit_detail:
                detail += f": {report.exit_detail}"
        failed_before = sum(1 for a in self._attempts(job.id)
                            if a.end_reason is AttemptEnd.SETUP_FAILED)  # fmt: skip
        if failed_before >= job.spec.retry.setup_failures:
            self._finish(job, attempt=attempt, status=JobStatus.FAILED,
                         end=AttemptEnd.SETUP_FAILED, detail=detail,
                         failure=FailureCause.SETUP_FAILED)  # fmt: skip
            return
        left = job.spec.retry.setup_failures - failed_before - 1
        detail += f" (placed again: {left} more setup failure(s) allowed)"
        self._finish(job, attempt=attempt, status=JobStatus.RECOVERING,
                     end=AttemptEnd.SETUP_FAILED, detail=detail)  # fmt: skip

    def _preflight_failed(self, job: JobRecord, attempt: AttemptRecord, gang: GangState) -> None:
        """The pool failed the gang's checks: cool it and go elsewhere. A check that
        every pool would fail alike (the checkpoint location) fails the job instead."""
        summary = "preflight failed (its figures never reached the daemon)"
        if gang.preflight is not None:
            summary = preflight_summary(gang.preflight)
        detail = f"{attempt.pool}: {summary}"
        if gang.job_at_fault:
            self._finish(job, attempt=attempt, status=JobStatus.FAILED,
                         end=AttemptEnd.PREFLIGHT_FAILED, detail=detail,
                         failure=FailureCause.INVALID_SPEC)  # fmt: skip
            return
        self._finish(job, attempt=attempt, status=JobStatus.RECOVERING,
                     end=AttemptEnd.PREFLIGHT_FAILED, detail=detail)  # fmt: skip

    def _newly_warned(self, attempt: AttemptRecord) -> bool:
        """Whether a node of ``attempt`` reported a rebalance warning not weighed yet.

        A warning (AWS's rebalance recommendation) is no notice: the job goes on.
        It lowers the pool's capacity signal, so the replan that follows moves the
        job, checkpoint first, if a better pool exists now, and stays otherwise.
        """
        if attempt.id in self._warned:
            return False
        reports = attempt_reports(attempt, self._reports(attempt.job_id))
        if not any(r.notice_kind == "rebalance" for r in reports.values()):
            return False
        self._warned.add(attempt.id)
        self.market.risk_warned(attempt.pool)
        log.info("rebalance warning for %s on %s: replanning", attempt.job_id, attempt.pool)
        return True

    def _maybe_move(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Ask the policy, now and then, whether the running job should be elsewhere.

        A policy that weighs the cost of moving (``balanced``: changeover and
        egress in the score, a hysteresis margin) makes a move worth its price.
        The nodes are terminated, which the job sees as a notice (SIGTERM, so
        it checkpoints), and the next pass places it where the policy says. A
        deadline job may also be stopped to wait for spot when the plan says so.
        """
        now = time.monotonic()
        last = self._replans.get(job.id)
        if last is not None and now - last < self.settings.replan_seconds:
            return
        self._replans.schedule(job.id, now)
        choice = self.plan(job).choice
        if choice is None and not deadline_controlled(job.spec):
            return  # nothing better to go to: a running job keeps running
        if choice is not None and (choice.offering.pool, choice.market) == (
            attempt.pool,
            attempt.market,
        ):
            return
        target = f"{choice.offering.pool} {choice.market}" if choice else "waiting for spot"
        self._finish(
            job,
            attempt=attempt,
            status=JobStatus.RECOVERING,
            end=AttemptEnd.MIGRATED,
            detail=f"policy moves it from {attempt.pool} {attempt.market} to {target}",
        )

    def _describe(self, attempt: AttemptRecord) -> list[Instance | None]:
        """The attempt's instances as the provider sees them, plus what their agents said.

        A cloud sees a preemption notice only on the VM, and a job's exit code
        not at all: the on-VM agent reports both.
        """
        provider = self.providers[attempt.pool.provider]
        seen = self._described(provider, attempt.instance_ids)
        reports = attempt_reports(attempt, self._reports(attempt.job_id))
        return [
            with_report(self._seen_or_missing(iid, seen), reports.get(iid))
            for iid in attempt.instance_ids
        ]

    def _seen_or_missing(self, iid: str, seen: Mapping[str, Instance]) -> Instance | None:
        """The instance, or None once it was missing from several describes in a row.

        Clouds list a new instance a little after launching it, and a single
        failed lookup must not restart a healthy job: only a repeated absence
        counts as a lost node.
        """
        if iid in seen:
            self._missing.pop(iid, None)
            return seen[iid]
        self._missing[iid] = self._missing.get(iid, 0) + 1
        if self._missing[iid] >= MISSING_BEFORE_LOST:
            return None
        raise ProviderError(f"instance {iid} not listed yet ({self._missing[iid]}x)")

    def _attempt_ended(
        self, job: JobRecord, attempt: AttemptRecord, instances: Sequence[Instance | None]
    ) -> None:
        instances = self._with_kept_exits(job, attempt, instances)
        ended = [i for i in instances if i is not None and i.ended]
        # EXITED without a code: the VM shut down but nobody said how the job
        # ended. That is neither success nor the user's failure: recover it.
        failed = [
            i for i in ended if i.state is InstanceState.EXITED and i.exit_code not in (None, 0)
        ]
        preempted = [i for i in ended if i.state is InstanceState.PREEMPTED]
        # A gang's other nodes stop with the noticed one (their ranks agreed to
        # checkpoint and leave); their exit is part of the preemption, not a failure.
        noticed = [i for i in instances if i is not None and i.state is InstanceState.NOTICE]
        done = [i for i in ended if i.state is InstanceState.EXITED and i.exit_code == 0]
        if failed and not preempted and not noticed:
            self._command_failed(job, attempt, failed)
        elif preempted or (noticed and failed):
            preempted = preempted or noticed
            self._finish(
                job,
                attempt=attempt,
                status=JobStatus.RECOVERING,
                end=AttemptEnd.PREEMPTED,
                detail=f"{attempt.pool} preempted {len(preempted)} of {len(instances)} node(s)",
            )
        elif len(done) == len(instances):
            self._finish(
                job,
                attempt=attempt,
                status=JobStatus.SUCCEEDED,
                end=AttemptEnd.SUCCEEDED,
                detail="exit 0",
            )
        elif len(done) == len(ended) and not any(i is None for i in instances):
            return  # some nodes finished first; wait for the rest
        else:
            self._finish(
                job,
                attempt=attempt,
                status=JobStatus.RECOVERING,
                end=AttemptEnd.LOST,
                detail=f"{attempt.pool}: node(s) gone without notice",
            )

    def _with_kept_exits(
        self, job: JobRecord, attempt: AttemptRecord, instances: Sequence[Instance | None]
    ) -> Sequence[Instance | None]:
        """``instances``, with the exits kept beside the checkpoints (:mod:`spotd.exits`)
        by nodes that ended without reporting one, stored as if reported.

        A job that finished while the daemon was down ended on its node all the
        same: its node's word, not the provider's view of a VM taken back later,
        says how.
        """
        reports = attempt_reports(attempt, self._reports(job.id))
        ids = attempt.instance_ids
        unheard = {iid for iid, i in zip(ids, instances, strict=True)
                   if (i is None or i.ended) and _no_exit(reports.get(iid))}  # fmt: skip
        if not unheard:
            return instances
        try:
            kept = kept_exits(checkpoint_uri(job, self.settings), job.id, attempt.seq)
        except CheckpointError as exc:
            log.warning("job %s: cannot read the exits its nodes kept: %s", job.id, exc)
            return instances
        heard = unheard & kept.keys()
        if not heard:
            return instances
        book = StoreReports(self.store)
        for iid in heard:
            notice, exit_ = kept[iid].notice, kept[iid].exit
            if notice is not None:
                book.notice(notice)
            book.exited(exit_)
        log.info("job %s: exits kept by %s while no daemon heard them", job.id, sorted(heard))
        return [
            with_kept_exit(i or _gone(iid, attempt), kept[iid]) if iid in heard else i
            for iid, i in zip(ids, instances, strict=True)
        ]

    def _command_failed(
        self, job: JobRecord, attempt: AttemptRecord, failed: Sequence[Instance]
    ) -> None:
        """The job's command exited non-zero: restart it from its last checkpoint within
        ``retry.max_restarts_on_errors`` (for the codes ``retry.restart_on_exit_codes``
        covers), else fail the job.

        A restart closes the attempt ``user-failed`` and recovers: the next pass
        places the job as after a preemption, resuming from the latest checkpoint.
        """
        detail = "command " + ", ".join(f"on {i.id} exited with {i.exit_code}" for i in failed)
        retry = job.spec.retry
        exits = [i.exit_code for i in failed if i.exit_code is not None]
        restarted = error_exits(self._attempts(job.id))  # this attempt is still open
        if retry.max_restarts_on_errors > 0:
            if not restartable(exits, retry.restart_on_exit_codes):
                listed = ", ".join(map(str, retry.restart_on_exit_codes))
                detail += f" (not restarted: retry.restart_on_exit_codes is {listed})"
            elif restarted >= retry.max_restarts_on_errors:
                detail += f" (restarted {restarted} time(s), retry.max_restarts_on_errors)"
            else:
                detail += (f"; restart {restarted + 1} of {retry.max_restarts_on_errors}, "
                           "from the last checkpoint")  # fmt: skip
                self._finish(job, attempt=attempt, status=JobStatus.RECOVERING,
                             end=AttemptEnd.USER_FAILED, detail=detail)  # fmt: skip
                return
        self._finish(job, attempt=attempt, status=JobStatus.FAILED, end=AttemptEnd.USER_FAILED,
                     detail=detail, failure=FailureCause.USER_COMMAND_FAILED)  # fmt: skip

    def _finish(
        self,
        job: JobRecord,
        *,
        attempt: AttemptRecord,
        status: JobStatus,
        end: AttemptEnd,
        detail: str,
        failure: FailureCause | None = None,
    ) -> None:
        moved = self._move(
            job,
            status,
            str(end),
            detail=detail,
            failure=failure,
            close=AttemptClose(attempt.id, end),
        )
        # Gang: one lost node ends the attempt; stop the rest. The reaper
        # covers a crash between the transition and this call.
        self._settle(moved, attempt)

    # -- limits -------------------------------------------------------------

    def _over_budget(
        self,
        job: JobRecord,
        attempts: Sequence[AttemptRecord],
        now: datetime,
        running: AttemptRecord | None = None,
    ) -> bool:
        budget = job.spec.budget
        if budget is None:
            return False
        spent = self._spent(job, attempts, now)
        if spent < budget.max_usd:
            return False
        close = AttemptClose(running.id, AttemptEnd.OVER_BUDGET) if running else None
        moved = self._move(
            job,
            JobStatus.FAILED,
            "over budget",
            detail=f"spent {spent:,.2f} of {budget.max_usd:,.2f} USD",
            failure=FailureCause.OVER_BUDGET,
            close=close,
        )
        self._settle(moved, running)
        return True

    def _deadline_impossible(self, job: JobRecord, now: datetime) -> bool:
        deadline = job.spec.deadline
        if deadline is None or deadline.finish_by is None or deadline.compute_hours is None:
            return False
        earliest = now + timedelta(hours=deadline.compute_hours)
        if earliest <= deadline.finish_by:
            return False
        moved = self._move(
            job,
            JobStatus.FAILED,
            "deadline impossible",
            detail=f"{deadline.compute_hours:g} h of compute cannot end by "
            f"{deadline.finish_by.isoformat()}",
            failure=FailureCause.DEADLINE_IMPOSSIBLE,
        )
        self._settle(moved, None)
        return True

    def _waited_too_long(self, job: JobRecord, now: datetime) -> bool:
        limit = self.settings.no_capacity_timeout_hours
        if limit is None or now - job.updated_at < timedelta(hours=limit):
            return False
        moved = self._move(
            job,
            JobStatus.FAILED,
            "no capacity",
            detail=f"no offering passed the filters for {limit:g} h",
            failure=FailureCause.NO_CAPACITY,
        )
        self._settle(moved, None)
        return True

    def _say_why(
        self, job: JobRecord, ctx: PlacementContext, shown: OfferingIndex, decision: Decision
    ) -> None:
        """Say why the policy placed the job nowhere (:meth:`_wait`), working the reason
        out again only when what it is made of changed: the market's index (a poll, a
        launch signal), the job (its version: attempts, spend) or its cooldowns. A job
        that waits on the same market costs its placement and nothing more per pass."""
        market = self.market.offerings()
        cooling = self.cooling(job)
        ends = tuple(sorted(until for until, _, _ in cooling.values()))
        said = self._waits.get(job.id)
        if said is not None and said[0] is market and said[1:] == (job.version, ends):
            return
        reason = waiting_reason(ctx, market, decision, cooling=cooling, policy=self.policy.name,
                                spent=len(market) - len(shown))  # fmt: skip
        wrote = self._wait(job, reason)
        self._waits[job.id] = (market, job.version + wrote, ends)

    def _wait(self, job: JobRecord, reason: WaitingReason, cause: str = WAITING_CAUSE) -> bool:
        """Record why the job waits, with an event, when the gist of the reason changed:
        not on every pass it waits for the same one (its figures may move meanwhile).

        The record's own reason is the last one said, by this daemon or another: a
        write bumps the job's version, so the next pass reads the record again.
        """
        if job.waiting is not None and gist_of(job.waiting) == reason.gist:
            return False
        if not self.store.set_waiting(job.id, job.status, reason.text, now=self.clock.now(),
                                      cause=cause):  # fmt: skip
            return False
        if self._pass is not None:
            self._pass.wrote.add(job.id)
        log.info("job %s waits: %s", job.id, reason.text)
        return True

    def _held_by_team(self, job: JobRecord, now: datetime) -> bool:
        """Whether a team limit keeps the pending job back this pass.

        A new reason is the job's waiting reason, written with a ``held`` event
        (pending to pending) once: a steady hold writes nothing.
        """
        if job.spec.team is None or job.spec.team not in self.settings.teams:
            return False
        if self._teams is None:  # stepped outside a pass
            self._teams = TeamBook(self.store, now, self.settings.teams)
        reason = self._teams.hold_reason(job)
        if reason is None:
            return False
        self._wait(job, WaitingReason.of(reason), cause="held")
        return True

    def _every_pool_failed(self, job: JobRecord, attempts: Sequence[AttemptRecord]) -> bool:
        """Fail the job (``launch-failed``) when nothing is left to place it on but pools
        it may no longer use (``retry.launch_failures_per_pool``): it would wait forever.

        Asked only when no offering passed: the policy is asked once more with those
        pools shown, and the job fails only if it would pick one of them.
        """
        per_pool = job.spec.retry.launch_failures_per_pool
        spent = exhausted_pools(attempts, per_pool)
        if not spent:
            return False
        with self._placing:
            choice = self.policy.place(self.context(job), self.market.offerings()).choice
        if choice is None or choice.offering.pool not in spent:
            return False
        pools = ", ".join(sorted(str(p) for p in spent))
        moved = self._move(
            job, JobStatus.FAILED, "launch failed everywhere",
            detail=f"every pool it can use failed {per_pool} launch(es) "
            f"(retry.launch_failures_per_pool): {pools}",
            failure=FailureCause.LAUNCH_FAILED,
        )  # fmt: skip
        self._settle(moved, None)
        return True

    # -- helpers --------------------------------------------------------------

    def _move(
        self,
        job: JobRecord,
        new: JobStatus,
        cause: str,
        *,
        detail: str = "",
        failure: FailureCause | None = None,
        open_: NewAttempt | None = None,
        close: AttemptClose | None = None,
    ) -> JobRecord:
        change = Transition(
            job_id=job.id,
            expected=job.status,
            new=new,
            cause=cause,
            detail=detail,
            failure=failure,
            open_attempt=open_,
            close_attempt=close,
        )
        moved = transition(self.store, change, now=self.clock.now())
        self._forget(job.id)
        # A job that ended is announced by _settle, once its ledger is final.
        log.info("job %s: %s -> %s (%s) %s", job.id, job.status, new, cause, detail)
        return moved

    def _read_attempts(self, held: Mapping[str, int]) -> list[str]:
        """Keep the held jobs' attempts: read again, in one query, only those of jobs
        whose version moved (returned).

        Every change of a job's status or attempts bumps its version, whichever daemon
        or command makes it, so an unchanged version means unchanged attempts. The
        pass's own writes are read back at its end (:meth:`_read_back`).
        """
        stale = self._kept.stale(held)
        for job_id, records in (self.store.attempts_for(stale) if stale else {}).items():
            self._kept.set_attempts(job_id, held[job_id], records)
        return stale

    def _describe_all(self) -> dict[str, dict[str, Instance] | None]:
        """One describe per provider of the nodes of every held job's open attempt (a
        provisioning, running or checkpointing job's); the jobs of nodes that changed
        since the last describe, or are missing, wake."""
        described: dict[str, dict[str, Instance] | None] = {}
        for name, owners in self._kept.nodes.items():
            if name not in self.providers or not owners:
                continue
            described[name] = seen = self._describe_one(self.providers[name], list(owners))
            before = self._seen.get(name, {})
            changed = owners if seen is None else changed_instances(before, seen, owners)
            self._quiet.wake({owners[iid] for iid in changed})
            if seen is not None:
                self._seen[name] = seen
        return described

    @staticmethod
    def _describe_one(provider: Provider, instance_ids: list[str]) -> dict[str, Instance] | None:
        try:
            return {i.id: i for i in provider.describe(instance_ids)}
        except ProviderError as exc:
            log.warning("describe of %d %s instances failed: %s",
                        len(instance_ids), provider.name, exc)  # fmt: skip
        except Exception:
            # An error the adapter failed to map is a bug in it; it must not stall
            # the jobs of every other provider. Its own jobs wait as on a failure.
            log.exception("describe of %d %s instances raised", len(instance_ids), provider.name)
        return None

    def _records(self, held: Mapping[str, int], wanted: set[str]) -> list[JobRecord]:
        """The records of the ``wanted`` held jobs: kept from the last pass at an
        unchanged version, the rest read in one query."""
        kept = self._kept.records
        fresh = {j: kept[j] for j in wanted if j in kept and kept[j].version == held[j]}
        missing = [j for j in wanted if j not in fresh]
        for job_id in missing:
            # Let go of the old record (its spec above all) before its successor is read.
            kept.pop(job_id, None)
        fresh.update(self.store.jobs_by_id(missing) if missing else {})
        return [job for job in fresh.values() if job.status in ACTIVE]

    def _forget_unheld(self, held: Mapping[str, int]) -> None:
        """Drop what is kept of jobs this daemon no longer holds (ended, or taken over)."""
        self._kept.keep_only(held)
        self._reports_kept.keep_only(held)
        self._replans.keep_only(held)
        for kept in (self._bills, self._waits):
            for job_id in kept.keys() - held.keys():
                del kept[job_id]

    def _read_back(self, wrote: set[str]) -> None:
        """Read the attempts of the jobs the pass wrote to, at their new versions: the
        next pass then reads nothing of a job whose only change was this pass's own.
        Versions first: attempts read after them are at least as new."""
        if not wrote:
            return
        versions = self.store.job_versions(wrote)
        for job_id, records in self.store.attempts_for(list(versions)).items():
            self._kept.set_attempts(job_id, versions[job_id], records)
            if self._quiet.versions.get(job_id, versions[job_id]) != versions[job_id]:
                self._quiet.wake([job_id])  # changed elsewhere since it moved to running

    def _settle_quiet(self, job: JobRecord) -> None:
        """After a step that raised nothing: the job is quiet if it runs and the step
        wrote nothing (or it just moved to running with nothing there to act on)."""
        if self._pass is None:
            return  # stepped outside a pass: the next pass steps it
        now = self.clock.now()
        if self._replans.get(job.id) is None:
            # Its re-plan came due (or it was never planned here): the next pass asks.
            self._quiet.wake([job.id])
        elif job.id in self._pass.calm:
            # Its attempts are read back at the pass's end: its budget is weighed next pass.
            due = now if job.spec.budget is not None else None
            self._quiet.settle(job.id, self._pass.calm[job.id], due)
        elif job.status is JobStatus.RUNNING and job.id not in self._pass.wrote:
            # At the version its attempts were read at: a record read later may be newer.
            version = self._kept.versions[job.id]
            self._quiet.settle(job.id, version, self._budget_due(job, now))
        else:
            self._quiet.wake([job.id])

    def _budget_due(self, job: JobRecord, now: datetime) -> datetime | None:
        """When a quiet running job's spend may reach its budget: it is checked then."""
        budget = job.spec.budget
        if budget is None:
            return None
        attempts = self._attempts(job.id)
        under = budget_check_at(lambda t: self._spent(job, attempts, t), budget.max_usd, now)
        return now if under is None else under

    def _nothing_to_run_on(
        self, attempt: AttemptRecord, instances: Sequence[Instance | None]
    ) -> bool:
        """Whether a job just moved to running has nothing its next (running) pass would
        act on: no node under notice, no rebalance warning not weighed yet. Anything
        new (a report, a describe, its version, a re-plan or budget due) wakes it."""
        if any(i is not None and i.state is InstanceState.NOTICE for i in instances):
            return False
        if attempt.id in self._warned:
            return True
        reports = attempt_reports(attempt, self._reports(attempt.job_id))
        return not any(r.notice_kind == "rebalance" for r in reports.values())

    def _attempts(self, job_id: str) -> list[AttemptRecord]:
        if self._pass is not None and job_id in self._pass.attempts:
            return self._pass.attempts[job_id]
        return self.store.attempts(job_id)

    def _reports(self, job_id: str) -> list[InstanceReport]:
        kept = self._reports_kept.of(job_id) if self._pass is not None else None
        return self.store.reports(job_id) if kept is None else kept

    def _described(self, provider: Provider, ids: Sequence[str]) -> dict[str, Instance]:
        if self._pass is not None and provider.name in self._pass.described:
            seen = self._pass.described[provider.name]
            if seen is None:
                raise ProviderUnavailable(
                    f"{provider.name} could not describe its instances this pass",
                    provider=provider.name,
                )
            if all(i in seen for i in ids):
                return seen
        return {i.id: i for i in provider.describe(ids)}

    def _forget(self, job_id: str) -> None:
        """Drop what the pass read of a job: it just changed."""
        self._waits.pop(job_id, None)
        if self._pass is not None:
            self._pass.attempts.pop(job_id, None)
            self._pass.wrote.add(job_id)

    def _require_open(self, job: JobRecord) -> AttemptRecord:
        attempt = open_attempt(self._attempts(job.id))
        if attempt is None:
            raise StoreError(f"job {job.id} is {job.status} but has no open attempt")
        return attempt

    def _settle(self, job: JobRecord, closed: AttemptRecord | None) -> None:
        """After a transition that closed ``closed`` or ended the job: stop the closed
        attempt's nodes, bill the job, and then, for a job that ended, call ``on_end``:
        its ledger is final, so the job-end email carries the job's cost."""
        if closed is not None:
            self._terminate(closed)
        if closed is not None or job.status.terminal:
            self._bill(job)
        if job.status.terminal:
            if self.on_end is not None:
                self.on_end(job)
            # An ended job is never priced again: keep no bill of it for _spent.
            self._bills.pop(job.id, None)

    def _spent(self, job: JobRecord, attempts: Sequence[AttemptRecord], now: datetime) -> float:
        """The job's cost so far by its ledger (:func:`spotd.billing.ledger.spend_so_far`).

        The stored lines are read once per version of the job (a transition or a
        bill changes them, and this engine's bills are kept as they are written):
        a steady pass reads nothing. The open attempt is priced to ``now`` at its
        price at placement, with no read of the price history.
        """
        if not any(not a.open and a.instance_ids for a in attempts):
            return spend_so_far(job, attempts, (), now)  # nothing billed yet: nothing to read
        kept = self._bills.get(job.id)
        if kept is None or kept[0] != job.version:
            billed = self.store.ledger(job_id=job.id)
            covered = {e.attempt for e in billed}
            # Read between another thread's transition and its bill: read again next time.
            if all(a.open or not a.instance_ids or a.seq in covered for a in attempts):
                self._bills[job.id] = (job.version, billed)
            kept = (job.version, billed)
        return spend_so_far(job, attempts, kept[1], now)

    def _bill(self, job: JobRecord) -> None:
        """Rebuild the job's ledger now that one of its attempts ended.

        Instances are priced from the provider's own meter where it keeps one
        (the simulator), else from the launch and end times it reports.
        """
        try:
            attempts = self.store.attempts(job.id)
            usage: dict[str, NodeUsage] = {}
            for a in attempts:
                provider = self.providers.get(a.pool.provider)
                if provider is None or not a.instance_ids:
                    continue
                if isinstance(provider, Metered):
                    usage.update(provider.usage(a.instance_ids))
                else:
                    usage.update(usage_from_instances(provider.describe(a.instance_ids)))
            pools = {a.pool for a in attempts}
            on_demand = {
                o.pool: o.on_demand_price
                for o in self.market.offerings()
                if o.on_demand_price is not None and o.pool in pools
            }
            entries = record_ledger(self.store, job, self.clock.now(),
                                    on_demand_prices=on_demand, usage=usage)  # fmt: skip
            self._bills[job.id] = (job.version, entries)
        except SpotdError as exc:
            log.warning("ledger of %s not updated, the next attempt end retries: %s", job.id, exc)

    def _terminate(self, attempt: AttemptRecord) -> None:
        """Stop a closed attempt's nodes, then delete its placement objects."""
        provider = self.providers[attempt.pool.provider]
        if attempt.instance_ids:
            try:
                provider.terminate(attempt.instance_ids)
            except ProviderError as exc:
                log.warning("terminate of %s failed, the reaper retries: %s",
                            attempt.instance_ids, exc)  # fmt: skip
                return  # its placement still holds the nodes: the reaper deletes both
        self._release(attempt)

    def _release(self, attempt: AttemptRecord) -> None:
        tags = attempt_tags(attempt.job_id, attempt.seq, job_tag=TAG_JOB, attempt_tag=TAG_ATTEMPT)
        release(self.providers[attempt.pool.provider], attempt, tags)

    def _orphaned(self, tags: Mapping[str, str]) -> bool:
        """Whether the attempt named by these tags (an instance's or a placement's) has ended."""
        job_id = tags.get(TAG_JOB, "")
        try:
            attempts = self.store.attempts(job_id)
        except StoreError as exc:
            # Unknown is not orphaned: stopping a healthy run on a locked database
            # loses its work, while a true orphan is only stopped a pass later.
            log.warning("reaper skips %s's objects, its attempts could not be read: %s",
                        job_id, exc)  # fmt: skip
            return False
        owner = next((a for a in attempts if str(a.seq) == tags.get(TAG_ATTEMPT)), None)
        return owner is None or not owner.open


def _no_exit(report: InstanceReport | None) -> bool:
    return report is None or report.exit_code is None


def _gone(instance_id: str, attempt: AttemptRecord) -> Instance:
    """A node the provider no longer lists, as an ended instance of its attempt."""
    return Instance(instance_id, attempt.pool, attempt.market, InstanceState.TERMINATED)
