"""``on-demand``: never spot. The cheapest on-demand offering that passes the filters."""

from __future__ import annotations

from collections.abc import Sequence

from spotd.policies.cheapest import place_by_price

from spotd.domain import Decision, Market, Offering, PlacementContext


class OnDemandPolicy:
    """What running without spot costs: the reference for every savings figure."""

    name = "on-demand"

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        return place_by_price(ctx, offerings, (Market.ON_DEMAND,))
