"""A job's cost to finish as the readers show it: in ``spotd status``, on the dashboard,
in reports, and at submit against the job's budget.

The figures are :mod:`spotd.core.forecast`'s, over the policy's answer for the
job now (:meth:`spotd.daemon.reader.Planner.ask`): the offering it runs on,
where it runs, else the one the policy would start it on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel

from spotd.core.forecast import Forecast, ForecastBasis, forecast, work_left
from spotd.core.progress import reported_steps
from spotd.core.values import Candidate, Decision, InstanceReport, PlacementContext

__all__ = [
    "ForecastView",
    "forecast_of",
    "forecast_view",
    "over_budget_detail",
]


class ForecastView(BaseModel):
    """What the job is expected to spend from now and when it is expected to end,
    with the 90th percentile of both (:mod:`spotd.core.forecast`)."""

    basis: ForecastBasis
    work_left_hours: float
    expected_usd: float
    p90_usd: float
    expected_hours: float
    p90_hours: float
    finish_at: datetime
    p90_finish_at: datetime
    expected_preemptions: float
    offering: str
    """The pool and market the figures are for: where the job runs, or would start."""


def forecast_of(
    ctx: PlacementContext, decision: Decision, reports: Sequence[InstanceReport]
) -> tuple[Forecast, Candidate] | None:
    """The job's forecast on where it runs (else on the policy's choice), with that
    candidate; None when the job says nothing of its size or nothing can run it."""
    candidate = _running_on(ctx, decision) or decision.choice
    if candidate is None:
        return None
    deadline = ctx.spec.deadline
    compute_hours = deadline.compute_hours if deadline is not None else None
    left = work_left(compute_hours, ctx.done_hours, reported_steps(reports))
    if left is None:
        return None
    # What the policy priced: the work left, or one hour of a job of unknown size
    # (spotd_policies.costmodel.remaining_hours).
    priced = max(0.0, compute_hours - ctx.done_hours) if compute_hours is not None else 1.0
    found = forecast(candidate.breakdown, priced_hours=priced, left=left,
                     restart_hours=ctx.changeover_hours, now=ctx.now)  # fmt: skip
    return None if found is None else (found, candidate)


def forecast_view(found: tuple[Forecast, Candidate] | None) -> ForecastView | None:
    """The view of :func:`forecast_of`'s answer, rounded as the API gives figures."""
    if found is None:
        return None
    f, candidate = found
    return ForecastView(
        basis=f.basis,
        work_left_hours=round(f.work_left_hours, 4),
        expected_usd=round(f.expected_usd, 2),
        p90_usd=round(f.p90_usd, 2),
        expected_hours=round(f.expected_hours, 4),
        p90_hours=round(f.p90_hours, 4),
        finish_at=f.finish_at,
        p90_finish_at=f.p90_finish_at,
        expected_preemptions=round(f.expected_preemptions, 3),
        offering=f"{candidate.offering.pool} {candidate.market}",
    )


def over_budget_detail(view: ForecastView, spent_usd: float, budget_usd: float) -> str | None:
    """Why the job's forecast exceeds its budget, with the figures; None when it does not.

    The expected figure decides: the P90 is said beside it, as the risk it is.
    """
    total = spent_usd + view.expected_usd
    if total <= budget_usd:
        return None
    return (
        f"expected to cost {total:,.2f} USD in all (P90 {spent_usd + view.p90_usd:,.2f}) on "
        f"{view.offering}, over its budget.max_usd of {budget_usd:,.2f}"
    )


def _running_on(ctx: PlacementContext, decision: Decision) -> Candidate | None:
    """The candidate of the pool and market the job runs on, when the policy scored it."""
    if ctx.current is None:
        return None
    return next(
        (c for c in decision.candidates
         if c.offering.pool == ctx.current and c.market is ctx.current_market and c.breakdown),
        None,
    )  # fmt: skip
