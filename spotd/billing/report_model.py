"""The content of ``spotd report``: totals, per-job rows, roll-ups and findings, from the ledger.

Every money figure is a sum of :class:`~spotd.core.values.LedgerEntry` lines that
start in the period, so a report's totals are the ledger's, whatever the
format it is rendered in (:mod:`spotd.billing.report_render`).

Definitions:

- spend: what was paid (compute + changeover + egress), by every job: a
  running job's so far (its open attempt priced to the report's ``now``,
  :func:`spotd.billing.ledger.ledger_so_far`), marked so; on-demand
  equivalent: the same billed time at on-demand prices; savings: the
  difference, over the jobs that did not fail and were not cancelled
  (:mod:`spotd.billing.savings`: theirs is spend only); savings % of those
  jobs' on-demand equivalent.
- GPU-hours: billed node-hours times GPUs per node.
- preemptions: attempts that ended ``preempted`` in the period, but for those a
  drill ended (``spotd drill``, :mod:`spotd.billing.drills`), which are counted
  as drills, with what resuming from them cost (the next attempt's changeover).
- time lost to recovery: the changeover hours (launch to running) of every
  attempt after a job's first, in the period: paid time that made no
  progress because the job had to start again (the first attempt's boot is
  the start of the job, not a recovery). Work lost since the last checkpoint
  is not counted: the daemon cannot see it.
- least reliable pool: most preemptions per running hour of its attempts
  in the period (only pools with a preemption).
- underused GPUs: attempts whose agents sampled a GPU under 85 % utilisation
  (NVML, with the heartbeats); the share of samples, and that share of the
  attempt's compute GPU-hours and spend.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta

from pydantic import BaseModel, ConfigDict

from spotd.billing.drills import Drilled, drilled_attempts, resume_entries
from spotd.billing.ledger import ledger_so_far
from spotd.billing.savings import claims_saving, saving_of, spend_without_saving
from spotd.core.agent_wire import GPU_UTIL_THRESHOLD_PCT
from spotd.core.contracts import Clock, Store
from spotd.core.states import ACTIVE
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    InstanceReport,
    JobRecord,
    LedgerEntry,
    attempt_reports,
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Period(_Frozen):
    """The reported time, ``[since, until)``."""

    since: datetime
    until: datetime


class Totals(_Frozen):
    """The period's sums over the ledger (USD, hours)."""

    spend_usd: float
    on_demand_usd: float
    savings_usd: float
    """The saving of the jobs that did not fail and were not cancelled."""
    savings_pct: float
    """``savings_usd`` of those jobs' on-demand equivalent."""
    egress_usd: float
    gpu_hours: float
    preemptions: int
    recovery_hours: float
    jobs: int
    no_saving_usd: float = 0.0
    """The spend of jobs that failed or were cancelled: in ``spend_usd``, with no saving."""
    running_usd: float = 0.0
    """The spend so far of jobs still running (in ``spend_usd``): it grows until they end."""
    drills: int = 0
    """Preemptions that drills asked for (not in ``preemptions``)."""
    drill_usd: float = 0.0
    """What resuming from the drills cost (in ``spend_usd``)."""


class JobRow(_Frozen):
    """One job's part of the period."""

    job_id: str
    name: str
    status: str
    spend_usd: float
    on_demand_usd: float
    savings_usd: float | None
    """None for a job that failed or was cancelled: its spend is spend only."""
    gpu_hours: float
    preemptions: int
    recovery_hours: float
    so_far: bool = False
    """The job is still running: its spend is so far, and grows until it ends."""
    to_finish_usd: float | None = None
    """A running job's expected spend from the report's end to its own end
    (:mod:`spotd.core.forecast`); None when unknown or not asked for."""
    to_finish_p90_usd: float | None = None
    """The 90th percentile of ``to_finish_usd``."""
    drills: int = 0
    """The job's preemptions that drills asked for (not in ``preemptions``)."""
    drill_usd: float = 0.0
    """What resuming from them cost: the changeover of the attempts that followed."""

    @property
    def status_shown(self) -> str:
        """The status as the report shows it: ``running, so far`` for a running job."""
        return f"{self.status}, so far" if self.so_far else self.status


class Rollup(_Frozen):
    """Spend of the period grouped by one key (a provider, a region, a day...)."""

    key: str
    spend_usd: float
    on_demand_usd: float
    savings_usd: float
    """The saving of the group's jobs that did not fail and were not cancelled."""
    gpu_hours: float


