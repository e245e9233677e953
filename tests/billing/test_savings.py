"""spotd.billing.savings: a failed or cancelled job's spend claims no saving."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spotd.billing.savings import claims_saving, saving_of, spend_without_saving
from spotd.core.values import JobStatus, LedgerEntry

AT = datetime(2026, 3, 2, tzinfo=UTC)


def line(status: str, usd: float, on_demand: float) -> LedgerEntry:
    return LedgerEntry(
        job_id=f"j-{status}", attempt=1, provider="aws", region="r", zone="z",
        instance_type="t", gpu="A100", gpus=1, nodes=1, fabric="ethernet", market="spot",
        kind="compute", start=AT, end=AT, billed_seconds=3600.0, usd=usd,
        on_demand_usd=on_demand, job_status=status,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("status", "claims"),
    [*((s, s not in (JobStatus.FAILED, JobStatus.CANCELLED)) for s in JobStatus), ("", True)],
)
def test_only_failed_and_cancelled_jobs_claim_no_saving(status: str, claims: bool) -> None:
    assert claims_saving(status) is claims


def test_the_saving_leaves_out_the_lines_of_failed_and_cancelled_jobs() -> None:
    lines = [line("succeeded", 1.0, 3.0), line("running", 2.0, 5.0),
             line("failed", 4.0, 9.0), line("cancelled", 1.5, 2.0)]  # fmt: skip
    assert saving_of(lines) == pytest.approx((5.0, 8.0))
    assert spend_without_saving(lines) == pytest.approx(5.5)
    assert saving_of([]) == (0.0, 0.0)
