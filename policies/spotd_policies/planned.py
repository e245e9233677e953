"""``planned``: deadline plans solved on a market model learnt per pool, online.

The decisions are those of :mod:`spotd_policies.balanced` (the deadline plan
of :mod:`spotd_policies.deadline`: a dynamic program over time left, work
left, the mode and the market's state, minimising the expected cost to
finish; Uniform Progress's on-demand fallback as the hard guarantee). What
differs is the market the plan is solved on:

- **Per pool, cached per pool.** Every pool's spells of capacity (and of its
  absence) are read into a :class:`PoolModel` once per
  :data:`REMODEL_HOURS` period and shared by every job that can use the pool;
  the market of a set of pools (when no pool has spot, what the others do
  while one has it, the hour of day) once per period for the set. A job's
  plan may use the up spells of the pool it rides, or would start on, with
  the pooled spells of all its pools as the prior (:data:`OWN_PRIOR_SPELLS`);
  by default it plans on the pooled spells, which did better on the tuning
  halves of the benchmarks.
- **Only the past, and recent.** A model of period ``k`` is estimated from
  the history up to the period's start, never later (so two jobs asking in
  one period see one model, and no job sees a sample of its own future),
  and from the last :data:`WINDOW_HOURS` of it at most, so a market that
  changed regime is planned on as it is now.
- **Says how sure it is.** Few spells leave the prior in charge: a pool's
  mean up spell comes with an 80 % interval (:meth:`PoolModel.up_interval`)
  that is wide with few observations and narrows as they arrive. Until the
  job's pools have shown :data:`MIN_SPELLS` ended spells of capacity between
  them, the job is not planned on the prior: it rides spot where there is
  some, waits where there is none, and keeps ``balanced``'s safety nets
  (greedy with the Uniform Progress fallback).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from spotd.core import facts
from spotd.core.cadence import checkpoint_interval
from spotd.core.capacity import CapacitySeries
from spotd.core.values import Candidate, Market, PlacementContext, Pool
from spotd.market.cache import OfferingIndex
from spotd_policies import balanced
from spotd_policies import capacity_model as availability
from spotd_policies.balanced import BalancedPolicy
from spotd_policies.deadline import Action, SpellLaw, SpotModel

__all__ = ["MIN_SPELLS", "OWN_PRIOR_SPELLS", "REMODEL_HOURS", "WINDOW_HOURS", "MarketModels",
           "PlannedPolicy", "PoolModel"]

WINDOW_HOURS: float | None = 168.0
"""History a model is estimated from, at most (None: all of it): the last 7 days, the
daemon's stats window. Chosen on the first halves of the benchmark traces
(docs/benchmarks.md)."""
REMODEL_HOURS = 0.5
"""Length of a model period: models are estimated from the history up to its start."""
OWN_PRIOR_SPELLS = 0.0
"""Weight, in pseudo-spells, of the pooled up spells of all a job's pools in the law of
the pool it rides (0: the pooled law alone, as ``balanced`` plans). On the first halves
of the benchmark traces, 2 and 8 were each behind the best baseline on more rows than 0
(docs/policies.md), so by default the plan uses the pooled law."""
PRIOR_SPELLS = 2.0
"""Weight of the default prior (:data:`spotd.core.facts.DEFAULT_PREEMPTIONS_PER_HOUR`)
in a pool's own model."""
MIN_SPELLS = 0
"""Ended spells of capacity, over all the job's pools, before the job is planned on the
model; fewer, and it goes greedy with the safety nets (0: always planned)."""
INTERVAL_Z = 1.2816
"""Standard normal quantile of the 10 % and 90 % ends of :meth:`PoolModel.up_interval`."""

_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)
"""Periods are counted from here, so every job and pool shares their borders."""

SeriesKey = tuple[Pool, datetime, float, int, int]
"""A pool's history as cached: pool, first sample, step, samples, and a digest of the
samples (two jobs that count capacity differently, by their node counts, do not share)."""


