"""``on-demand``: never spot. The cheapest on-demand offering that passes the filters."""

from __future__ import annotations

from collections.abc import Sequence

from spotd.policies.cheapest import rank, score

from spotd.domain import Decision, Market, Offering, PlacementContext


class OnDemandPolicy:
    """What running without spot costs: the reference for every savings figure."""

    name = "on-demand"

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        return rank([score(ctx, off, Market.ON_DEMAND) for off in offerings])
