"""Per-policy figures on shares of the start points: halves, subsets and closure."""

from __future__ import annotations

import math

import numpy as np

from spotd.simulate.metrics import PolicyRun, closure, halves, summarize
from spotd.simulate.model import Outcome


def outcome(missed: bool) -> Outcome:
    return Outcome(
        start=0, cost=1.0, missed=missed, finish_tick=None if missed else 5, spot_ticks=3,
        od_ticks=2, preemptions=1, launches=2, goodput=0.9,
    )


def test_halves_keep_windows_on_one_side_of_the_middle() -> None:
    first, second = halves([0, 30, 45, 50, 51, 90], window=20, length=100)
    assert first.label == "first half" and second.label == "second half"
    # 30 + 20 = 50 ends at the middle; 45 straddles it and belongs to neither half.
    assert first.mask.tolist() == [True, True, False, False, False, False]
    assert second.mask.tolist() == [False, False, False, True, True, True]


def test_a_subset_keeps_costs_and_outcomes_of_the_chosen_starts() -> None:
    run = PolicyRun("p", np.array([1.0, 2.0, 3.0]), (outcome(False), outcome(True), outcome(False)))
    part = run.subset(np.array([False, True, True]))
    assert part.costs.tolist() == [2.0, 3.0]
    assert part.outcomes is not None and [o.missed for o in part.outcomes] == [True, False]
    od = np.array([4.0, 4.0])
    metrics = summarize(part, od, np.array([1.0, 1.0]))
    assert metrics.misses == 1 and math.isclose(metrics.mean_cost, 2.5 / 4)
    dp = PolicyRun("opt", np.array([1.0, 2.0]), None)
    assert dp.subset(np.array([True, False])).outcomes is None


def test_closure_is_the_share_of_the_baselines_gap_closed() -> None:
    assert closure(0.5, best=0.7, optimum=0.5) == 1.0
    assert closure(0.7, best=0.7, optimum=0.5) == 0.0
    assert math.isclose(closure(0.6, best=0.7, optimum=0.5), 0.5)
    assert closure(0.8, best=0.7, optimum=0.5) < 0
    assert math.isnan(closure(0.5, best=0.5, optimum=0.5))
