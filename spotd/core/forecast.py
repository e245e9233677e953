"""Cost to finish: what a job is expected to spend from now to its end, and when it
ends, with the 90th percentile of both, from the policy's own model.

The figures are the policy's breakdown of the offering the job runs on (or would
start on), as ``spotd plan`` shows it (:mod:`spotd_policies.costmodel`): the work
left at the offering's speed, stretched by checkpoint writes, and Young's
expected loss to preemptions,

    wall = base / (1 - rate * (lost + restart)),   base = work * (1 + write / interval)

so the expected number of preemptions before the end is ``rate * wall`` and
each costs ``lost + restart`` hours. The percentile keeps that model and lets
the count vary: preemptions arrive as a Poisson process, so the 90th
percentile adds ``lost + restart`` hours for each preemption up to the
Poisson quantile of mean ``rate * wall``. On-demand (rate 0) has no spread.

What "the work left" is depends on what the job says of itself
(:class:`ForecastBasis`): its ``deadline.compute_hours`` less what is done, or,
where it gives none but reports its steps through ``spotd.train``, the hours
done so far scaled by the steps it has left. A job that says neither has no
forecast: the policies price one hour of such a job's work, which is no
figure for its whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

__all__ = [
    "P90",
    "Forecast",
    "ForecastBasis",
    "OverBudgetAction",
    "forecast",
    "poisson_quantile",
    "work_left",
]

P90 = 0.9
"""The percentile the forecast's upper figures are at."""


class ForecastBasis(StrEnum):
    """Where the forecast's work left comes from."""

    COMPUTE_HOURS = "compute-hours"
    """``deadline.compute_hours`` less the compute hours done."""
    PACE = "pace"
    """The job's own steps (``spotd.train``): the hours done so far per step done, times
    the steps left."""


class OverBudgetAction(StrEnum):
    """What a submit does with a job whose forecast exceeds its ``budget.max_usd``
    (``[scheduling] forecast_over_budget``)."""

    WARN = "warn"
    """Store the job, with a submit warning that gives the figures."""
    REFUSE = "refuse"
    """Store nothing: the submit is refused with the figures (exit 2)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """Expected cost and finish of a job from now, with their 90th percentiles."""

    basis: ForecastBasis
    work_left_hours: float
    """Compute hours left on the job's reference setup."""
    expected_usd: float
    p90_usd: float
    expected_hours: float
    """Wall hours from now to the end (changeover, checkpoint writes and preemptions in)."""
    p90_hours: float
    finish_at: datetime
    p90_finish_at: datetime
    expected_preemptions: float


def work_left(
    compute_hours: float | None, done_hours: float, steps: tuple[int, int] | None
) -> tuple[float, ForecastBasis] | None:
    """The compute hours the job has left and where that comes from; None when the job
    says nothing of its size (no ``compute_hours`` and no step reached yet)."""
    if compute_hours is not None:
        return max(0.0, compute_hours - done_hours), ForecastBasis.COMPUTE_HOURS
    if steps is None:
        return None
    step, total = steps
    if step <= 0 or total <= 0 or done_hours <= 0:
        return None
    return done_hours * max(0, total - step) / step, ForecastBasis.PACE


def forecast(
    breakdown: Mapping[str, float],
    *,
    priced_hours: float,
    left: tuple[float, ForecastBasis],
    restart_hours: float,
    now: datetime,
) -> Forecast | None:
    """The forecast from a candidate's ``breakdown`` (``spotd_policies.costmodel``).

    The policy priced ``priced_hours`` compute hours of work (the work left, or one
    hour for a job that gives no ``compute_hours``); the figures are rescaled to the
    ``left`` work. ``restart_hours`` is the changeover a preemption costs. None when
    the breakdown lacks the model's parts (a policy that gives only a price)."""
    needed = ("work_hours", "preemption_overhead_hours", "price_per_hour")
    if any(name not in breakdown for name in needed):
        return None
    hours_left, basis = left
    scale = hours_left / priced_hours if priced_hours > 0 else 0.0
    # Work and its stretch scale with the work; a changeover and a move do not.
    wall = (breakdown["work_hours"] + breakdown["preemption_overhead_hours"]) * scale
    rate = breakdown.get("preemptions_per_hour", 0.0)
    per_preemption = breakdown.get("lost_per_preemption_hours", 0.0) + restart_hours
    fixed = breakdown.get("changeover_hours", 0.0) + breakdown.get("migration_hours", 0.0)
    mean = rate * wall
    base = max(0.0, wall - mean * per_preemption)
    expected = wall + fixed
    p90 = max(expected, base + per_preemption * poisson_quantile(mean, P90) + fixed)
    price, moved = breakdown["price_per_hour"], breakdown.get("migration_usd", 0.0)
    return Forecast(
        basis=basis,
        work_left_hours=hours_left,
        expected_usd=price * expected + moved,
        p90_usd=price * p90 + moved,
        expected_hours=expected,
        p90_hours=p90,
        finish_at=now + timedelta(hours=expected),
        p90_finish_at=now + timedelta(hours=p90),
        expected_preemptions=mean,
    )


def poisson_quantile(mean: float, q: float) -> int:
    """The smallest count k with P(N <= k) >= q for N ~ Poisson(``mean``)."""
    if mean <= 0:
        return 0
    if mean > 500:
        # The normal approximation, where the terms below would underflow.
        return max(0, math.ceil(mean + _z(q) * math.sqrt(mean) - 0.5))
    k, term = 0, math.exp(-mean)
    total = term
    while total < q:
        k += 1
        term *= mean / k
        total += term
    return k


def _z(q: float) -> float:
    """The standard normal quantile, by bisection on the error function."""
    low, high = -10.0, 10.0
    for _ in range(80):
        mid = (low + high) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < q:
            low = mid
        else:
            high = mid
    return (low + high) / 2
