"""From a scenario's job and timeline to the discrete :class:`~spotd.simulate.model.World`.

Rounding (documented in ``docs/benchmarks.md``): compute hours round up to
whole ticks, the changeover rounds up to whole ticks, the deadline rounds
down; in the full model efficiencies round to the scenario's
``progress_quantum`` so that progress stays an integer the DP can index.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from spotd.core.cadence import saves_on_notice
from spotd.core.facts import FABRIC_EFFICIENCY, REFERENCE_FABRIC_EFFICIENCY
from spotd.core.network import Interconnect
from spotd.core.spec import CheckpointSpec, DeadlineSpec, JobSpec, MarketMode, MarketSpec, Resources
from spotd.core.values import Offering, Pool
from spotd.market.catalog import facts, interconnect, notice_seconds
from spotd.simulate.model import World
from spotd.simulate.scenario import CostModel, JobEntry, OfferingEntry, Scenario, ScenarioError
from spotd.simulate.timeline import Timeline
from spotd_policies.filters import min_gbps_per_gpu

__all__ = ["EPOCH", "Prepared", "prepare"]

log = logging.getLogger(__name__)

EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
"""Tick 0 of every timeline on the simulated clock (only differences matter)."""

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Prepared:
    """A job ready to replay: its world, the product's view of the offerings, its start points."""

    job: JobEntry
    world: World
    offerings: tuple[Offering, ...]
    """As product policies see them (capacity left None; the adapter sets it per tick)."""
    spec: JobSpec
    """The job for product policies; the adapter sets ``deadline.finish_by`` per start."""
    starts: tuple[int, ...]


def _offering(entry: OfferingEntry, spot: float, od: float) -> Offering:
    known = facts(entry.provider, entry.instance_type)
    gpus = entry.gpus_per_node or (known.gpus_per_node if known else 1)
    return Offering(
        pool=Pool(entry.provider, entry.region, entry.zone, entry.instance_type),
        gpu=(entry.gpu or (known.gpu if known else "GPU")).upper(),
        gpus_per_node=gpus,
        gpu_memory_gb=entry.gpu_memory_gb or (known.gpu_memory_gb if known else 16),
        interconnect=_interconnect(entry, gpus),
        spot_price=spot,
        on_demand_price=od,
        notice_seconds=_notice(entry),
    )


def _interconnect(entry: OfferingEntry, gpus: int) -> Interconnect:
    """The entry's fabric and bandwidth, looked up only where it leaves one out (the
    lookup warns on unknown instance types)."""
    if entry.fabric is not None and entry.gbps_per_gpu is not None:
        return Interconnect(entry.fabric, entry.gbps_per_gpu)
    looked = interconnect(entry.provider, entry.instance_type, gpus)
    return Interconnect(entry.fabric or looked.fabric, entry.gbps_per_gpu or looked.gbps_per_gpu)


def _notice(entry: OfferingEntry) -> int:
    if entry.notice_seconds is not None:
        return entry.notice_seconds
    return notice_seconds(entry.provider)


def _spec(job: JobEntry, offerings: list[Offering], gpus_per_node: int) -> JobSpec:
    gpus = tuple(dict.fromkeys(o.gpu for o in offerings))
    return JobSpec(
        name="sim-job",
        command=("train",),
        resources=Resources(
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            nodes=job.nodes,
            model_size_b=job.model_size_b,
            min_gbps_per_gpu=job.min_gbps_per_gpu,
        ),
        market=MarketSpec(type=MarketMode.AUTO),
        checkpoint=CheckpointSpec(
            size_gb=max(job.checkpoint_gb, 0.001), on_notice=job.checkpoint_on_notice
        ),
        deadline=DeadlineSpec(compute_hours=job.compute_hours),
    )


def _efficiency(entry: OfferingEntry, off: Offering, nodes: int, need_gbps: float) -> float:
    if entry.efficiency is not None:
        return entry.efficiency
    if nodes <= 1:
        return 1.0  # one node trains over NVLink: the fabric does not matter
    # The product's own figures, so the policies and the world agree.
    share = FABRIC_EFFICIENCY[off.interconnect.fabric]
    if need_gbps > 0:
        share *= min(1.0, off.interconnect.gbps_per_gpu / need_gbps)
    return share