@dataclass(frozen=True, slots=True)
class PoolModel:
    """One pool's spells as seen up to a period's start, with the prior."""

    pool: Pool
    up: SpellLaw
    """Spells of capacity."""
    down: SpellLaw
    """Spells without capacity in this pool."""
    seen_hours: float
    """Hours of history the model was estimated from."""
    availability: float | None
    """Share of those hours with capacity (None without history)."""

    @property
    def mean_up_hours(self) -> float:
        """Posterior mean length of a spell of capacity."""
        return self.up.mean_hours

    def up_interval(self) -> tuple[float, float]:
        """An 80 % interval of the mean spell of capacity, in hours.

        Spells are taken as exponential with a gamma prior on their rate
        (``prior_weight`` spells over ``prior_weight * prior_hours`` hours): the
        rate's posterior is Gamma(spells ended + weight, hours observed + prior
        hours), whose 10 % and 90 % quantiles (Wilson-Hilferty) bound the mean.
        """
        law = self.up
        shape = float(law.ended.sum()) + law.prior_weight
        exposure = float(law.hours.sum()) + law.prior_weight * law.prior_hours
        low_rate = _gamma_quantile(shape, -INTERVAL_Z) / exposure
        high_rate = _gamma_quantile(shape, INTERVAL_Z) / exposure
        return 1 / high_rate, (1 / low_rate if low_rate > 0 else math.inf)


def _gamma_quantile(shape: float, z: float) -> float:
    """The quantile of Gamma(shape, 1) at the standard normal quantile ``z``."""
    c = 1 / (9 * shape)
    return shape * max(0.0, 1 - c + z * math.sqrt(c)) ** 3


def pool_model(pool: Pool, series: CapacitySeries | None) -> PoolModel:
    """A pool's model from its history (the prior alone without one)."""
    prior_up = 1 / facts.DEFAULT_PREEMPTIONS_PER_HOUR
    prior_down = prior_up * (1 - availability.PRIOR_AVAILABILITY) / availability.PRIOR_AVAILABILITY
    if series is None or len(series) == 0:
        return PoolModel(pool, SpellLaw(prior_up, PRIOR_SPELLS), SpellLaw(prior_down, PRIOR_SPELLS),
                         0.0, None)
    spells = series.spells()
    up, down = spells.up, ~spells.up
    return PoolModel(
        pool,
        SpellLaw(prior_up, PRIOR_SPELLS, hours=spells.hours[up], ended=spells.ended[up]),
        SpellLaw(prior_down, PRIOR_SPELLS, hours=spells.hours[down], ended=spells.ended[down]),
        len(series) * series.step_hours,
        float(series.up.mean()),
    )


class MarketModels:
    """Pool models and market models, cached per pool (or set of pools) and period."""

    def __init__(
        self,
        *,
        window_hours: float | None = WINDOW_HOURS,
        remodel_hours: float = REMODEL_HOURS,
        size: int = 1024,
    ) -> None:
        self.window_hours = window_hours
        self.remodel_hours = remodel_hours
        self._size = size
        self._pools: OrderedDict[SeriesKey, PoolModel] = OrderedDict()
        self._markets: OrderedDict[tuple[SeriesKey, ...], SpotModel] = OrderedDict()

    def cut(self, series: CapacitySeries, now: datetime) -> CapacitySeries:
        """The part of ``series`` a model of ``now``'s period is estimated from: up to the
        period's start, and within the window."""
        step = series.step_hours
        period = math.floor((now - _ORIGIN).total_seconds() / 3600 / self.remodel_hours)
        border = period * self.remodel_hours
        first = (series.start - _ORIGIN).total_seconds() / 3600
        keep = min(len(series), max(0, math.floor((border - first) / step + 1e-9) + 1))
        drop = 0
        if self.window_hours is not None:
            drop = max(0, keep - max(1, round(self.window_hours / step)))
        if keep == len(series) and drop == 0:
            return series
        start = series.start + timedelta(hours=drop * step)
        return CapacitySeries(start, step, series.up[drop:keep])

    def pool(self, pool: Pool, series: CapacitySeries | None, now: datetime) -> PoolModel:
        """The pool's model for ``now``'s period."""
        if series is None:
            return pool_model(pool, None)
        cut = self.cut(series, now)
        key = _key(pool, cut)
        found = self._pools.get(key)
        if found is None:
            found = self._pools[key] = pool_model(pool, cut)
            _trim(self._pools, self._size)
        return found

    def market(self, series: dict[Pool, CapacitySeries], now: datetime) -> SpotModel:
        """The pooled market of ``series``'s pools for ``now``'s period, prices left at 0."""
        cuts = {p: self.cut(s, now) for p, s in sorted(series.items(), key=lambda i: str(i[0]))}
        key = tuple(_key(p, c) for p, c in cuts.items())
        found = self._markets.get(key)
        if found is None:
            found = self._markets[key] = availability.spot_model(
                [c for c in cuts.values() if len(c) > 0], spot_price=0.0, od_price=0.0
            )
            _trim(self._markets, self._size)
        return found


