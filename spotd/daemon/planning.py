"""``spotd plan``: what a policy would choose for a job, and why, without launching.

A job file is planned here, as a new job (:func:`plan_job`); a submitted job
from what the store holds of it, with its cooldowns, placement and progress
(:func:`plan_submitted`, behind ``GET /v1/jobs/{ref}/plan``, asking the
daemon's :class:`~spotd.daemon.reader.Planner`). Both build the
policy's context with :func:`spotd.engine.context.placement_context`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel

from spotd.core.errors import SpotdError
from spotd.core.fabric_env import fabric_environment
from spotd.core.network import Fabric
from spotd.core.outlook import CostBasis, DeadlineVerdict, outlook
from spotd.core.spec import JobSpec
from spotd.core.values import (
    Candidate,
    Decision,
    ExclusionKind,
    JobRecord,
    JobStatus,
    Market,
    Offering,
    PlacementContext,
)
from spotd.daemon.config import Settings
from spotd.daemon.wiring import build_providers
from spotd.engine.context import placement_context
from spotd.engine.gang import preflight_threshold
from spotd.engine.waiting import Cooling, exclusion_groups
from spotd.market.cache import MarketCache
from spotd.market.stats import HistoryStats
from spotd.registry import load_policy
from spotd.store import open_store

if TYPE_CHECKING:
    from spotd.daemon.reader import Planner


class InterconnectView(BaseModel):
    fabric: str
    gbps_per_gpu: float


class CandidateView(BaseModel):
    """One way to run the job, with its cost breakdown or why it is excluded."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpus_per_node: int
    nodes: int
    interconnect: InterconnectView
    market: str
    price_per_hour: float
    expected_cost_usd: float
    excluded: str | None
    """Why it is excluded, as a person reads it; None for a usable candidate."""
    excluded_kind: ExclusionKind | None = None
    """Which rule excluded it (``spotd.core.values.ExclusionKind``); None for a usable one."""
    breakdown: dict[str, float]


class ExclusionGroupView(BaseModel):
    """How many candidates one kind of rule excluded, and what they have in common."""

    kind: ExclusionKind
    count: int
    summary: str
    """E.g. ``over the 5.00 USD budget (cheapest 7.20 USD)``."""


class CoversView(BaseModel):
    """What each candidate's expected cost pays for: compute hours on the job's
    reference setup, which each offering does at its own speed."""

    basis: CostBasis
    compute_hours: float
    """Compute hours covered: the work left, or 1 (``one-hour``)."""
    reference_gpu: str
    """The job's first GPU model: a compute hour is an hour on it."""
    reference_fabric: str | None
    """``infiniband`` for a multi-node job, the fabric a compute hour is taken on; None
    for one node, where the fabric does not count."""
    nodes: int
    gpus_per_node: int


class DeadlineView(BaseModel):
    """The plan against ``deadline.finish_by`` (:mod:`spotd.core.outlook`)."""

    finish_by: datetime
    hours_left: float
    """Hours from now (the market's clock) to ``finish_by``; negative once it passed."""
    verdict: DeadlineVerdict | None
    """None without ``deadline.compute_hours``: there is no work to weigh."""
    slack_hours: float | None
    """``hours_left`` less ``expected_hours``: negative, the hours it would be late by."""
    expected_hours: float | None
    """Wall hours the policy expects the work left to take on its choice (preemptions,
    checkpoint writes, changeover and checkpoint move included); with no choice, the
    work left at reference speed and a changeover."""
    margin_hours: float | None
    """Slack under which the verdict is ``at-risk``: one more changeover and, on spot,
    a whole checkpoint interval lost to a preemption (the default policy's nets)."""
    fails_at_once: bool = False
    """A pending job whose ``compute_hours`` cannot end by ``finish_by`` even started now:
    the engine fails it on its first pass (``deadline-impossible``)."""


class PlanView(BaseModel):
    """The policy's choice (None when nothing passes) and every candidate, ranked.

    ``environment`` and the preflight figures are those of the choice: what its
    gang would get from spotd's fabric table and the job's ``[fabric_env]``
    (the job's own ``[env]`` is set over it at launch). All None without a choice.
    """

    policy: str
    job: str
    choice: CandidateView | None
    candidates: list[CandidateView]
    environment: dict[str, str] | None = None
    """Fabric variables for the choice (``spotd.core.fabric_env.fabric_environment``)."""
    preflight_min_busbw_gbps: float | None = None
    """All-reduce bus bandwidth (GB/s) the gang's preflight must exceed; None for no floor."""
    preflight_threshold_source: str | None = None
    """Where that floor comes from: ``spec``, ``fabric``, ``none`` (no floor) or ``disabled``."""
    exclusions: list[ExclusionGroupView] = []
    """The excluded candidates by kind of rule, most first (empty from an older daemon)."""
    covers: CoversView | None = None
    """What the expected figures are for (None from an older daemon)."""
    deadline: DeadlineView | None = None
    """The verdict on ``deadline.finish_by``; None without one (or from an older daemon)."""


