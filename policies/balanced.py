"""``balanced``: the default policy. Expected cost to finish, deadline control, hysteresis.

Every offering that passes the hard filters is scored by its expected cost
to finish the job there (:mod:`spotd.policies.costmodel`: price, fabric
efficiency, GPU speed, preemption overhead, changeover, checkpoint egress).

- Jobs without a deadline ride the market their spec asks for (spot, or
  on-demand; ``auto`` compares both by expected cost) and take the cheapest
  expected cost, but a running job moves only when the saving beats the cost
  of moving it (already in the score) by a hysteresis margin.
- Jobs with a deadline and ``market.type = "auto"`` follow a plan solved
  over the job's remaining work and time (:mod:`spotd.policies.deadline`):
  ride spot, wait for it, or pay for on-demand, whichever costs least in
  expectation while never missing a feasible deadline. A hard safety net
  (Uniform Progress rule 4: off spot with less than work + 2 changeovers
  left means on-demand to the end) guards against a wrong model.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from spotd.policies import costmodel, deadline
from spotd.policies.base import LowerBound, Score, best_first, decide
from spotd.policies.filters import Screen, markets_for

from spotd import facts
from spotd.checkpoints import checkpoint_interval
from spotd.domain import Candidate, Decision, Market, Offering, PlacementContext, Pool
from spotd.market import OfferingIndex
from spotd.spec import deadline_controlled

HYSTERESIS = 0.05
"""A running job moves only for an expected saving above this share of staying."""
REPLAN_DRIFT = 0.3
"""Re-solve a deadline plan when a rate or price moved by more than this share."""
PRIOR_AVAILABILITY = 0.5
"""Spot availability assumed for a pool with no history."""


@dataclass(frozen=True)
class _Solved:
    plan: deadline.Plan
    model: deadline.SpotModel
    start: datetime
    done_at_start: float
    scale: float
    """Hours on the planned offerings per hour of the spec's compute (>= 1 on slow fabric)."""
    pace: float
    """Compute hours per hour the straight line to the deadline needs."""


class BalancedPolicy:
    """Expected cost to finish, with deadline control and anti-thrash."""

    name = "balanced"

    def __init__(self, *, cache_size: int = 256) -> None:
        self._plans: OrderedDict[str, _Solved] = OrderedDict()
        self._cache_size = cache_size

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        index = OfferingIndex.of(offerings)
        markets = markets_for(ctx.spec)
        score = expected_cost(ctx)
        usable = best_first(ctx, index, markets, score, _lower_bound(ctx))
        if deadline_controlled(ctx.spec):
            choice = self._steer(ctx, index, usable)
        else:
            choice = _with_hysteresis(ctx, usable)
        return decide(ctx, index, markets, score, choice)

    # -- deadline control -----------------------------------------------------

    def _steer(
        self, ctx: PlacementContext, offerings: OfferingIndex, usable: list[Candidate]
    ) -> Candidate | None:
        spot = [c for c in usable if c.market is Market.SPOT]
        od = [c for c in usable if c.market is Market.ON_DEMAND]
        if not od:
            return spot[0] if spot else None
        if not spot and not _spot_pools(ctx, offerings):
            return od[0]
        assert ctx.spec.deadline is not None and ctx.spec.deadline.finish_by is not None
        left = (ctx.spec.deadline.finish_by - ctx.now).total_seconds() / 3600
        running = _running(ctx)
        work = max(c.breakdown["work_hours"] for c in (od[0], *spot[:1]))
        # Uniform Progress rule 4, as a net under the plan.
        if running is not deadline.Action.SPOT and left < work + 2 * ctx.changeover_hours:
            return _prefer_current(ctx, od)
        solved = self._plan_for(ctx, offerings, spot=spot, od=od, left=left, work=work)
        action = solved.plan.action(
            (ctx.now - solved.start).total_seconds() / 3600,
            max(0.0, ctx.done_hours - solved.done_at_start) * solved.scale,
            running,
            bool(spot),
        )
        if action is deadline.Action.SPOT and spot:
            here = _current(ctx, spot)
            if here is not None:
                return here  # Uniform Progress rule 1: ride spot until it is taken away
            if running is deadline.Action.ON_DEMAND and not _ahead(ctx, solved):
                return _prefer_current(ctx, od)  # rule 3: leave on-demand only when ahead
            return spot[0]
        if action is deadline.Action.ON_DEMAND:
            return _prefer_current(ctx, od)
        return None

    def _plan_for(
        self,
        ctx: PlacementContext,
        offerings: OfferingIndex,
        *,
        spot: list[Candidate],
        od: list[Candidate],
        left: float,
        work: float,
    ) -> _Solved:
        spot_price = spot[0].price_per_hour if spot else _median_spot_price(ctx, offerings)
        pools = [_rates(ctx, pool) for pool in _spot_pools(ctx, offerings)]
        model = deadline.aggregate(pools, spot_price, od[0].price_per_hour)
        old = self._plans.get(ctx.job_id)
        if old is not None and not _drifted(old.model, model) and _covers(old, ctx):
            self._plans.move_to_end(ctx.job_id)
            return old
        # One changeover of the time is kept back: the plan sees a running job
        # as making progress from this step, while it may still be booting.
        lost = checkpoint_interval(ctx.spec, model.run_preempt_rate) / 2
        horizon = max(0.0, left - ctx.changeover_hours)
        remaining = costmodel.remaining_hours(ctx)
        solved = _Solved(
            deadline.plan(model, work, horizon, ctx.changeover_hours, lost),
            model,
            ctx.now,
            ctx.done_hours,
            work / remaining if remaining > 0 else 1.0,
            remaining / horizon if horizon > 0 else math.inf,
        )
        self._plans[ctx.job_id] = solved
        while len(self._plans) > self._cache_size:
            self._plans.popitem(last=False)
        return solved