class DailySpend(_Frozen):
    """One UTC day: spend by provider and the on-demand equivalent."""

    day: date
    by_provider: dict[str, float]
    on_demand_usd: float


class Underused(_Frozen):
    """An attempt whose GPUs were under the threshold in some of its samples.

    The share is of its agents' samples in which a node's lowest GPU was under
    :data:`~spotd.core.agent_wire.GPU_UTIL_THRESHOLD_PCT` (a synchronous job waits
    for its slowest GPU); ``gpu_hours`` and ``usd`` are that share of what the
    attempt's compute cost.
    """

    job_id: str
    name: str
    attempt: int
    low_share: float
    mean_lowest_pct: float
    gpu_hours: float
    usd: float


class Report(_Frozen):
    """Everything ``spotd report`` shows, in any format."""

    period: Period
    totals: Totals
    jobs: list[JobRow]
    by_provider: list[Rollup]
    by_region: list[Rollup]
    by_gpu: list[Rollup]
    by_fabric: list[Rollup]
    by_gpu_fabric: list[Rollup]
    by_market: list[Rollup]
    by_day: list[Rollup]
    daily: list[DailySpend]
    findings: list[str]
    zone: str = "UTC"
    """The zone the report's times are shown in (``[display] timezone``)."""
    clock_note: str | None = None
    """What clock the records are on when it is not at real speed
    (:func:`spotd.core.clock.clock_note`); None on real time."""
    underused: list[Underused] = []
    """Attempts whose GPUs sat under the utilisation threshold, worst first."""


ToFinish = Callable[[JobRecord], tuple[float, float] | None]
"""A running job's expected spend to its end and its 90th percentile, in USD; None when
unknown."""


def build_report(
    store: Store,
    *,
    since: datetime,
    until: datetime,
    job_id: str | None = None,
    zone: str = "UTC",
    clock_note: str | None = None,
    clock: Clock | None = None,
    to_finish: ToFinish | None = None,
) -> Report:
    """The report of ``[since, until)``, of every job or one, from the stored ledger;
    its times shown in ``zone``, headed by ``clock_note`` when the records' clock is
    not at real speed. With the records' ``clock``, the running jobs' spend so far
    (their open attempts priced to its ``now``) is in it too, marked as such, and with
    ``to_finish`` (a daemon's forecast of a job: expected and P90 USD) what they are
    expected to spend until they end."""
    entries = store.ledger(since=since, until=until, job_id=job_id)
    if clock is not None:
        entries = with_running(store, entries, clock.now(), since=since, until=until,
                               job_id=job_id)  # fmt: skip
    ids = sorted({e.job_id for e in entries} | ({job_id} if job_id else set()))
    # One read for the period's jobs: one per job was most of the time with thousands.
    jobs = store.jobs_by_id(ids)
    jobs.update((i, store.get_job(i)) for i in ids if i not in jobs)  # JobNotFound
    attempts = store.attempts_for(ids)
    reports = store.reports_for(ids)
    built = report_from(entries, jobs, attempts, since=since, until=until, reports=reports,
                        drilled=drilled_attempts(store, attempts))  # fmt: skip
    if to_finish is not None:
        built = built.model_copy(update={"jobs": [_with_forecast(r, jobs, to_finish)
                                                  for r in built.jobs]})  # fmt: skip
    return built.model_copy(update={"zone": zone, "clock_note": clock_note})


def _with_forecast(row: JobRow, jobs: Mapping[str, JobRecord], to_finish: ToFinish) -> JobRow:
    job = jobs.get(row.job_id)
    found = to_finish(job) if row.so_far and job is not None else None
    if found is None:
        return row
    return row.model_copy(update={"to_finish_usd": found[0], "to_finish_p90_usd": found[1]})


def with_running(
    store: Store,
    entries: Sequence[LedgerEntry],
    now: datetime,
    *,
    since: datetime,
    until: datetime,
    job_id: str | None = None,
) -> list[LedgerEntry]:
    """``entries`` (stored lines of the period) with the active jobs' lines replaced by
    their ledger so far (:func:`~spotd.billing.ledger.ledger_so_far`): the stored lines
    cover closed attempts only, so a running job's open attempt is priced to ``now``."""
    active = [j for j in store.list_jobs(ACTIVE) if job_id is None or j.id == job_id]
    if not active:
        return list(entries)
    ids = [j.id for j in active]
    attempts = store.attempts_for(ids)
    stored = store.ledger_for(ids)
    fresh = [
        e
        for j in active
        for e in ledger_so_far(j, attempts.get(j.id, []), stored.get(j.id, []), now)
        if since <= e.start < until
    ]
    running = set(ids)
    return [*(e for e in entries if e.job_id not in running), *fresh]


