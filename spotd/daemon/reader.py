"""The read model: what the API, the dashboard, the metrics and ``spotd plan`` read.

They never touch the reconcile loop's engine. They read the store (jobs,
attempts, events, the ledger, the agents' reports), the market as the price
polls left it, and the daemon's clock; their questions to a policy go to a
:class:`Planner` with a policy instance of its own. What they change, they
change by storing: a new job (pending, for the loop to place) or an intent
(:mod:`spotd.core.intents`) that the loop of the daemon holding the job
carries out. So the loop is the one owner of what it holds in memory, and
any daemon on a shared database answers the same from what is stored.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, timedelta, tzinfo

from spotd.billing.ledger import spend_so_far
from spotd.core.clock import clock_note
from spotd.core.contracts import Clock, EngineStore, Policy, Provider
from spotd.core.errors import SubmitRefused
from spotd.core.forecast import OverBudgetAction
from spotd.core.intents import IntentKind, IntentRecord
from spotd.core.spec import JobSpec
from spotd.core.values import (
    Decision,
    InstanceReport,
    JobRecord,
    PlacementContext,
    SubmitWarning,
    SubmitWarningKind,
)
from spotd.daemon.forecasting import ForecastView, forecast_of, forecast_view, over_budget_detail
from spotd.daemon.views import JobView, job_view
from spotd.engine.attempts import cooling_until, open_attempt
from spotd.engine.context import placement_context
from spotd.engine.drills import drill_refusal
from spotd.engine.placing import shown_to
from spotd.engine.retrying import retry
from spotd.engine.settings import EngineSettings
from spotd.engine.submission import notify_warnings, submit
from spotd.engine.waiting import Cooling, submit_warning
from spotd.market.cache import MarketCache
from spotd.market.stats import HistoryStats
from spotd.registry import load_policy


@dataclass(frozen=True, slots=True)
class Answer:
    """A policy's answer for a submitted job: what it was shown, and why it chose."""

    policy: str
    ctx: PlacementContext
    decision: Decision
    cooling: Cooling
    reports: Sequence[InstanceReport] = ()
    """The job's agents' reports the context was built from."""


class Planner:
    """The readers' own policy, asked what the loop's would decide (``spotd plan JOB``)
    and whether a new job could ever run (the submit warning).

    Its figures are the loop's: the same context builder
    (:func:`spotd.engine.context.placement_context`) over the job's stored attempts,
    reports and ledger, the same market and the same history statistics.
    """

    def __init__(
        self,
        policy: Policy,
        store: EngineStore,
        market: MarketCache,
        clock: Clock,
        settings: EngineSettings,
    ) -> None:
        self.policy = policy
        self._store = store
        self._market = market
        self._clock = clock
        self._settings = settings
        window = timedelta(hours=settings.stats_window_hours)
        self._stats = HistoryStats(store, now=clock.now(), window=window)
        self._lock = threading.Lock()
        """One question at a time: a policy may keep per-job state, and the API asks
        from several threads."""

    def ask(self, job: JobRecord, policy_name: str | None = None) -> Answer:
        """What the daemon's policy (or the installed ``policy_name``) would choose for
        the submitted job now, from what is stored of it."""
        policy = self.policy
        if policy_name is not None and policy_name != policy.name:
            policy = load_policy(policy_name)
        now = self._clock.now()
        attempts = self._store.attempts(job.id)
        reports = self._store.reports(job.id)
        offerings = self._market.offerings()
        with self._lock:
            ctx = placement_context(
                job.id, job.spec, now,
                attempts=attempts,
                reports=reports,
                pools=(o.pool for o in offerings),
                cooldown_hours=self._settings.cooldown_hours,
                changeover_hours=self._settings.changeover_hours,
                spent_usd=spend_so_far(job, attempts, self._store.ledger(job_id=job.id), now),
                stats=self._stats.at(now),
            )  # fmt: skip
            decision = policy.place(ctx, shown_to(job, attempts, offerings))
        base = timedelta(hours=self._settings.cooldown_hours)
        return Answer(policy.name, ctx, decision, cooling_until(attempts, now, base), reports)

    def forecast(self, job: JobRecord) -> ForecastView | None:
        """The job's cost to finish and finish time, with their P90
        (:mod:`spotd.daemon.forecasting`); None for an ended job or one of unknown size."""
        if job.status.terminal:
            return None
        answer = self.ask(job)
        return forecast_view(forecast_of(answer.ctx, answer.decision, answer.reports))

    def to_finish(self, job: JobRecord) -> tuple[float, float] | None:
        """The job's expected spend to its end and its P90 in USD, for reports; None
        where :meth:`forecast` has none."""
        view = self.forecast(job)
        return None if view is None else (view.expected_usd, view.p90_usd)

    def budget_warning(self, spec: JobSpec) -> str | None:
        """Why a new job's forecast exceeds its ``budget.max_usd``, with the figures; None
        when it has no budget, fits it, or its size or the market cannot tell yet."""
        if spec.budget is None or self._market.offered_gpus() is None:
            return None
        offerings = self._market.offerings()
        # Asked without its budget: a policy excludes what the budget cannot pay for, and
        # the question is what the job would cost where the policy would run it.
        unbounded = spec.model_copy(update={"budget": None})
        ctx = placement_context(
            "submit", unbounded, self._clock.now(),
            pools=(o.pool for o in offerings),
            changeover_hours=self._settings.changeover_hours,
            stats=self._stats.at(self._clock.now()),
        )  # fmt: skip
        with self._lock:
            decision = self.policy.place(ctx, offerings)
        view = forecast_view(forecast_of(ctx, decision, ()))
        return None if view is None else over_budget_detail(view, 0.0, spec.budget.max_usd)

    def submit_warning(self, spec: JobSpec) -> str | None:
        """Why no offering of the market as it stands can ever run the job (its GPUs per
        node, fabric, providers, regions or markets: never its budget, prices or the
        capacity of now), or None. A warning, not a refusal: the market may change.
        None too before every provider has answered a price poll."""
        if self._market.offered_gpus() is None:
            return None  # nobody can tell yet, and a submit must not wait for a poll
        offerings = self._market.offerings()
        ctx = placement_context(
            "submit", spec, self._clock.now(),
            pools=(o.pool for o in offerings),
            changeover_hours=self._settings.changeover_hours,
        )  # fmt: skip
        with self._lock:
            decision = self.policy.place(ctx, offerings)
        return submit_warning(ctx, offerings, decision)