def candidate_view(c: Candidate) -> CandidateView:
    """The view of one candidate."""
    o = c.offering
    return CandidateView(
        provider=o.pool.provider,
        region=o.pool.region,
        zone=o.pool.zone,
        instance_type=o.pool.instance_type,
        gpu=o.gpu,
        gpus_per_node=o.gpus_per_node,
        nodes=c.nodes,
        interconnect=InterconnectView(
            fabric=str(o.interconnect.fabric), gbps_per_gpu=o.interconnect.gbps_per_gpu
        ),
        market=str(c.market),
        price_per_hour=round(c.price_per_hour, 6),
        expected_cost_usd=round(c.expected_cost_usd, 6),
        excluded=c.excluded.detail if c.excluded else None,
        excluded_kind=c.excluded.kind if c.excluded else None,
        breakdown={k: round(v, 6) for k, v in c.breakdown.items()},
    )


def plan_view(
    policy: str,
    ctx: PlacementContext,
    decision: Decision,
    cooling: Cooling | None = None,
    *,
    pending: bool = False,
) -> PlanView:
    """The view of a decision, with the fabric environment and preflight floor of its
    choice, its exclusions by kind (``cooling``: the job's cooldowns, with their ends),
    what its figures cover and its deadline verdict (``pending``: the job is yet to
    start, so the engine's rule for an impossible deadline applies)."""
    spec = ctx.spec
    env: dict[str, str] | None = None
    threshold: float | None = None
    source: str | None = None
    if decision.choice is not None:
        offering = decision.choice.offering
        env = fabric_environment(
            offering.interconnect,
            spec.fabric_env,
            nodes=spec.resources.nodes,
            instance_type=offering.pool.instance_type,
        )
        threshold, source = preflight_floor(spec, offering)
    excluded = [c for c in decision.candidates if c.excluded is not None]
    groups = [
        ExclusionGroupView(kind=g.kind, count=g.count, summary=g.summary)
        for g in exclusion_groups(excluded, ctx, cooling=cooling or {})
    ]
    return PlanView(
        policy=policy,
        job=spec.name,
        choice=candidate_view(decision.choice) if decision.choice else None,
        candidates=[candidate_view(c) for c in decision.candidates],
        environment=env,
        preflight_min_busbw_gbps=threshold,
        preflight_threshold_source=source,
        exclusions=groups,
        covers=covers_view(ctx),
        deadline=deadline_view(ctx, decision.choice, pending=pending),
    )


def work_left_hours(ctx: PlacementContext) -> float | None:
    """Compute hours the job has left on its reference setup; None when the spec gives
    no ``compute_hours`` (the policies then price one hour of work:
    ``spotd_policies.costmodel.remaining_hours``)."""
    deadline = ctx.spec.deadline
    if deadline is None or deadline.compute_hours is None:
        return None
    return max(0.0, deadline.compute_hours - ctx.done_hours)


def covers_view(ctx: PlacementContext) -> CoversView:
    """What the plan's expected figures pay for."""
    left = work_left_hours(ctx)
    resources = ctx.spec.resources
    return CoversView(
        basis=CostBasis.ONE_HOUR if left is None else CostBasis.WORK_LEFT,
        compute_hours=round(1.0 if left is None else left, 4),
        reference_gpu=resources.gpus[0],
        reference_fabric=str(Fabric.INFINIBAND) if resources.nodes > 1 else None,
        nodes=resources.nodes,
        gpus_per_node=resources.gpus_per_node,
    )