def report_from(
    entries: Sequence[LedgerEntry],
    jobs: dict[str, JobRecord],
    attempts: dict[str, list[AttemptRecord]],
    *,
    since: datetime,
    until: datetime,
    reports: Mapping[str, Sequence[InstanceReport]] | None = None,
    drilled: Drilled = frozenset(),
) -> Report:
    """The report of ledger lines and the attempts of their jobs, with what their
    agents reported of the GPUs and which attempts drills ended (pure)."""
    period = Period(since=since, until=until)
    rows = _job_rows(entries, jobs, attempts, period, drilled)
    totals = _totals(entries, rows)
    underused = _underused(entries, jobs, attempts, reports or {})
    pools = _pool_reliability(attempts.values(), period, drilled)
    return Report(
        period=period,
        totals=totals,
        jobs=rows,
        by_provider=rollup(entries, lambda e: e.provider),
        by_region=rollup(entries, lambda e: f"{e.provider} {e.region}"),
        by_gpu=rollup(entries, lambda e: e.gpu),
        by_fabric=rollup(entries, lambda e: e.fabric),
        by_gpu_fabric=rollup(entries, lambda e: f"{e.gpu} / {e.fabric}"),
        by_market=rollup(entries, lambda e: e.market),
        by_day=rollup(entries, lambda e: e.start.date().isoformat(), by_key=True),
        daily=_daily(entries),
        findings=[*findings(totals, rows, pools, period), *_underused_sentences(underused)],
        underused=underused,
    )


def _underused(
    entries: Sequence[LedgerEntry],
    jobs: Mapping[str, JobRecord],
    attempts: Mapping[str, Sequence[AttemptRecord]],
    reports: Mapping[str, Sequence[InstanceReport]],
) -> list[Underused]:
    found = []
    for job_id, records in attempts.items():
        for a in records:
            own = attempt_reports(a, reports.get(job_id, ())).values()
            samples = sum(r.gpu_samples or 0 for r in own)
            low = sum(r.gpu_low_samples or 0 for r in own)
            if not samples or not low:
                continue
            compute = [e for e in entries if e.job_id == job_id and e.attempt == a.seq
                       and e.kind == "compute"]  # fmt: skip
            share = low / samples
            found.append(Underused(
                job_id=job_id, name=jobs[job_id].name if job_id in jobs else job_id,
                attempt=a.seq, low_share=share,
                mean_lowest_pct=sum(r.gpu_util_sum or 0.0 for r in own) / samples,
                gpu_hours=share * sum(e.gpu_hours for e in compute),
                usd=share * sum(e.usd for e in compute),
            ))  # fmt: skip
    return sorted(found, key=lambda u: (-u.usd, u.job_id, u.attempt))


def _underused_sentences(underused: Sequence[Underused]) -> list[str]:
    if not underused:
        return []
    worst = underused[0]
    more = f" ({len(underused) - 1} more attempts too)" if len(underused) > 1 else ""
    return [
        f"GPUs of {worst.name} ({worst.job_id}) attempt {worst.attempt} sat under "
        f"{GPU_UTIL_THRESHOLD_PCT:g} % in {worst.low_share:.0%} of samples (lowest GPU "
        f"{worst.mean_lowest_pct:.0f} % on average): {worst.gpu_hours:,.1f} GPU-hours, "
        f"{usd(worst.usd)} USD; the data pipeline is the usual bottleneck{more}."
    ]


def rollup(
    entries: Iterable[LedgerEntry], key: Callable[[LedgerEntry], str], *, by_key: bool = False
) -> list[Rollup]:
    """Sums by ``key``, biggest spend first (or in key order with ``by_key``)."""
    groups: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        groups[key(e)].append(e)
    rows = [_rollup(k, group) for k, group in groups.items()]
    order: Callable[[Rollup], tuple[float | str, ...]] = (
        (lambda r: (r.key,)) if by_key else (lambda r: (-r.spend_usd, r.key))
    )
    return sorted(rows, key=order)


def _rollup(key: str, entries: Sequence[LedgerEntry]) -> Rollup:
    return Rollup(
        key=key,
        spend_usd=sum(e.usd for e in entries),
        on_demand_usd=sum(e.on_demand_usd for e in entries),
        savings_usd=saving_of(entries)[0],
        gpu_hours=sum(e.gpu_hours for e in entries),
    )


