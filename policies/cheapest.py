"""``cheapest``: the lowest price per hour that passes every hard filter.

The naive baseline: it ignores preemption risk and fabric efficiency beyond
the hard bandwidth floor.
"""

from __future__ import annotations

from collections.abc import Sequence

from spotd.policies.filters import first_exclusion, markets_for, over_budget

from spotd.domain import Candidate, Decision, Market, Offering, PlacementContext


def expected_hours(ctx: PlacementContext) -> float:
    """Compute hours the job expects to need; 1 hour when the spec does not say."""
    deadline = ctx.spec.deadline
    if deadline is not None and deadline.compute_hours is not None:
        return deadline.compute_hours
    return 1.0


def score(ctx: PlacementContext, off: Offering, market: Market) -> Candidate:
    """Price the offering for the whole job, with the hard filters' verdict."""
    nodes = ctx.spec.resources.nodes
    price = off.price(market) or 0.0
    per_hour = price * nodes
    hours = expected_hours(ctx)
    cost = per_hour * hours
    reason = first_exclusion(ctx, off, market) or over_budget(ctx, cost)
    return Candidate(
        offering=off,
        market=market,
        nodes=nodes,
        price_per_hour=per_hour,
        expected_cost_usd=cost,
        excluded=reason,
        breakdown={"price_per_hour": per_hour, "hours": hours},
    )


def rank(candidates: list[Candidate]) -> Decision:
    """Usable candidates by expected cost, then the excluded ones."""
    usable = sorted(
        (c for c in candidates if c.excluded is None),
        key=lambda c: (c.expected_cost_usd, str(c.offering.pool)),
    )
    excluded = [c for c in candidates if c.excluded is not None]
    return Decision(choice=usable[0] if usable else None, candidates=(*usable, *excluded))


class CheapestPolicy:
    """Lowest expected price among offerings that pass the hard filters."""

    name = "cheapest"

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        return rank([score(ctx, off, m) for off in offerings for m in markets_for(ctx.spec)])