def _key(pool: Pool, series: CapacitySeries) -> SeriesKey:
    return (pool, series.start, series.step_hours, len(series), hash(series.up.tobytes()))


_K = TypeVar("_K")
_V = TypeVar("_V")


def _trim(cache: OrderedDict[_K, _V], size: int) -> None:
    while len(cache) > size:
        cache.popitem(last=False)


class PlannedPolicy(BalancedPolicy):
    """``balanced``'s deadline control, planned on per-pool models learnt online."""

    name = "planned"

    def __init__(
        self,
        *,
        window_hours: float | None = WINDOW_HOURS,
        own_prior_spells: float = OWN_PRIOR_SPELLS,
        min_spells: int = MIN_SPELLS,
        cache_size: int = 256,
    ) -> None:
        super().__init__(cache_size=cache_size)
        self.models = MarketModels(window_hours=window_hours)
        self.own_prior_spells = own_prior_spells
        self.min_spells = min_spells

    def _steer(
        self, ctx: PlacementContext, offerings: OfferingIndex, usable: list[Candidate]
    ) -> Candidate | None:
        """The plan's choice, or greedy with the safety nets while the model is mostly
        prior."""
        if self.min_spells > 0:
            series = balanced._series(
                ctx, [o.pool for o in balanced._spot_offerings(ctx, offerings)]
            )
            ended = sum(
                int(self.models.pool(p, s, ctx.now).up.ended.sum()) for p, s in series.items()
            )
            if ended < self.min_spells:
                return self._greedy(ctx, offerings, usable, series)
        return super()._steer(ctx, offerings, usable)

    def _greedy(
        self,
        ctx: PlacementContext,
        offerings: OfferingIndex,
        usable: list[Candidate],
        series: dict[Pool, CapacitySeries],
    ) -> Candidate | None:
        """Ride spot (the current pool while it lasts), else wait; on-demand once the
        slack would not survive one more changeover (and, on spot, a lost checkpoint
        interval)."""
        spot = [c for c in usable if c.market is Market.SPOT]
        od = [c for c in usable if c.market is Market.ON_DEMAND]
        if not od:
            return spot[0] if spot else None
        assert ctx.spec.deadline is not None and ctx.spec.deadline.finish_by is not None
        left = (ctx.spec.deadline.finish_by - ctx.now).total_seconds() / 3600
        od = balanced._in_time(ctx, offerings, od, left)
        work = od[0].breakdown["work_hours"]
        running = balanced._running(ctx)
        here = balanced._current(ctx, spot)
        if running is Action.SPOT and here is not None:
            rate = (1 / self.models.market(series, ctx.now).up.mean_hours if series
                    else facts.DEFAULT_PREEMPTIONS_PER_HOUR)
            if left < work + ctx.changeover_hours + checkpoint_interval(ctx.spec, rate):
                return balanced._prefer_current(ctx, od)
            return here
        if left < work + 2 * ctx.changeover_hours:
            return balanced._prefer_current(ctx, od)
        if running is Action.ON_DEMAND and left < work + 3 * ctx.changeover_hours:
            return balanced._prefer_current(ctx, od)  # leaving would trip the net at once
        return spot[0] if spot else None

    def _market(
        self,
        ctx: PlacementContext,
        series: dict[Pool, CapacitySeries],
        spot: list[Candidate],
        *,
        spot_price: float,
        od_price: float,
        spot_speed: float,
    ) -> SpotModel:
        """The pooled market of the period, with the up law of the pool the job rides (or
        would start on) shrunk toward the pooled one."""
        market = self.models.market(series, ctx.now)
        model = replace(market, spot_price=spot_price, od_price=od_price, spot_speed=spot_speed)
        pool = _riding(ctx, spot)
        if pool is None or self.own_prior_spells <= 0 or pool not in series:
            return model
        own = self.models.pool(pool, series[pool], ctx.now).up
        up = SpellLaw(market.up.mean_hours, self.own_prior_spells, hours=own.hours,
                      ended=own.ended)
        return replace(model, up=up)


def _riding(ctx: PlacementContext, spot: list[Candidate]) -> Pool | None:
    """The spot pool the job runs on, else the cheapest one up now, if any."""
    if ctx.current is not None and ctx.current_market is Market.SPOT:
        return ctx.current
    return spot[0].offering.pool if spot else None
