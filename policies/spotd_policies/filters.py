"""Hard filters shared by the policies, each giving the reason it excludes an offering
(an :class:`~spotd.core.values.Exclusion`: the kind, for code, and the detail, for people).

Figures: minimum scale-out bandwidth per GPU by model size (practitioner rule
of 2026): up to the 7B class 200 Gbps, above it up to 30B 400 Gbps, over 30B
800 Gbps.
A one-node job needs no scale-out fabric (NVLink inside the node).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spotd.core.spec import JobSpec, MarketMode
from spotd.core.values import Exclusion, ExclusionKind, Market, Offering, PlacementContext


def min_gbps_per_gpu(spec: JobSpec) -> float:
    """Scale-out bandwidth per GPU the job needs; 0 for a one-node job."""
    res = spec.resources
    if res.nodes <= 1:
        return 0.0
    if res.min_gbps_per_gpu is not None:
        return res.min_gbps_per_gpu
    size = res.model_size_b
    # "7B" models sit on the boundary (Llama 2 7B has 6.7B parameters): the
    # 7B class still counts as small and gets by with 200 Gbps.
    if size is None or size <= 7:
        return 200.0
    if size <= 30:
        return 400.0
    return 800.0


def markets_for(spec: JobSpec) -> tuple[Market, ...]:
    """Markets the job's spec allows."""
    mode = spec.market.type
    if mode is MarketMode.SPOT:
        return (Market.SPOT,)
    if mode is MarketMode.ON_DEMAND:
        return (Market.ON_DEMAND,)
    return (Market.SPOT, Market.ON_DEMAND)


Filter = Callable[[PlacementContext, Offering, Market], Exclusion | None]

K = ExclusionKind