def expected_cost(ctx: PlacementContext) -> Score:
    """Score offerings by :func:`spotd.policies.costmodel.estimate`."""

    def score(off: Offering, market: Market) -> Candidate:
        est = costmodel.estimate(ctx, off, market)
        return Candidate(
            offering=off,
            market=market,
            nodes=ctx.spec.resources.nodes,
            price_per_hour=est.price_per_hour,
            expected_cost_usd=est.cost_usd,
            breakdown=est.breakdown(),
        )

    return score


def place_by_expected_cost(
    ctx: PlacementContext, offerings: Sequence[Offering], markets: Sequence[Market]
) -> Decision:
    """The candidate of least expected cost in ``markets``, with hysteresis for a running job."""
    index = OfferingIndex.of(offerings)
    score = expected_cost(ctx)
    usable = best_first(ctx, index, markets, score, _lower_bound(ctx))
    return decide(ctx, index, markets, score, _with_hysteresis(ctx, usable))


def _with_hysteresis(ctx: PlacementContext, usable: list[Candidate]) -> Candidate | None:
    if not usable:
        return None
    best = usable[0]
    stay = next(
        (c for c in usable if c.offering.pool == ctx.current and c.market is ctx.current_market),
        None,
    )
    if stay is not None and best.expected_cost_usd >= stay.expected_cost_usd * (1 - HYSTERESIS):
        return stay
    return best


def _current(ctx: PlacementContext, options: list[Candidate]) -> Candidate | None:
    return next(
        (c for c in options if c.offering.pool == ctx.current and c.market is ctx.current_market),
        None,
    )


def _ahead(ctx: PlacementContext, solved: _Solved) -> bool:
    """Uniform Progress rule 3: progress is past the straight line two changeovers ahead.

    The line runs from where the plan was solved to the deadline, so a job
    leaves on-demand for spot only with time in hand for another changeover.
    """
    elapsed = (ctx.now - solved.start).total_seconds() / 3600 + 2 * ctx.changeover_hours
    return ctx.done_hours >= solved.done_at_start + elapsed * solved.pace


def _prefer_current(ctx: PlacementContext, options: list[Candidate]) -> Candidate:
    return _with_hysteresis(ctx, options) or options[0]


def _running(ctx: PlacementContext) -> deadline.Action:
    if ctx.current is None or ctx.current_market is None:
        return deadline.Action.IDLE
    if ctx.current_market is Market.SPOT:
        return deadline.Action.SPOT
    return deadline.Action.ON_DEMAND


def _lower_bound(ctx: PlacementContext) -> LowerBound:
    """Price for all nodes over the work at full fabric efficiency: no estimate goes lower."""
    work = costmodel.remaining_hours(ctx)
    nodes = ctx.spec.resources.nodes

    def bound(off: Offering, market: Market) -> float:
        return (off.price(market) or 0.0) * nodes * work / costmodel.speed(ctx.spec, off)

    return bound


def _spot_offerings(ctx: PlacementContext, offerings: OfferingIndex) -> list[Offering]:
    """Spot offerings the job could use at some point (capacity and cooldown aside)."""
    checks = Screen(ctx)
    found = []
    for gpu in ctx.spec.resources.gpus:
        for off in offerings.bucket(gpu, ctx.spec.resources.gpus_per_node, Market.SPOT):
            reason = checks.reason(off, Market.SPOT)
            if reason is None or reason.startswith(("no spot capacity", "pool cooling down")):
                found.append(off)
    return found


def _spot_pools(ctx: PlacementContext, offerings: OfferingIndex) -> list[Pool]:
    return [o.pool for o in _spot_offerings(ctx, offerings)]


def _rates(ctx: PlacementContext, pool: Pool) -> deadline.PoolRates:
    stats = ctx.stats
    avail = stats.availability(pool) if stats else None
    rate = stats.preemptions_per_hour(pool) if stats else None
    return deadline.PoolRates(
        availability=PRIOR_AVAILABILITY if avail is None else avail,
        preemptions_per_hour=facts.DEFAULT_PREEMPTIONS_PER_HOUR if rate is None else rate,
    )


def _median_spot_price(ctx: PlacementContext, offerings: OfferingIndex) -> float:
    prices = sorted(
        (o.spot_price or 0.0) * ctx.spec.resources.nodes for o in _spot_offerings(ctx, offerings)
    )
    return prices[len(prices) // 2] if prices else 0.0


def _drifted(old: deadline.SpotModel, new: deadline.SpotModel) -> bool:
    pairs = (
        (old.spot_price, new.spot_price),
        (old.od_price, new.od_price),
        (old.run_preempt_rate, new.run_preempt_rate),
        (old.up_to_down, new.up_to_down),
        (old.down_to_up, new.down_to_up),
    )
    return any(abs(a - b) > REPLAN_DRIFT * max(abs(a), abs(b), 1e-9) for a, b in pairs)


def _covers(solved: _Solved, ctx: PlacementContext) -> bool:
    elapsed = (ctx.now - solved.start).total_seconds() / 3600
    return 0 <= elapsed < solved.plan.steps * solved.plan.step_hours and (
        ctx.done_hours >= solved.done_at_start
    )