@dataclass(frozen=True, slots=True)
class Reader:
    """The parts the readers and the writers of intents share with the loop, none of
    them the loop's own: the store, the polled market, the clock, the settings, the
    providers (for the nodes' logs) and a :class:`Planner`; and the zone times are
    shown to people in (``[display] timezone``)."""

    store: EngineStore
    market: MarketCache
    clock: Clock
    settings: EngineSettings
    providers: Mapping[str, Provider]
    planner: Planner
    zone: tzinfo = UTC
    can_email: bool = False
    """Whether the daemon sends email (its ``[email]`` names an SMTP host)."""

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> JobRecord:
        """Store a new job, pending: the next pass of a daemon places it.
        :class:`~spotd.core.errors.SubmitRefused`, and nothing stored, for a job no
        daemon here could ever run (:func:`spotd.engine.submission.refusal`)."""
        if self.settings.forecast_over_budget is OverBudgetAction.REFUSE:
            over = self.planner.budget_warning(spec)
            if over is not None:
                raise SubmitRefused(
                    f"budget.max_usd: {over} ([scheduling] forecast_over_budget = \"refuse\")",
                    field="budget.max_usd",
                )
        return submit(self.store, spec, now=self.clock.now(), offered=self.market.offered_gpus(),
                      idempotency_key=idempotency_key)  # fmt: skip

    def submit_warnings(self, spec: JobSpec) -> list[SubmitWarning]:
        """What a stored job asks that will not happen as asked: no offering of the
        market can run it (:meth:`Planner.submit_warning`), or its ``notify`` cannot be
        carried out here (:func:`spotd.engine.submission.notify_warnings`)."""
        found = notify_warnings(spec, can_email=self.can_email)
        market = self.planner.submit_warning(spec)
        if market is not None:
            found.insert(0, SubmitWarning(SubmitWarningKind.MARKET, market))
        elif self.settings.forecast_over_budget is OverBudgetAction.WARN and (
            over := self.planner.budget_warning(spec)
        ) is not None:
            # Under "refuse", submit asked this already: a stored job fits its budget.
            found.insert(0, SubmitWarning(SubmitWarningKind.OVER_BUDGET, over))
        return found

    def view(self, job: JobRecord) -> JobView:
        """The job as stored: attempts, reports, ledger, and what is asked of it still."""
        store = self.store
        return job_view(
            job, store.attempts(job.id), self.clock.now(), store.reports(job.id),
            ledger=store.ledger(job_id=job.id), asked=store.open_intents([job.id]).get(job.id, ()),
            zone=self.zone, clock=clock_note(self.clock), forecast=self.planner.forecast(job),
        )  # fmt: skip

    def ask(self, job: JobRecord, kind: IntentKind, *, priority: int | None = None) -> IntentRecord:
        """Store an intent for the loop of the daemon that holds ``job``."""
        return self.store.request_intent(job.id, kind, at=self.clock.now(), priority=priority)

    def drill(self, job: JobRecord, node: int) -> IntentRecord:
        """Ask for node ``node`` (a rank) of the running ``job`` to be drilled by its
        provider (:mod:`spotd.engine.drills`); DrillRefused, or RequestInvalid for a rank
        it lacks, when it cannot have one now."""
        attempt = open_attempt(self.store.attempts(job.id))
        provider = self.providers.get(attempt.pool.provider) if attempt is not None else None
        drill_refusal(job, attempt, node, provider)
        return self.store.request_intent(job.id, IntentKind.DRILL, at=self.clock.now(), node=node)

    def retry(self, job: JobRecord) -> JobRecord:
        """Retry the failed or cancelled ``job`` (:func:`spotd.engine.retrying.retry`): the
        one change a request makes itself, since an ended job has no loop to act on an
        intent; the next pass of a daemon places it."""
        return retry(self.store, job.id, now=self.clock.now())