def gpu_model(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded where the offering's GPU is not one the job accepts."""
    wanted = ctx.spec.resources.gpus
    if off.gpu.upper() not in wanted:
        return Exclusion(K.GPU_MODEL, f"GPU {off.gpu} is not one of {', '.join(wanted)}")
    return None


def gpus_per_node(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded where a node has another number of GPUs than the job asks."""
    wanted = ctx.spec.resources.gpus_per_node
    if off.gpus_per_node != wanted:
        return Exclusion(K.GPUS_PER_NODE, f"{off.gpus_per_node} GPUs per node, job needs {wanted}")
    return None


def provider_allowed(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded where ``market.providers`` does not match the provider."""
    if not ctx.spec.allows_provider(off.pool.provider):
        return Exclusion(
            K.PROVIDER, f"provider {off.pool.provider} not allowed by market.providers"
        )
    return None


def region_allowed(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded where ``market.regions`` does not match the region."""
    if not ctx.spec.allows_region(off.pool.region):
        return Exclusion(K.REGION, f"region {off.pool.region} not allowed by market.regions")
    return None


def sold(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded where the offering has no price in this market."""
    if off.price(market) is None:
        return Exclusion(K.NOT_SOLD, f"not sold as {market}")
    return None


def spot_capacity(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded on spot where the provider's capacity signal says none is left."""
    # Gang scheduling: the signal is for the pool, and all nodes go in one zone.
    if market is Market.SPOT and off.capacity is not None and off.capacity <= 0:
        return Exclusion(K.NO_CAPACITY, "no spot capacity now (provider's capacity signal is 0)")
    return None


def fabric(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded where the interconnect is slower than the job's size needs."""
    need = min_gbps_per_gpu(ctx.spec)
    have = off.interconnect.gbps_per_gpu
    if have < need:
        return Exclusion(
            K.FABRIC,
            f"{off.interconnect.fabric} at {have:g} Gbps/GPU is under the {need:g} Gbps/GPU "
            f"a {ctx.spec.resources.nodes}-node job of this model size needs",
        )
    return None


def price_cap(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded where the price per GPU-hour is over ``market.max_price_per_gpu_hour``."""
    cap = ctx.spec.market.max_price_per_gpu_hour
    price = off.price(market)
    if cap is not None and price is not None:
        per_gpu = price / off.gpus_per_node
        if per_gpu > cap:
            return Exclusion(K.PRICE_CAP, f"{per_gpu:.3f} USD/GPU-hour is over the cap of {cap:g}")
    return None


def cooldown(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """Excluded on spot while the pool cools down after a preemption or failure."""
    reason = ctx.cooldown.get(off.pool)
    if reason is not None and market is Market.SPOT:
        return Exclusion(K.COOLING_DOWN, f"pool cooling down: {reason}")
    return None


HARD_FILTERS: Sequence[Filter] = (
    # What the instance type is comes first (GPU, node size, fabric): the
    # reason a user needs to read for a type that can never fit the job.
    gpu_model,
    gpus_per_node,
    fabric,
    provider_allowed,
    region_allowed,
    sold,
    price_cap,
    spot_capacity,
    cooldown,
)
"""Every hard filter, in the order their reasons are reported."""


def first_exclusion(ctx: PlacementContext, off: Offering, market: Market) -> Exclusion | None:
    """The exclusion of the first hard filter that rejects, or None when all pass."""
    for check in HARD_FILTERS:
        reason = check(ctx, off, market)
        if reason is not None:
            return reason
    return None


def over_budget(ctx: PlacementContext, expected_cost: float) -> Exclusion | None:
    """The exclusion of a candidate whose expected cost breaks the job's budget."""
    budget = ctx.spec.budget
    if budget is None:
        return None
    left = budget.max_usd - ctx.spent_usd
    if expected_cost > left:
        return Exclusion(
            K.OVER_BUDGET,
            f"expected cost {expected_cost:,.2f} USD is over the {left:,.2f} USD left in budget",
        )
    return None


class Screen:
    """The hard filters of one job, precomputed so a market of 20,000 offerings screens fast.

    ``reason(off, market)`` gives exactly what :func:`first_exclusion` gives
    (a property test holds them equal); the per-job parts (wanted GPUs, the
    bandwidth floor, glob matches per provider and region) are worked out once.
    """

    def __init__(self, ctx: PlacementContext) -> None:
        self.ctx = ctx
        spec = ctx.spec
        self._gpus = frozenset(spec.resources.gpus)
        self._per_node = spec.resources.gpus_per_node
        self._need = min_gbps_per_gpu(spec)
        self._cap = spec.market.max_price_per_gpu_hour
        self._cooldown = ctx.cooldown
        self._providers: dict[str, bool] = {}
        self._regions: dict[str, bool] = {}

    def reason(self, off: Offering, market: Market) -> Exclusion | None:
        """Why the offering is excluded in that market, or None."""
        ctx = self.ctx
        if off.gpu.upper() not in self._gpus:
            return gpu_model(ctx, off, market)
        if off.gpus_per_node != self._per_node:
            return gpus_per_node(ctx, off, market)
        if off.interconnect.gbps_per_gpu < self._need:
            return fabric(ctx, off, market)
        if not self._allowed(self._providers, off.pool.provider, ctx.spec.allows_provider):
            return provider_allowed(ctx, off, market)
        if not self._allowed(self._regions, off.pool.region, ctx.spec.allows_region):
            return region_allowed(ctx, off, market)
        price = off.spot_price if market is Market.SPOT else off.on_demand_price
        if price is None:
            return sold(ctx, off, market)
        if self._cap is not None and price / off.gpus_per_node > self._cap:
            return price_cap(ctx, off, market)
        if market is Market.SPOT:
            if off.capacity is not None and off.capacity <= 0:
                return spot_capacity(ctx, off, market)
            if off.pool in self._cooldown:
                return cooldown(ctx, off, market)
        return None

    @staticmethod
    def _allowed(cache: dict[str, bool], name: str, check: Callable[[str], bool]) -> bool:
        hit = cache.get(name)
        if hit is None:
            hit = cache[name] = check(name)
        return hit
