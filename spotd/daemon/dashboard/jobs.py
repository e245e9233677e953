"""The jobs page: one keyset page of jobs from the store, each as a line of the table.

A page reads its jobs, then their attempts and ledger lines in one query each
(as ``GET /v1/jobs`` does), so it costs the same with ten jobs in the store or
ten thousand, on the first page or the hundredth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from spotd.billing.ledger import ledger_so_far
from spotd.billing.savings import claims_saving
from spotd.core.clock import clock_note
from spotd.core.errors import StoreError
from spotd.core.failures import failure_sentence
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, JobRecord, LedgerEntry
from spotd.daemon.metrics import on_demand_prices
from spotd.daemon.reader import Reader
from spotd.daemon.views import STATUS_WORDS, ProgressView, progress_view

PAGE_SIZE = 50
"""Jobs in one page of the table."""


@dataclass(frozen=True)
class JobFilter:
    """What the jobs page was asked for: a status word, part of a name, a cursor."""

    status: str = ""
    name: str = ""
    cursor: str = ""

    @classmethod
    def of(cls, status: str | None, name: str | None, cursor: str | None) -> JobFilter:
        """The filter from the query string; an unknown status word shows every job."""
        word = status if status in STATUS_WORDS else ""
        return cls(word, (name or "").strip()[:200], cursor or "")

    @property
    def query(self) -> str:
        """The filter as a query string (the fragment's, the next page's)."""
        fields = {"status": self.status, "name": self.name, "cursor": self.cursor}
        return urlencode({k: v for k, v in fields.items() if v})

    def after(self, cursor: str) -> JobFilter:
        """The same filter from the page after ``cursor`` on."""
        return JobFilter(self.status, self.name, cursor)


@dataclass(frozen=True)
class Money:
    """What a job has cost by its ledger, and the same hours on on-demand; a job that
    failed or was cancelled is shown its spend only (:mod:`spotd.billing.savings`)."""

    cost_usd: float
    on_demand_usd: float
    status: JobStatus = JobStatus.SUCCEEDED

    @property
    def so_far(self) -> bool:
        """The job has not ended: its cost grows until it does."""
        return not self.status.terminal

    @property
    def savings_usd(self) -> float | None:
        """What spot saved against on-demand (negative: it cost more); None for a job
        that failed or was cancelled, whose spend claims no saving."""
        if not claims_saving(self.status):
            return None
        return self.on_demand_usd - self.cost_usd

    @property
    def savings_pct(self) -> float | None:
        """The savings as a share of the on-demand equivalent; None without one."""
        saved = self.savings_usd
        if saved is None or self.on_demand_usd <= 0:
            return None
        return 100 * saved / self.on_demand_usd


@dataclass(frozen=True)
class JobLine:
    """One job as the table shows it."""

    job: JobRecord
    attempts: int
    preemptions: int
    progress: ProgressView
    money: Money
    failure_reason: str | None = None
    """Why the failed job failed, in a few words (:func:`spotd.core.failures.failure_sentence`)."""

    @property
    def done_pct(self) -> float | None:
        """How far the job is, where that is known: its own steps, or the estimate."""
        p = self.progress
        if p.step is not None and p.total_steps:
            return min(100.0, 100 * p.step / p.total_steps)
        if p.compute_hours:
            return min(100.0, 100 * p.done_hours / p.compute_hours)
        return None


@dataclass(frozen=True)
class JobsShown:
    """One page of the table and the cursor of the next."""

    lines: list[JobLine]
    next: str | None
    clock: str | None
    """:func:`~spotd.core.clock.clock_note` of the times shown."""
    refused: str | None = None
    """Why the filter was not read (a cursor the store did not make)."""


def job_table(reader: Reader, wanted: JobFilter, limit: int = PAGE_SIZE) -> JobsShown:
    """The page of jobs ``wanted`` names, newest first."""
    clock = clock_note(reader.clock)
    try:
        page = reader.store.jobs_page(
            statuses=STATUS_WORDS.get(wanted.status), limit=limit,
            cursor=wanted.cursor or None, name=wanted.name or None,
        )  # fmt: skip
    except StoreError as exc:
        return JobsShown([], None, clock, refused=str(exc))
    ids = [j.id for j in page.jobs]
    attempts = reader.store.attempts_for(ids)
    ledger = reader.store.ledger_for(ids)
    now = reader.clock.now()
    lines = [job_line(reader, j, attempts[j.id], ledger[j.id], now) for j in page.jobs]
    return JobsShown(lines, page.next, clock)


def job_line(
    reader: Reader,
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    ledger: Sequence[LedgerEntry],
    now: datetime,
) -> JobLine:
    """A job's line: progress, slack and money by its ledger so far."""
    money = money_of(reader, job, attempts, ledger, now)
    reason = None
    if job.failure is not None:
        reason = failure_sentence(job.failure, job.failure_facts, job.spec,
                                  spent_usd=money.cost_usd, zone=reader.zone)  # fmt: skip
    return JobLine(
        job=job,
        attempts=len(attempts),
        preemptions=sum(a.end_reason is AttemptEnd.PREEMPTED for a in attempts),
        progress=progress_view(job, attempts, now),
        money=money,
        failure_reason=reason,
    )


def money_of(
    reader: Reader,
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    ledger: Sequence[LedgerEntry],
    now: datetime,
) -> Money:
    """The job's ledger so far, the running attempt priced against the on-demand price
    its pool lists now (as ``/metrics`` does)."""
    prices = on_demand_prices(reader.market, attempts)
    entries = ledger_so_far(job, attempts, ledger, now, on_demand_prices=prices)
    return Money(
        cost_usd=sum(e.usd for e in entries),
        on_demand_usd=sum(e.on_demand_usd for e in entries),
        status=job.status,
    )
