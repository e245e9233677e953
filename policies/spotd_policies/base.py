"""What every policy does the same way: screen the market, score what passes, rank.

A policy gives ``score`` (a candidate with its expected cost) and
``lower_bound`` (a cost no candidate of that offering can go under, rising
with price). Offerings are walked per (GPU model, node size, market) bucket
in price order, and a bucket is left as soon as its lower bound passes the
best cost found: the daemon places a job against a large market with a few
dozen checks. The full ranking, with a reason for every excluded offering,
is built only when read (``spotd plan``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from spotd.core.values import Candidate, Decision, Market, Offering, PlacementContext
from spotd.market.cache import OfferingIndex
from spotd_policies.costmodel import remaining_hours
from spotd_policies.filters import Screen, over_budget

Score = Callable[[Offering, Market], Candidate]
LowerBound = Callable[[Offering, Market], float]


def best_first(
    ctx: PlacementContext,
    index: OfferingIndex,
    markets: Sequence[Market],
    score: Score,
    lower_bound: LowerBound,
) -> list[Candidate]:
    """Usable candidates, cheapest expected cost first, sure to hold the best of each market.

    The pool the job runs in now is always scored too, so a policy can
    weigh staying against moving.
    """
    checks = Screen(ctx)
    per_node = ctx.spec.resources.gpus_per_node
    found: list[Candidate] = []
    for market in markets:
        best = math.inf
        for gpu in ctx.spec.resources.gpus:
            for off in index.bucket(gpu, per_node, market):
                if lower_bound(off, market) > best:
                    break
                candidate = _usable(ctx, checks, score, off, market)
                if candidate is not None:
                    found.append(candidate)
                    best = min(best, candidate.expected_cost_usd)
    _add_current(ctx, index, checks, score, found)
    found.sort(key=rank_key(ctx))
    return found


def every_usable(
    ctx: PlacementContext, index: OfferingIndex, market: Market, score: Score
) -> list[Candidate]:
    """Every usable candidate of one market, unpruned, cheapest expected cost first.

    For when the cheapest is not enough (a deadline policy looking for one
    fast enough); the same filters and budget as :func:`best_first`.
    """
    checks = Screen(ctx)
    per_node = ctx.spec.resources.gpus_per_node
    found = [
        candidate
        for gpu in ctx.spec.resources.gpus
        for off in index.bucket(gpu, per_node, market)
        if (candidate := _usable(ctx, checks, score, off, market)) is not None
    ]
    found.sort(key=rank_key(ctx))
    return found


def fastest_usable(
    ctx: PlacementContext,
    index: OfferingIndex,
    market: Market,
    score: Score,
    *,
    speed: Callable[[Offering], float],
    start: Sequence[Candidate] = (),
) -> Candidate | None:
    """The usable candidate of one market whose offering has the highest ``speed``, or the
    fastest of ``start`` (candidates already known usable) when none is faster.

    Only an offering faster than the best found so far is screened and scored,
    so a large catalog costs one pass of speed lookups.
    """
    best = max(start, key=lambda c: speed(c.offering), default=None)
    fastest = -math.inf if best is None else speed(best.offering)
    checks = Screen(ctx)
    per_node = ctx.spec.resources.gpus_per_node
    for gpu in ctx.spec.resources.gpus:
        for off in index.bucket(gpu, per_node, market):
            if speed(off) <= fastest:
                continue
            candidate = _usable(ctx, checks, score, off, market)
            if candidate is not None:
                best, fastest = candidate, speed(off)
    return best


def decide(
    ctx: PlacementContext,
    index: OfferingIndex,
    markets: Sequence[Market],
    score: Score,
    choice: Candidate | None,
) -> Decision:
    """The decision, with the full ranking built when read, and its near misses (the
    offerings of the job's GPU models and node size, excluded) walked apart."""

    def everything() -> list[Candidate]:
        explain = _explainer(ctx, score)
        usable: list[Candidate] = []
        excluded: list[Candidate] = []
        for off in index:
            for market in markets:
                candidate = explain(off, market)
                (usable if candidate.excluded is None else excluded).append(candidate)
        usable.sort(key=rank_key(ctx))
        if choice is not None:
            key = (choice.offering.pool, choice.market)
            usable.sort(key=lambda c: (c.offering.pool, c.market) != key)
        return [*usable, *excluded]

    def near() -> list[Candidate]:
        # The buckets the placement walked, no more: a waiting job's reason costs
        # what its placement did, not a pass over the whole market.
        explain = _explainer(ctx, score)
        per_node = ctx.spec.resources.gpus_per_node
        return [
            candidate
            for market in markets
            for gpu in ctx.spec.resources.gpus
            for off in index.bucket(gpu, per_node, market)
            if (candidate := explain(off, market)).excluded is not None
        ]

    return Decision(choice, later=everything, near=near)


def _explainer(ctx: PlacementContext, score: Score) -> Score:
    """A function giving each (offering, market) as a candidate: scored when usable, else
    with the hard filter or the budget that excludes it."""
    checks = Screen(ctx)
    nodes = ctx.spec.resources.nodes
    hours = remaining_hours(ctx)

    def explain(off: Offering, market: Market) -> Candidate:
        reason = checks.reason(off, market)
        if reason is None:
            candidate = score(off, market)
            budget = over_budget(ctx, candidate.expected_cost_usd)
            # Over budget, it keeps the policy's expected cost: the figure it is over by.
            return candidate if budget is None else replace(candidate, excluded=budget)
        per_hour = (off.price(market) or 0.0) * nodes
        return Candidate(off, market, nodes, per_hour, per_hour * hours, excluded=reason)

    return explain


def _usable(
    ctx: PlacementContext, checks: Screen, score: Score, off: Offering, market: Market
) -> Candidate | None:
    if checks.reason(off, market) is not None:
        return None
    candidate = score(off, market)
    if over_budget(ctx, candidate.expected_cost_usd) is not None:
        return None
    return candidate


def _add_current(
    ctx: PlacementContext,
    index: OfferingIndex,
    checks: Screen,
    score: Score,
    found: list[Candidate],
) -> None:
    market = ctx.current_market
    if ctx.current is None or market is None:
        return
    if any(c.offering.pool == ctx.current and c.market is market for c in found):
        return
    for gpu in ctx.spec.resources.gpus:
        for off in index.bucket(gpu, ctx.spec.resources.gpus_per_node, market):
            if off.pool == ctx.current:
                candidate = _usable(ctx, checks, score, off, market)
                if candidate is not None:
                    found.append(candidate)
                return


def rank_key(ctx: PlacementContext) -> Callable[[Candidate], tuple[float, int, str, str]]:
    """The order candidates are ranked in: expected cost, then, on an exact tie, the
    job's GPU models in the order it lists them (best first), then pool and market
    (so the ranking is the same on every run)."""
    order = {gpu: i for i, gpu in enumerate(ctx.spec.resources.gpus)}
    unlisted = len(order)

    def key(c: Candidate) -> tuple[float, int, str, str]:
        preference = order.get(c.offering.gpu, unlisted)
        return (c.expected_cost_usd, preference, str(c.offering.pool), str(c.market))

    return key
