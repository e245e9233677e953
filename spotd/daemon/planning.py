"""``spotd plan``: what a policy would choose for a job, and why, without launching.

A job file is planned here, as a new job (:func:`plan_job`); a submitted job
from what the store holds of it, with its cooldowns, placement and progress
(:func:`plan_submitted`, behind ``GET /v1/jobs/{ref}/plan``, asking the
daemon's :class:`~spotd.daemon.reader.Planner`). Both build the
policy's context with :func:`spotd.engine.context.placement_context`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel

from spotd.core.errors import SpotdError
from spotd.core.fabric_env import fabric_environment
from spotd.core.spec import JobSpec
from spotd.core.values import (
    Candidate,
    Decision,
    ExclusionKind,
    JobRecord,
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
    policy: str, ctx: PlacementContext, decision: Decision, cooling: Cooling | None = None
) -> PlanView:
    """The view of a decision, with the fabric environment and preflight floor of its
    choice and its exclusions by kind (``cooling``: the job's cooldowns, with their ends)."""
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
    )


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
    return plan_view(name, ctx, decision)


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
    return plan_view(answer.policy, answer.ctx, answer.decision, answer.cooling)