def prepare(scenario: Scenario, timeline: Timeline, job: JobEntry, source: str, *,
            starts: int | None = None, seed: int | None = None,
            within: tuple[int, int] | None = None) -> Prepared:
    """Turn one job of the scenario into a world; :class:`ScenarioError` if it cannot run.

    ``within`` (first tick, end tick) draws the start points so that every job's
    whole deadline window lies in those ticks (a half of the timeline, say);
    by default anywhere on the timeline.
    """
    g = timeline.tick_hours
    full = scenario.cost_model is CostModel.FULL
    k = scenario.on_demand_ratio
    offerings = [
        _offering(e, e.spot_price or 0.0, e.on_demand_price or 0.0) if full
        else _offering(e, 1.0, k)
        for e in scenario.offerings
    ]
    home = scenario.home_index
    gpn = job.gpus_per_node or offerings[home].gpus_per_node
    spec = _spec(job, offerings, gpn)
    need_gbps = min_gbps_per_gpu(spec)
    eligible = tuple(
        i for i, o in enumerate(offerings)
        if o.gpus_per_node == gpn and o.interconnect.gbps_per_gpu >= need_gbps
    )
    where = f"jobs.{job.name}"
    if home not in eligible:
        raise ScenarioError(source, [
            f"{where}: the home offering {scenario.offerings[home].label} does not fit the job "
            f"({gpn} GPUs per node, {need_gbps:g} Gbps/GPU scale-out needed)"
        ])
    q = round(1 / scenario.progress_quantum) if full else 1
    effs = [_efficiency(e, o, job.nodes, need_gbps) if full else 1.0
            for e, o in zip(scenario.offerings, offerings, strict=True)]
    # compute_hours is the time at the reference efficiency (spotd.core.facts): the
    # meaning the job spec and the policies give it.
    fastest = REFERENCE_FABRIC_EFFICIENCY if full and job.nodes > 1 else 1.0
    rates = tuple(max(1, round(eff / fastest * q)) for eff in effs)
    need = math.ceil(job.compute_hours / g - _EPS) * q
    window = math.floor(job.window_hours / g + _EPS)
    changeover = math.ceil(job.changeover_hours / g - _EPS)
    providers = list(dict.fromkeys(e.provider for e in scenario.offerings))
    world = World(
        avail=timeline.values >= job.nodes,
        labels=tuple(e.label for e in scenario.offerings),
        tick_hours=g,
        spot_cost=tuple((o.spot_price or 0.0) * job.nodes * g for o in offerings),
        od_cost=tuple((o.on_demand_price or 0.0) * job.nodes * g for o in offerings),
        rate=rates,
        provider=tuple(providers.index(e.provider) for e in scenario.offerings),
        egress=tuple(
            scenario.egress_usd_per_gb.get(p, 0.0) * job.checkpoint_gb if full else 0.0
            for p in providers
        ),
        need=need,
        window=window,
        changeover=changeover,
        ckpt_every=max(1, round(job.checkpoint_interval_hours / g)) if full else None,
        notice_saves=tuple(full and saves_on_notice(spec, o.notice_seconds) for o in offerings),
        home=home,
        eligible=eligible,
        compute_hours=job.compute_hours,
        rows=(timeline.values >= job.nodes).T.tolist(),
    )
    if not world.avail[list(eligible)].any():
        # Valid, but likely a slip (--nodes above what the traces count): say so.
        log.warning(
            "%s: %s needs %d node(s) and no trace of its offerings ever shows that many "
            "up: it can only run on-demand", source, where, job.nodes,
        )
    od = world.best_on_demand(eligible)
    if world.od_ticks(world.offering(od)) > window:
        raise ScenarioError(source, [
            f"{where}: the deadline leaves no time for even an on-demand run "
            f"({job.compute_hours:g} h of compute + {job.changeover_hours:g} h changeover)"
        ])
    first, end = (0, timeline.ticks) if within is None else within
    span = min(end, timeline.ticks) - first - window + 1
    if span < 1:
        raise ScenarioError(source, [
            f"{where}: the traces ({(min(end, timeline.ticks) - first) * g:.1f} h) are "
            f"shorter than the deadline ({job.window_hours:g} h)"
        ])
    rng = np.random.default_rng(job.seed if seed is None else seed)
    drawn = first + rng.integers(0, span, size=job.starts if starts is None else starts)
    return Prepared(
        job, world, tuple(offerings), _policy_view(spec, job, full),
        tuple(sorted(int(s) for s in drawn)),
    )


def _policy_view(spec: JobSpec, job: JobEntry, full: bool) -> JobSpec:
    """The job as product policies are shown it.

    In the reference model a gang is priced and timed as one unit at every
    fabric (the paper's setting), so policies see a one-node job: they would
    otherwise slow it down for a fabric the world does not charge for; and
    preemptions come without notice (the changeover stands for all they
    cost), so the job does not checkpoint on one. In the full model they see
    the checkpoint interval the world uses.
    """
    if not full:
        resources = spec.resources.model_copy(update={"nodes": 1, "min_gbps_per_gpu": None})
        checkpoint = spec.checkpoint.model_copy(update={"on_notice": False})
        return spec.model_copy(update={"resources": resources, "checkpoint": checkpoint})
    interval = timedelta(hours=job.checkpoint_interval_hours)
    checkpoint = spec.checkpoint.model_copy(update={"interval": interval})
    return spec.model_copy(update={"checkpoint": checkpoint})