def _job_rows(
    entries: Sequence[LedgerEntry],
    jobs: dict[str, JobRecord],
    attempts: dict[str, list[AttemptRecord]],
    period: Period,
    drilled: Drilled,
) -> list[JobRow]:
    by_job: dict[str, list[LedgerEntry]] = {i: [] for i in jobs}
    for e in entries:
        by_job.setdefault(e.job_id, []).append(e)
    rows = [_job_row(jobs[i], lines, attempts.get(i, []), period, drilled)
            for i, lines in by_job.items()]  # fmt: skip
    return sorted(rows, key=lambda r: (-r.spend_usd, r.job_id))


def _job_row(
    job: JobRecord,
    entries: Sequence[LedgerEntry],
    attempts: Sequence[AttemptRecord],
    period: Period,
    drilled: Drilled,
) -> JobRow:
    spend = sum(e.usd for e in entries)
    on_demand = sum(e.on_demand_usd for e in entries)
    preempted = [a for a in attempts if _preempted_in(a, period)]
    drills = sum((job.id, a.seq) in drilled for a in preempted)
    return JobRow(
        job_id=job.id,
        name=job.name,
        status=job.status.value,
        spend_usd=spend,
        on_demand_usd=on_demand,
        savings_usd=on_demand - spend if claims_saving(job.status) else None,
        gpu_hours=sum(e.gpu_hours for e in entries),
        preemptions=len(preempted) - drills,
        recovery_hours=sum(e.wall_hours for e in entries if _recovering(e)),
        so_far=not job.status.terminal,
        drills=drills,
        drill_usd=sum(e.usd for e in resume_entries(entries, drilled)),
    )


def _recovering(entry: LedgerEntry) -> bool:
    # The first attempt's boot is the start of the job, not a recovery from anything.
    return entry.kind == "changeover" and entry.attempt > 1


def _totals(entries: Sequence[LedgerEntry], rows: Sequence[JobRow]) -> Totals:
    savings, saving_on_demand = saving_of(entries)
    running = {r.job_id for r in rows if r.so_far}
    return Totals(
        spend_usd=sum(e.usd for e in entries),
        on_demand_usd=sum(e.on_demand_usd for e in entries),
        savings_usd=savings,
        savings_pct=100.0 * savings / saving_on_demand if saving_on_demand > 0 else 0.0,
        egress_usd=sum(e.usd for e in entries if e.kind == "egress"),
        gpu_hours=sum(e.gpu_hours for e in entries),
        preemptions=sum(r.preemptions for r in rows),
        recovery_hours=sum(r.recovery_hours for r in rows),
        jobs=len(rows),
        no_saving_usd=spend_without_saving(entries),
        running_usd=sum(e.usd for e in entries if e.job_id in running),
        drills=sum(r.drills for r in rows),
        drill_usd=sum(r.drill_usd for r in rows),
    )


