"""``cheapest``: the lowest price per hour that passes every hard filter.

The naive baseline: it ignores preemption risk and fabric efficiency beyond
the hard bandwidth floor.
"""

from __future__ import annotations

from collections.abc import Sequence

from spotd.core.values import Candidate, Decision, Market, Offering, PlacementContext
from spotd.market.cache import OfferingIndex
from spotd_policies.base import Score, best_first, decide
from spotd_policies.costmodel import remaining_hours
from spotd_policies.filters import markets_for


def price_only(ctx: PlacementContext) -> Score:
    """Score an offering by its price for all nodes over the work left, nothing else."""
    nodes = ctx.spec.resources.nodes
    hours = remaining_hours(ctx)

    def score(off: Offering, market: Market) -> Candidate:
        per_hour = (off.price(market) or 0.0) * nodes
        return Candidate(
            offering=off,
            market=market,
            nodes=nodes,
            price_per_hour=per_hour,
            expected_cost_usd=per_hour * hours,
            breakdown={"price_per_hour": per_hour, "hours": hours},
        )

    return score


def place_by_price(
    ctx: PlacementContext, offerings: Sequence[Offering], markets: Sequence[Market]
) -> Decision:
    """The cheapest candidate in ``markets`` that passes the filters."""
    index = OfferingIndex.of(offerings)
    score = price_only(ctx)
    usable = best_first(ctx, index, markets, score, lambda o, m: score(o, m).expected_cost_usd)
    return decide(ctx, index, markets, score, usable[0] if usable else None)


class CheapestPolicy:
    """Lowest expected price among offerings that pass the hard filters."""

    name = "cheapest"

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        """The cheapest usable offering, by price alone, in the markets the spec allows."""
        return place_by_price(ctx, offerings, markets_for(ctx.spec))
