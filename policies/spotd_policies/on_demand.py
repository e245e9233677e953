"""``on-demand``: never spot. The on-demand offering of least expected cost.

What running without spot costs: the reference for every savings figure.
It weighs fabric efficiency and GPU speed like ``balanced`` (a cheaper hour
on a slower fabric can cost more in the end), with no preemption to price.
"""

from __future__ import annotations

from collections.abc import Sequence

from spotd.core.values import Decision, Market, Offering, PlacementContext
from spotd_policies.balanced import place_by_expected_cost


class OnDemandPolicy:
    """On-demand only, by expected cost to finish."""

    name = "on-demand"

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        """The on-demand offering of least expected cost; never spot."""
        return place_by_expected_cost(ctx, offerings, (Market.ON_DEMAND,))