def _daily(entries: Iterable[LedgerEntry]) -> list[DailySpend]:
    spend: dict[date, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    on_demand: dict[date, float] = defaultdict(float)
    for e in entries:
        day = e.start.date()
        spend[day][e.provider] += e.usd
        on_demand[day] += e.on_demand_usd
    return [
        DailySpend(day=d, by_provider=dict(sorted(spend[d].items())), on_demand_usd=on_demand[d])
        for d in sorted(spend)
    ]


# -- findings --------------------------------------------------------------------


class PoolReliability(_Frozen):
    """Preemptions and running hours of one pool's attempts in the period."""

    pool: str
    preemptions: int
    running_hours: float

    @property
    def rate(self) -> float:
        """Preemptions per running hour (a pool that never ran counts one minute)."""
        return self.preemptions / max(self.running_hours, 1 / 60)


def _preempted_in(attempt: AttemptRecord, period: Period) -> bool:
    return (
        attempt.end_reason is AttemptEnd.PREEMPTED
        and attempt.ended_at is not None
        and period.since <= attempt.ended_at < period.until
    )


def _pool_reliability(
    attempts: Iterable[Sequence[AttemptRecord]], period: Period, drilled: Drilled
) -> list[PoolReliability]:
    """Per pool: the market's preemptions in the period (not the drills') and the running
    hours inside it."""
    seen: dict[str, tuple[int, float]] = {}
    for a in (a for job in attempts for a in job):
        count, hours = seen.get(str(a.pool), (0, 0.0))
        market = _preempted_in(a, period) and (a.job_id, a.seq) not in drilled
        seen[str(a.pool)] = (count + market, hours + _running_hours(a, period))
    return [PoolReliability(pool=p, preemptions=c, running_hours=h) for p, (c, h) in seen.items()]


def _running_hours(attempt: AttemptRecord, period: Period) -> float:
    if attempt.running_at is None:
        return 0.0
    start = max(attempt.running_at, period.since)
    end = min(attempt.ended_at or period.until, period.until)
    return max(0.0, (end - start).total_seconds() / 3600)


def findings(
    totals: Totals, rows: Sequence[JobRow], pools: Sequence[PoolReliability], period: Period
) -> list[str]:
    """The period in a few plain sentences, most important first."""
    said = [_savings_sentence(totals, period), _preemption_sentence(rows), _drill_sentence(rows)]
    unreliable = [p for p in pools if p.preemptions > 0]
    if unreliable:
        worst = max(unreliable, key=lambda p: (p.rate, p.preemptions, p.pool))
        said.append(
            f"{worst.pool} was the least reliable pool: {_count(worst.preemptions, 'preemption')}"
            f" in {worst.running_hours:,.1f} running hours."
        )
    if rows and rows[0].spend_usd > 0:
        top = rows[0]
        said.append(
            f"The most expensive job was {top.name} ({top.job_id}) at {usd(top.spend_usd)} USD."
        )
    return [s for s in said if s]


def _savings_sentence(totals: Totals, period: Period) -> str:
    when = period_words(period)
    if totals.on_demand_usd <= 0 and totals.spend_usd <= 0:
        return f"Nothing was spent {when}."
    # The saving is the jobs' that did not fail and were not cancelled: theirs is spend only.
    spend = totals.spend_usd - totals.no_saving_usd
    on_demand = spend + totals.savings_usd
    said = f"{usd(totals.no_saving_usd)} USD went to jobs that failed or were cancelled"
    if on_demand <= 0:
        return f"{said} {when}, with no saving."
    if totals.savings_usd >= 0:
        line = (f"Spot saved {totals.savings_pct:.0f} % ({usd(totals.savings_usd)} USD) {when}: "
                f"{usd(spend)} USD spent against {usd(on_demand)} USD on-demand")  # fmt: skip
    else:
        line = (f"Spot cost {usd(-totals.savings_usd)} USD more than on-demand {when} "
                f"({usd(spend)} USD against {usd(on_demand)} USD)")  # fmt: skip
    if totals.no_saving_usd > 0:
        line += f"; {said}, with no saving"
    if totals.running_usd > 0:
        line += f"; {usd(totals.running_usd)} USD is running jobs' spend so far"
    return line + "."


def _preemption_sentence(rows: Sequence[JobRow]) -> str:
    hit = [r for r in rows if r.preemptions > 0]
    if not hit:
        return "No job was preempted." if rows else ""
    times = sum(r.preemptions for r in hit)
    jobs = _count(len(hit), "job")
    verb = "was" if len(hit) == 1 else "were"
    recovery = sum(r.recovery_hours for r in rows)
    return (
        f"{jobs} {verb} preempted {_count(times, 'time')}; "
        f"recovery took {recovery:,.1f} paid hours without progress."
    )


def _drill_sentence(rows: Sequence[JobRow]) -> str:
    drilled = [r for r in rows if r.drills > 0]
    if not drilled:
        return ""
    times = sum(r.drills for r in drilled)
    names = ", ".join(r.name for r in drilled[:3]) + (", ..." if len(drilled) > 3 else "")
    return (
        f"{_count(times, 'drill')} preempted {_count(len(drilled), 'job')} on purpose ({names}); "
        f"resuming from them cost {usd(sum(r.drill_usd for r in drilled))} USD."
    )


def period_words(period: Period) -> str:
    """``from 2026-03-02 to 2026-03-09`` (the end day shown inclusive when on a midnight)."""
    last = period.until
    if (last.hour, last.minute, last.second, last.microsecond) == (0, 0, 0, 0):
        last -= timedelta(days=1)
    first = period.since.date().isoformat()
    if last.date() <= period.since.date():
        return f"on {first}"
    return f"from {first} to {last.date().isoformat()}"


def usd(amount: float) -> str:
    """A USD amount for people: cents below 1,000, whole dollars above."""
    return f"{amount:,.2f}" if abs(amount) < 1000 else f"{amount:,.0f}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
