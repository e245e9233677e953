"""Which spend may be credited with a saving against on-demand, and how much.

A saving is what the same hours would have cost on on-demand, less what they cost on
spot, for work that came of them. A job that failed or was cancelled paid for hours
whose work nothing kept: every view shows what it spent, never a saving (nor a
negative one). Its spend still counts in every spend figure.
"""

from __future__ import annotations

from collections.abc import Iterable

from spotd.core.values import JobStatus, LedgerEntry

NO_SAVING = frozenset({JobStatus.FAILED, JobStatus.CANCELLED})
"""The statuses of jobs whose spend is shown as spend only."""


def claims_saving(status: JobStatus | str) -> bool:
    """Whether a job in ``status`` may be credited with a saving; an unknown status (an
    entry billed before any status) may."""
    try:
        return JobStatus(status) not in NO_SAVING
    except ValueError:
        return True


def saving_of(entries: Iterable[LedgerEntry]) -> tuple[float, float]:
    """``(saving, on-demand equivalent)`` of the lines of ``entries`` whose job may claim
    one (by the status each line was billed with): the saving is that equivalent less
    those lines' spend."""
    saved = on_demand = 0.0
    for e in entries:
        if claims_saving(e.job_status):
            saved += e.on_demand_usd - e.usd
            on_demand += e.on_demand_usd
    return saved, on_demand


def spend_without_saving(entries: Iterable[LedgerEntry]) -> float:
    """The spend of the lines whose job failed or was cancelled (no saving claimed)."""
    return sum(e.usd for e in entries if not claims_saving(e.job_status))
