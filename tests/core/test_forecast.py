"""The cost-to-finish model: Young's expectation, a Poisson tail, the work left."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotd.core.forecast import ForecastBasis, forecast, poisson_quantile, work_left

NOW = datetime(2026, 3, 1, tzinfo=UTC)
RESTART = 0.25


def breakdown(work: float, rate: float, lost: float, *, write_share: float = 0.02,
              changeover: float = 0.25, price: float = 10.0) -> dict[str, float]:
    """A breakdown as spotd_policies.costmodel writes it, by its own formula."""
    wall = work * (1 + write_share) / (1 - rate * (lost + RESTART))
    return {
        "work_hours": work, "preemptions_per_hour": rate, "lost_per_preemption_hours": lost,
        "preemption_overhead_hours": wall - work, "changeover_hours": changeover,
        "migration_hours": 0.0, "migration_usd": 3.0, "price_per_hour": price,
        "expected_hours": wall + changeover,
    }  # fmt: skip


def exact_cdf(mean: float, k: int) -> float:
    return sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(k + 1))


@pytest.mark.parametrize("mean", [0.1, 1.0, 2.5, 7.0, 40.0])
def test_the_poisson_quantile_is_the_smallest_count_reaching_the_share(mean: float) -> None:
    k = poisson_quantile(mean, 0.9)
    assert exact_cdf(mean, k) >= 0.9
    assert k == 0 or exact_cdf(mean, k - 1) < 0.9


def test_a_large_mean_takes_the_normal_approximation_near_the_exact_count() -> None:
    exact = poisson_quantile(499.0, 0.9)
    approx = poisson_quantile(501.0, 0.9)
    assert abs(approx - exact) <= 3
    assert poisson_quantile(0.0, 0.9) == 0


def test_the_expectation_is_the_policys_own() -> None:
    b = breakdown(work=40.0, rate=0.05, lost=0.5)
    f = forecast(b, priced_hours=40.0, left=(40.0, ForecastBasis.COMPUTE_HOURS),
                 restart_hours=RESTART, now=NOW)  # fmt: skip
    assert f is not None
    assert f.expected_hours == pytest.approx(b["expected_hours"])
    assert f.expected_usd == pytest.approx(b["expected_hours"] * 10.0 + 3.0)
    assert f.finish_at == NOW + timedelta(hours=f.expected_hours)
    assert f.p90_hours > f.expected_hours
    assert f.p90_finish_at > f.finish_at


def test_on_demand_has_no_spread() -> None:
    f = forecast(breakdown(work=10.0, rate=0.0, lost=0.0), priced_hours=10.0,
                 left=(10.0, ForecastBasis.COMPUTE_HOURS), restart_hours=RESTART, now=NOW)
    assert f is not None
    assert f.p90_usd == f.expected_usd and f.expected_preemptions == 0


def test_nine_in_ten_simulated_runs_end_within_the_p90() -> None:
    """The model's own runs: preemptions as a Poisson process over the run, each
    costing the work lost and a restart. The P90 must hold about nine in ten."""
    rate, lost, work = 0.08, 0.6, 30.0
    b = breakdown(work=work, rate=rate, lost=lost, write_share=0.0, changeover=0.0)
    f = forecast(b, priced_hours=work, left=(work, ForecastBasis.COMPUTE_HOURS),
                 restart_hours=RESTART, now=NOW)  # fmt: skip
    assert f is not None
    rng = random.Random(7)
    runs = 4000
    within = 0
    for _ in range(runs):
        hours, done = 0.0, 0.0
        while True:
            gap = rng.expovariate(rate)
            if done + gap >= work:
                hours += work - done
                break
            hours += gap + RESTART
            done += max(0.0, gap - lost)  # the work since the last checkpoint is lost
        within += hours <= f.p90_hours
    assert 0.85 <= within / runs <= 0.99


@given(
    work=st.floats(0.1, 500), rate=st.floats(0.0, 0.5), lost=st.floats(0.0, 1.0),
    scale=st.floats(0.01, 100),
)  # fmt: skip
def test_the_p90_is_never_below_the_expectation(
    work: float, rate: float, lost: float, scale: float
) -> None:
    if rate * (lost + RESTART) >= 0.95:
        return  # the policy calls such a pool hopeless and prices it apart
    f = forecast(breakdown(work=work, rate=rate, lost=lost), priced_hours=1.0,
                 left=(scale, ForecastBasis.PACE), restart_hours=RESTART, now=NOW)
    assert f is not None
    assert f.p90_hours >= f.expected_hours >= 0
    assert f.p90_usd >= f.expected_usd


def test_the_work_left_comes_from_the_compute_hours_or_the_jobs_own_pace() -> None:
    assert work_left(24.0, 6.0, (10, 1000)) == (18.0, ForecastBasis.COMPUTE_HOURS)
    # No compute hours: 2 h for the first quarter of the steps, 6 h for the rest.
    assert work_left(None, 2.0, (250, 1000)) == (6.0, ForecastBasis.PACE)
    assert work_left(None, 2.0, None) is None
    assert work_left(None, 0.0, (0, 1000)) is None


def test_a_breakdown_without_the_model_has_no_forecast() -> None:
    assert forecast({"hours": 3.0}, priced_hours=1.0, left=(5.0, ForecastBasis.PACE),
                    restart_hours=RESTART, now=NOW) is None