def deadline_view(
    ctx: PlacementContext, choice: Candidate | None, *, pending: bool
) -> DeadlineView | None:
    """The plan's verdict on ``deadline.finish_by`` from the policy's figures for its
    choice (:func:`spotd.core.outlook.outlook`); None without a ``finish_by``."""
    deadline = ctx.spec.deadline
    if deadline is None or deadline.finish_by is None:
        return None
    hours_left = (deadline.finish_by - ctx.now).total_seconds() / 3600
    work = work_left_hours(ctx)
    if work is None:
        return DeadlineView(
            finish_by=deadline.finish_by, hours_left=round(hours_left, 4), verdict=None,
            slack_hours=None, expected_hours=None, margin_hours=None,
        )  # fmt: skip
    if choice is None:
        expected = fastest = work + ctx.changeover_hours
        margin = ctx.changeover_hours
    else:
        expected, fastest, margin = _choice_hours(choice, work, ctx.changeover_hours)
    seen = outlook(hours_left=hours_left, expected_hours=expected, fastest_hours=fastest,
                   margin_hours=margin, placed=choice is not None)  # fmt: skip
    # The engine's own rule (spotd.engine.judge.deadline_impossible): a job yet to start
    # whose compute hours do not fit before finish_by fails at once, whatever the choice.
    fails = pending and hours_left < work
    verdict = DeadlineVerdict.CANNOT_MEET if fails else seen.verdict
    return DeadlineView(
        finish_by=deadline.finish_by,
        hours_left=round(hours_left, 4),
        verdict=verdict,
        slack_hours=round(seen.slack_hours, 4),
        expected_hours=round(expected, 4),
        margin_hours=round(margin, 4),
        fails_at_once=fails,
    )


def _choice_hours(choice: Candidate, work: float, changeover: float) -> tuple[float, float, float]:
    """(expected, fastest, margin) hours for the choice, from its breakdown: the
    policy's expected hours, the same with no preemption, and the margin its nets keep.
    A policy that gives fewer figures (``cheapest``: ``hours``) is read as far as it goes.
    """
    b = choice.breakdown
    expected = b.get("expected_hours", b.get("hours", work))
    fastest = expected
    if "work_hours" in b:
        fastest = b["work_hours"] + b.get("changeover_hours", 0.0) + b.get("migration_hours", 0.0)
    spot = choice.market is Market.SPOT
    margin = changeover + (b.get("checkpoint_interval_hours", 0.0) if spot else 0.0)
    return expected, fastest, margin


def preflight_floor(spec: JobSpec, offering: Offering) -> tuple[float | None, str]:
    """The bus bandwidth floor (GB/s) the gang's preflight would be held to, and its source.

    The figure :func:`spotd.engine.gang.preflight_threshold` hands the gang (``spec``,
    ``fabric``, or ``none`` where there is none); ``disabled`` with the preflight off.
    """
    if not spec.preflight.enabled:
        return None, "disabled"
    floor, source = preflight_threshold(spec, offering)
    return floor, source if floor is not None else "none"


def plan_job(spec: JobSpec, settings: Settings, policy_name: str | None = None) -> PlanView:
    """Poll the enabled providers and ask the policy, with the store's pool history.

    The job is new: not running, nothing spent or done, no attempts to cool a pool.
    """
    name = policy_name or settings.scheduling.policy
    policy = load_policy(name)
    clock, providers = build_providers(settings)
    market = MarketCache(providers)
    market.refresh_all()
    now = clock.now()
    store = open_store(settings.db_url)
    try:
        stats = HistoryStats(
            store, now=now, window=timedelta(hours=7 * 24), ttl_seconds=float("inf")
        )
        offerings = market.offerings()
        ctx = placement_context(
            f"plan-{spec.name}",
            spec,
            now,
            pools=(o.pool for o in offerings),
            cooldown_hours=settings.scheduling.cooldown_hours,
            changeover_hours=settings.scheduling.changeover_hours,
            stats=stats,
        )
        decision = policy.place(ctx, offerings)
    finally:
        store.close()
    return plan_view(name, ctx, decision, pending=True)


def plan_submitted(planner: Planner, job: JobRecord, policy_name: str | None = None) -> PlanView:
    """What the daemon would choose for a submitted job now, and why.

    The loop's context (the job's cooldowns, where it runs, its progress and
    spend, as stored), market and policy; ``policy_name`` asks another installed
    one the same question. A job that has ended is placed no more: refused.
    """
    if job.status.terminal:
        raise SpotdError(
            f"job {job.id} has ended ({job.status}): the daemon places it no more; "
            "`spotd plan` of its job file asks as for a new job"
        )
    answer = planner.ask(job, policy_name)
    return plan_view(answer.policy, answer.ctx, answer.decision, answer.cooling,
                     pending=job.status is JobStatus.PENDING)  # fmt: skip
