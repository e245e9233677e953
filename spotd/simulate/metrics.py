"""Per-policy figures over all start points of a job, normalised by on-demand only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spotd.simulate.model import Outcome

__all__ = ["PolicyMetrics", "PolicyRun", "Split", "closure", "halves", "summarize"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One policy on every start point: costs, and outcomes where the engine ran it."""

    name: str
    costs: FloatArray
    outcomes: tuple[Outcome, ...] | None
    """None for the omniscient DP, which yields only its cost."""

    def subset(self, mask: BoolArray) -> PolicyRun:
        """The same run on the start points ``mask`` selects."""
        outs = None if self.outcomes is None else tuple(
            o for o, keep in zip(self.outcomes, mask.tolist(), strict=True) if keep
        )
        return PolicyRun(self.name, self.costs[mask], outs)


@dataclass(frozen=True, slots=True)
class Split:
    """A share of a job's start points, named for tables."""

    label: str
    mask: BoolArray


def halves(starts: Sequence[int], window: int, length: int) -> tuple[Split, Split]:
    """The start points whose whole deadline window lies in the trace's first half, and
    those that start in its second half.

    A rule chosen by the first (tuning) half is judged on the second (held out),
    whose jobs see the first half only as history, as a daemon would. Starts
    whose window straddles the middle belong to neither.
    """
    at = np.asarray(starts, dtype=np.int64)
    middle = length // 2
    return (
        Split("first half", at + window <= middle),
        Split("second half", at >= middle),
    )


def closure(ours: float, best: float, optimum: float) -> float:
    """The share of the best baseline's gap to the optimum a policy closes: 1 at the
    optimum, 0 level with the baseline, negative behind it (NaN without a gap)."""
    gap = best - optimum
    return (best - ours) / gap if gap > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class PolicyMetrics:
    """What the results table shows for one policy (None where it does not apply)."""

    policy: str
    mean_cost: float
    """Mean cost normalised by the on-demand-only cost of the same start point."""
    p75_cost: float
    savings: float
    """1 - mean_cost: the share of the on-demand bill saved."""
    misses: int
    gap: float
    """Mean normalised cost above the omniscient optimum's."""
    mean_usd: float
    """Mean cost in the cost model's unit (USD, or spot instance-hours in the reference)."""
    spot_share: float | None
    """Share of paid instance-hours on spot."""
    preemptions: float | None
    """Preemptions per job."""
    launches: float | None
    """Instance starts per job."""
    goodput: float | None
    """Share of paid hours that produced progress that was kept."""


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def summarize(run: PolicyRun, od_costs: FloatArray, opt_costs: FloatArray) -> PolicyMetrics:
    """Aggregate one policy's run against the on-demand and omniscient costs."""
    norm = run.costs / od_costs
    opt = opt_costs / od_costs
    outs = run.outcomes
    paid = sum(o.spot_ticks + o.od_ticks for o in outs) if outs else 0
    return PolicyMetrics(
        policy=run.name,
        mean_cost=float(norm.mean()),
        p75_cost=float(np.percentile(norm, 75)),
        savings=float(1.0 - norm.mean()),
        misses=sum(o.missed for o in outs) if outs else 0,
        gap=float((norm - opt).mean()),
        mean_usd=float(run.costs.mean()),
        spot_share=None if outs is None else (
            sum(o.spot_ticks for o in outs) / paid if paid else 0.0),
        preemptions=None if outs is None else _mean([o.preemptions for o in outs]),
        launches=None if outs is None else _mean([o.launches for o in outs]),
        goodput=None if outs is None else _mean([o.goodput for o in outs]),
    )
