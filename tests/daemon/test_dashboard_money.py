"""spotd.daemon.dashboard.jobs.Money: a job's cost, and a saving only where one is claimed."""

from __future__ import annotations

import pytest

from spotd.core.states import JobStatus
from spotd.daemon.dashboard.jobs import Money


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.CANCELLED])
def test_a_failed_or_cancelled_job_shows_its_spend_and_no_saving(status: JobStatus) -> None:
    money = Money(cost_usd=16.39, on_demand_usd=40.0, status=status)
    assert (money.savings_usd, money.savings_pct, money.so_far) == (None, None, False)


def test_a_running_job_saves_so_far_and_one_that_succeeded_for_good() -> None:
    running = Money(cost_usd=10.0, on_demand_usd=40.0, status=JobStatus.RUNNING)
    assert (running.savings_usd, running.savings_pct, running.so_far) == (30.0, 75.0, True)
    done = Money(cost_usd=50.0, on_demand_usd=40.0, status=JobStatus.SUCCEEDED)
    assert (done.savings_usd, done.so_far) == (-10.0, False), "spot cost more: said so"
    assert Money(cost_usd=1.0, on_demand_usd=0.0).savings_pct is None
