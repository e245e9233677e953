"""``balanced``: the default policy. Expected cost to finish, deadline control, hysteresis.

Every offering that passes the hard filters is scored by its expected cost
to finish the job there (:mod:`spotd_policies.costmodel`: price, fabric
efficiency, GPU speed, preemption overhead, changeover, checkpoint egress).

- Jobs without a deadline ride the market their spec asks for (spot, or
  on-demand; ``auto`` compares both by expected cost) and take the cheapest
  expected cost, but a running job moves only when the saving beats the cost
  of moving it (already in the score) by a hysteresis margin.
- Jobs with a deadline and ``market.type = "auto"`` follow a plan solved
  over the job's remaining work and time (:mod:`spotd_policies.deadline`)
  on a market model estimated from the pools' capacity history
  (:mod:`spotd_policies.capacity_model`): ride spot, wait for it, or pay for
  on-demand, whichever costs least in expectation given how long the
  present spell of capacity (or of its absence) has lasted, while never
  missing a feasible deadline. Hard safety nets (Uniform Progress rule 4,
  and its counterpart on spot with a whole checkpoint interval lost) guard
  against a wrong model, and on-demand is only ever chosen where it can
  still finish in time. A job waiting for spot is not sent to on-demand as
  a hedge while its slack far outlasts every outage of the last days.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from spotd.core import progress
from spotd.core.cadence import checkpoint_interval, saves_on_notice
from spotd.core.capacity import CapacitySeries
from spotd.core.spec import deadline_controlled
from spotd.core.values import Candidate, Decision, Market, Offering, PlacementContext, Pool
from spotd.market.cache import OfferingIndex
from spotd_policies import capacity_model as availability
from spotd_policies import costmodel, deadline
from spotd_policies.base import (
    LowerBound,
    Score,
    best_first,
    decide,
    every_usable,
    fastest_usable,
)
from spotd_policies.filters import Screen, markets_for

HYSTERESIS = 0.05
"""A running job moves only for an expected saving above this share of staying."""
REPLAN_DRIFT = 0.3
"""Re-solve a deadline plan when a rate or price moved by more than this share."""
LOST_SHARE = 0.5
"""Share of a checkpoint interval a preemption throws away, on average, in the plan
(none where the job's checkpoint on the notice fits in it)."""
REMODEL = timedelta(minutes=30)
"""How often a deadline plan's market model is re-estimated from history."""
OUTAGE_WINDOW_HOURS = 72.0
"""Recent history searched for the longest outage (no allowed pool with spot); the
daemon keeps 7 days. Set on the first half of the shipped traces (docs/benchmarks.md)."""
OUTAGE_SLACK = 1.5
"""A job waiting for spot does not go to on-demand as a hedge while its slack is over
this many times the longest recent outage, plus a changeover."""

HORIZON_WORKS = 4.0
"""A plan looks at most this many times the work left ahead (a deadline with a
``compute_hours / time left`` of 0.25 or more is planned to in full). A deadline further out
binds nothing yet, and solving up to it would only coarsen the plan's steps
(:func:`spotd_policies.deadline.plan` keeps its grid bounded) until one step outlasts
a spot spell, and the plan sends the job to on-demand a year early. A plan cut short
is followed for half its horizon, then solved again, so the nearer end it assumed
never decides anything."""


@dataclass(frozen=True)
class _Solved:
    plan: deadline.Plan
    model: deadline.SpotModel
    start: datetime
    done_at_start: float
    scale: float
    """Hours on the fastest on-demand per hour of the spec's compute: the plan's unit of work
    (above 1 on a fabric slower than the reference, below 1 on a faster GPU)."""
    checked: datetime
    """When the market model was last compared with the plan's."""
    saved: bool
    """Whether the plan counts preemptions as losing no work (the notice's checkpoint)."""
    outage: float | None = None
    """The longest outage in the last :data:`OUTAGE_WINDOW_HOURS`, None on a shorter history."""
    holds_hours: float = math.inf
    """How long after ``start`` the plan may be followed: its whole horizon, or half of
    it when the horizon was cut short of the deadline (:data:`HORIZON_WORKS`)."""


class BalancedPolicy:
    """Expected cost to finish, with deadline control and anti-thrash."""

    name = "balanced"

    def __init__(self, *, cache_size: int = 256) -> None:
        self._plans: OrderedDict[str, _Solved] = OrderedDict()
        self._cache_size = cache_size

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        """The offering of least expected cost; for a deadline job with market ``auto``,
        the deadline plan decides between spot, on-demand and waiting."""
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
        assert ctx.spec.deadline is not None and ctx.spec.deadline.finish_by is not None
        left = (ctx.spec.deadline.finish_by - ctx.now).total_seconds() / 3600
        od = _in_time(ctx, offerings, od, left)
        # Screened once: the pools' histories below, and the plan's spot terms when none is up.
        usable_spot = _spot_offerings(ctx, offerings)
        pools = [o.pool for o in usable_spot]
        if not spot and not pools:
            return _prefer_current(ctx, od)
        running = _running(ctx)
        series = _series(ctx, pools)
        solved = self._plan_for(
            ctx, offerings, series, spot=spot, od=od, left=left, usable_spot=usable_spot
        )
        # Work in hours of the fastest on-demand: the fallback the nets lean on.
        work = costmodel.remaining_hours(ctx) * solved.scale
        # Uniform Progress rule 4, as a net under the plan.
        if running is not deadline.Action.SPOT and left < work + 2 * ctx.changeover_hours:
            return _prefer_current(ctx, od)
        # The same net on spot: leave while a preemption that throws away a whole
        # checkpoint interval would still leave time to finish on on-demand. The
        # checkpoint on the notice is not counted on here: a net must hold when
        # that write fails too.
        margin = work + ctx.changeover_hours + _interval(ctx, solved)
        if running is deadline.Action.SPOT and left < margin:
            return _prefer_current(ctx, od)
        ride = _ride(ctx, spot, series)
        action = solved.plan.action(
            (ctx.now - solved.start).total_seconds() / 3600,
            max(0.0, ctx.done_hours - solved.done_at_start) * solved.scale,
            running,
            ride is not None,
            age_hours=_age(ride, series),
            others_up=ride is not None and _others_up(series, ride.offering.pool),
        )
        if action is deadline.Action.SPOT and ride is not None:
            if running is not deadline.Action.SPOT and left < margin + ctx.changeover_hours:
                return _prefer_current(ctx, od)  # the net above would take it off spot at once
            return ride
        if action is deadline.Action.ON_DEMAND:
            # The plan's law pools all the history; where every recent outage was short
            # against the slack, going to on-demand to hedge a long one costs more than it
            # saves (flickering markets, which greedy rides).
            idle = running is not deadline.Action.ON_DEMAND and ride is None
            if idle and _outlasts(ctx, solved, left - work - ctx.changeover_hours):
                return None
            return _prefer_current(ctx, od)
        return None

    def _plan_for(
        self,
        ctx: PlacementContext,
        offerings: OfferingIndex,
        series: dict[Pool, CapacitySeries],
        *,
        spot: list[Candidate],
        od: list[Candidate],
        left: float,
        usable_spot: list[Offering],
    ) -> _Solved:
        old = self._plans.get(ctx.job_id)
        if old is not None and _covers(old, ctx) and ctx.now - old.checked < REMODEL:
            self._plans.move_to_end(ctx.job_id)
            return old
        # The plan counts work in hours of the fastest on-demand, the fallback that
        # keeps the most slack, at the least price per unit of work one gives (the
        # best-first search holds the cheapest).
        fastest = fastest_usable(
            ctx, offerings, Market.ON_DEMAND, expected_cost(ctx), speed=_speed(ctx), start=od
        )
        work = (fastest or od[0]).breakdown["work_hours"]
        spot_price, spot_hours, notice = _spot_terms(ctx, spot, usable_spot)
        model = self._market(
            ctx,
            series,
            spot,
            spot_price=spot_price,
            od_price=min(c.price_per_hour * c.breakdown["work_hours"] for c in od) / work,
            # Spot faster than any on-demand counts at on-demand's speed: it errs safe.
            spot_speed=min(1.0, work / spot_hours) if spot_hours > 0 else 1.0,
        )
        saved = saves_on_notice(ctx.spec, notice)
        outage = availability.longest_outage_hours(list(series.values()), OUTAGE_WINDOW_HOURS)
        if (
            old is not None
            and not _drifted(old.model, model)
            and old.saved == saved
            and _covers(old, ctx)
        ):
            self._plans[ctx.job_id] = kept = replace(old, checked=ctx.now, outage=outage)
            self._plans.move_to_end(ctx.job_id)
            return kept
        lost = 0.0 if saved else checkpoint_interval(ctx.spec, model.run_preempt_rate) * LOST_SHARE
        # The whole time left: a booting node is looked up as running, and the
        # steps it spends booting show up as lag (time without progress) once
        # it runs, which the plan keeps the deadline with.
        remaining = costmodel.remaining_hours(ctx)
        # Counted in the larger of the two units, so a job whose fastest GPU outruns its
        # reference is not cut short of a deadline a few of its own compute hours away.
        horizon = min(max(0.0, left), HORIZON_WORKS * max(work, remaining))
        holds = horizon / 2 if horizon < left else math.inf
        now = ctx.now.astimezone(UTC)
        solved = _Solved(
            deadline.plan(
                model, work, horizon, ctx.changeover_hours, lost,
                start_hour=now.hour + now.minute / 60,
            ),
            model,
            ctx.now,
            ctx.done_hours,
            work / remaining if remaining > 0 else 1.0,
            ctx.now,
            saved,
            outage,
            holds,
        )
        self._plans[ctx.job_id] = solved
        while len(self._plans) > self._cache_size:
            self._plans.popitem(last=False)
        return solved

    def _market(
        self,
        ctx: PlacementContext,
        series: dict[Pool, CapacitySeries],
        spot: list[Candidate],
        *,
        spot_price: float,
        od_price: float,
        spot_speed: float,
    ) -> deadline.SpotModel:
        """The market model a plan is solved on: here every allowed pool's whole history,
        pooled (a subclass may model it otherwise; ``spot`` is what is up now)."""
        return availability.spot_model(
            list(series.values()), spot_price=spot_price, od_price=od_price,
            spot_speed=spot_speed,
        )


def expected_cost(ctx: PlacementContext) -> Score:
    """Score offerings by :func:`spotd_policies.costmodel.estimate`."""

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


def _speed(ctx: PlacementContext) -> Callable[[Offering], float]:
    """Work an hour on an offering does, relative to the reference (fabric and GPU)."""
    return lambda off: progress.efficiency(ctx.spec, off) * progress.speed(ctx.spec, off)


def _interval(ctx: PlacementContext, solved: _Solved) -> float:
    """The checkpoint interval: the most progress a preemption can throw away."""
    return checkpoint_interval(ctx.spec, solved.model.run_preempt_rate)


def _in_time(
    ctx: PlacementContext, offerings: OfferingIndex, od: list[Candidate], left: float
) -> list[Candidate]:
    """The on-demand options that can still finish in the ``left`` hours, cheapest first.

    The cheapest may be on a slow fabric, and the best-first search keeps only
    the cheapest: when none of those finishes in time, every usable on-demand
    offering is scored. When none at all can, the fastest first. One
    changeover is kept in hand for estimates that run short (speeds are
    estimates, and a boot can take longer).
    """

    def hours(c: Candidate) -> float:
        here = c.offering.pool == ctx.current and c.market is ctx.current_market
        return c.breakdown["work_hours"] + (1.0 if here else 2.0) * ctx.changeover_hours

    fits = [c for c in od if hours(c) <= left]
    if fits:
        return fits
    everyone = every_usable(ctx, offerings, Market.ON_DEMAND, expected_cost(ctx))
    fits = [c for c in everyone if hours(c) <= left]
    return fits or sorted(everyone or od, key=hours)


def _current(ctx: PlacementContext, options: list[Candidate]) -> Candidate | None:
    return next(
        (c for c in options if c.offering.pool == ctx.current and c.market is ctx.current_market),
        None,
    )


def _ride(
    ctx: PlacementContext, spot: list[Candidate], series: dict[Pool, CapacitySeries]
) -> Candidate | None:
    """The spot to be on: the current one while it lasts (Uniform Progress rule 1), else
    among those within the hysteresis of the cheapest, the one whose capacity is expected
    to last longest, by its own history and how long its present spell has lasted."""
    if not spot:
        return None
    here = _current(ctx, spot)
    if here is not None:
        return here
    near = [c for c in spot if c.expected_cost_usd <= spot[0].expected_cost_usd * (1 + HYSTERESIS)]
    if len(near) == 1:
        return near[0]
    return max(near, key=lambda c: _residual(series.get(c.offering.pool)))


def _residual(series: CapacitySeries | None) -> float:
    return 0.0 if series is None else availability.residual_up_hours(series)


def _others_up(series: dict[Pool, CapacitySeries], pool: Pool) -> bool:
    """Whether a pool other than ``pool`` has capacity now, by its history's last sample."""
    return any(s.up[-1] for p, s in series.items() if p != pool)


def _age(ride: Candidate | None, series: dict[Pool, CapacitySeries]) -> float:
    """How long the present spell has lasted: the ride's capacity (0 when its history does
    not show it up yet), or, with no spot to ride, no pool having any."""
    if ride is None:
        return availability.down_age_hours(list(series.values()))
    own = series.get(ride.offering.pool)
    if own is None or not own.up[-1]:
        return 0.0
    return own.age_hours()


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
        return (off.price(market) or 0.0) * nodes * work / progress.speed(ctx.spec, off)

    return bound


def _spot_offerings(ctx: PlacementContext, offerings: OfferingIndex) -> list[Offering]:
    """Spot offerings the job could use at some point (capacity and cooldown aside)."""
    checks = Screen(ctx)
    found = []
    for gpu in ctx.spec.resources.gpus:
        for off in offerings.bucket(gpu, ctx.spec.resources.gpus_per_node, Market.SPOT):
            reason = checks.reason(off, Market.SPOT)
            if reason is None or reason.kind.transient:
                found.append(off)
    return found


def _series(ctx: PlacementContext, pools: list[Pool]) -> dict[Pool, CapacitySeries]:
    """The capacity history of every pool that has one."""
    if ctx.stats is None:
        return {}
    found = {pool: ctx.stats.capacity_series(pool) for pool in pools}
    return {pool: s for pool, s in found.items() if s is not None and len(s) > 0}


def _spot_terms(
    ctx: PlacementContext, spot: list[Candidate], usable: list[Offering]
) -> tuple[float, float, float]:
    """(price per hour, work hours, notice seconds) of the spot the plan assumes: the best
    one up now, else the one of median price among those the job could use (``usable``,
    from :func:`_spot_offerings`)."""
    if spot:
        best = spot[0]
        return best.price_per_hour, best.breakdown["work_hours"], best.offering.notice_seconds
    found = sorted(
        ((costmodel.estimate(ctx, o, Market.SPOT), o) for o in usable),
        key=lambda e: e[0].price_per_hour,
    )
    if not found:
        return 0.0, 0.0, 0.0
    middle, off = found[len(found) // 2]
    return middle.price_per_hour, middle.work_hours, off.notice_seconds


def _outlasts(ctx: PlacementContext, solved: _Solved, slack: float) -> bool:
    """Whether ``slack`` hours would outlast the longest recent outage with room to spare:
    then waiting for spot is the bet greedy makes, and on-demand is not paid as a hedge."""
    if solved.outage is None:
        return False
    return slack > OUTAGE_SLACK * solved.outage + ctx.changeover_hours


def _drifted(old: deadline.SpotModel, new: deadline.SpotModel) -> bool:
    return any(
        abs(a - b) > REPLAN_DRIFT * max(abs(a), abs(b), 1e-9)
        for a, b in zip(old.summary(), new.summary(), strict=True)
    )


def _covers(solved: _Solved, ctx: PlacementContext) -> bool:
    elapsed = (ctx.now - solved.start).total_seconds() / 3600
    held = min(solved.plan.steps * solved.plan.step_hours, solved.holds_hours)
    return 0 <= elapsed < held and ctx.done_hours >= solved.done_at_start
