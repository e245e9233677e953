"""What the engine keeps of its jobs between passes, so a pass steps only the jobs
something changed for.

A running job whose last step found nothing to do is *quiet*: the next pass
steps it again only when something it is judged on changed. That is its
version (any change of its status or attempts, by any daemon or command), its
agents' reports (beyond progress and GPU samples), the instances its provider
describes (a changed state, or one missing), a failed describe of its
provider, its budget (checked again when its spend could reach it), or its
re-planning time (``scheduling.replan_seconds``). Every other job is stepped on
every pass, as are quiet jobs whenever one of those changed.

So a steady pass over 50,000 running jobs reads their versions (one query),
the reports written since the last pass, and one describe per provider, and
steps none of them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Generic, TypeVar

from spotd.core.contracts import EngineStore
from spotd.core.values import AttemptRecord, Instance, InstanceReport, JobRecord
from spotd.engine.attempts import open_attempt

T = TypeVar("T", float, datetime)



PROGRESS_FIELDS = frozenset(
    {"heartbeat_at", "step", "total_steps", "checkpoint", "gpus", "gpu_util_sum",
     "gpu_samples", "gpu_low_samples", "ranks", "progress_key", "progress_at", "heard_at"}
)  # fmt: skip
"""Report fields no step acts on at once: a heartbeat brings them every 30 s. The policy
reads them (progress) when it re-plans a job, and the hang watch when its check is due
(:mod:`spotd.engine.hang`), from the reports kept here."""

_VERDICT_FIELDS = tuple(f.name for f in fields(InstanceReport) if f.name not in PROGRESS_FIELDS)


def verdict_changed(old: InstanceReport | None, new: InstanceReport) -> bool:
    """Whether ``new`` says something a step acts on that ``old`` (None: no report yet,
    which a step weighs as a report of nothing) did not."""
    if old is None:
        old = InstanceReport(new.instance_id, new.provider, new.job_id, new.attempt)
    return any(getattr(old, f) != getattr(new, f) for f in _VERDICT_FIELDS)


def _by_attempt(report: InstanceReport) -> int:
    return report.attempt


@dataclass(slots=True)
class ReportMirror:
    """The agents' reports of the jobs this daemon holds, kept up to date from the
    store's report feed: a pass reads only the reports written since the last one."""

    cursor: int | None = None
    by_job: dict[str, dict[tuple[str, str], InstanceReport]] = field(default_factory=dict)

    def refresh(self, store: EngineStore, held: Mapping[str, int], *, same_jobs: bool) -> set[str]:
        """Bring in what changed and the reports of jobs new to this daemon (none with
        ``same_jobs``: the jobs held are those of the last refresh); return the jobs
        whose reports changed in what a step acts on (new jobs included)."""
        # The feed first, then the new jobs' reports: one written in between is in both.
        changes: list[InstanceReport] = []
        if self.cursor is None:
            cursor = store.report_cursor()
        else:
            changes, cursor = store.report_changes(self.cursor)
        changed: set[str] = set()
        for report in changes:
            known = self.by_job.get(report.job_id)
            if known is None:
                continue  # not held, or new to this daemon: read whole below
            key = (report.provider, report.instance_id)
            if verdict_changed(known.get(key), report):
                changed.add(report.job_id)
            known[key] = report
        new = [] if same_jobs else list(held.keys() - self.by_job.keys())
        for job_id, reports in store.reports_for(new).items() if new else ():
            self.by_job[job_id] = {(r.provider, r.instance_id): r for r in reports}
            changed.add(job_id)
        self.cursor = cursor
        return changed

    def keep_only(self, held: Mapping[str, int]) -> None:
        """Forget the reports of jobs no longer held."""
        for job_id in self.by_job.keys() - held.keys():
            del self.by_job[job_id]

    def of(self, job_id: str) -> list[InstanceReport] | None:
        """The job's reports, by attempt as the store lists them; None if not kept."""
        known = self.by_job.get(job_id)
        return None if known is None else sorted(known.values(), key=_by_attempt)


def changed_instances(
    before: Mapping[str, Instance], now: Mapping[str, Instance], wanted: Mapping[str, str]
) -> list[str]:
    """The ids in ``wanted`` whose instance differs from the last describe, or is missing
    (a missing node is counted on every pass until it counts as lost)."""
    last = before.get
    # The same object is the same state: most providers' objects differ, but are equal.
    differ = [iid for iid, seen in now.items() if last(iid) is not seen]
    changed = [iid for iid in differ if iid in wanted and now[iid] != last(iid)]
    return [*changed, *(wanted.keys() - now.keys())]


class DueTimes(Generic[T]):
    """When each job is due for something, with the jobs due by a time found in order
    (a heap): a pass looks at the jobs that are due, not at every job."""

    def __init__(self) -> None:
        self._at: dict[str, T] = {}
        self._heap: list[tuple[T, int, str]] = []
        self._pushed = 0

    def schedule(self, job_id: str, at: T) -> None:
        """The job is due at ``at`` (instead of any time set before)."""
        self._at[job_id] = at
        self._pushed += 1
        heapq.heappush(self._heap, (at, self._pushed, job_id))

    def by(self, job_id: str, at: T) -> None:
        """The job is due at ``at``, or sooner if it already is (one heap entry per due
        time, however often a job that is stepped on every pass asks)."""
        known = self._at.get(job_id)
        if known is None or at < known:
            self.schedule(job_id, at)

    def cancel(self, job_id: str) -> None:
        """The job is due for nothing."""
        self._at.pop(job_id, None)

    def get(self, job_id: str) -> T | None:
        """When the job is due, None if it is not."""
        return self._at.get(job_id)

    def due(self, now: T) -> set[str]:
        """The jobs due at or before ``now``; each is due no more."""
        found: set[str] = set()
        heap = self._heap
        while heap and not heap[0][0] > now:
            at, _, job_id = heapq.heappop(heap)
            if self._at.get(job_id) == at:  # else rescheduled or cancelled since
                del self._at[job_id]
                found.add(job_id)
        return found

    def keep_only(self, held: Mapping[str, int]) -> None:
        """Forget the jobs not in ``held`` (their heap entries lapse when they come due)."""
        for job_id in self._at.keys() - held.keys():
            del self._at[job_id]


@dataclass(slots=True)
class QuietJobs:
    """Running jobs whose last step found nothing to do, by the version they were
    found quiet at (the version their kept attempts were read at), and when a
    budgeted one must be checked again."""

    versions: dict[str, int] = field(default_factory=dict)
    budget: DueTimes[datetime] = field(default_factory=DueTimes)

    def settle(self, job_id: str, version: int, budget_due: datetime | None) -> None:
        """The job is quiet at ``version``; ``budget_due``: when its spend may reach its budget."""
        self.versions[job_id] = version
        if budget_due is None:
            self.budget.cancel(job_id)
        else:
            self.budget.schedule(job_id, budget_due)

    def wake(self, job_ids: Iterable[str]) -> None:
        """These jobs are stepped on the next pass."""
        for job_id in job_ids:
            self.versions.pop(job_id, None)
            self.budget.cancel(job_id)

    def to_step(
        self, held: Mapping[str, int], moved: Iterable[str], due: set[str], *, same_jobs: bool
    ) -> set[str]:
        """The held jobs to step this pass: all but the quiet ones. ``moved``: the held
        jobs whose version is not the one their attempts were read at (a quiet job's
        is); ``due``: jobs whose budget or re-planning is due, woken too. With
        ``same_jobs`` False, the quiet jobs no longer held are forgotten."""
        # Set operations on the dicts' views: no Python loop over 50,000 jobs.
        if not same_jobs:
            self.wake(self.versions.keys() - held.keys())
        self.wake(self.versions.keys() & set(moved))
        self.wake(due)
        return held.keys() - self.versions.keys()


_BUDGET_HORIZON = timedelta(days=1)
"""The longest a budgeted running job goes unchecked (17 doublings from a second)."""


def budget_check_at(
    spent_at: Callable[[datetime], float], budget: float, now: datetime
) -> datetime | None:
    """The latest time up to which ``spent_at`` (monotone in time) stays under ``budget``,
    found by doubling from one second: a running job's budget needs no check before then.
    None when it is reached within a second (check on every pass)."""
    step = timedelta(seconds=1)
    if spent_at(now + step) >= budget:
        return None
    while step < _BUDGET_HORIZON and spent_at(now + 2 * step) < budget:
        step *= 2
    return now + step


@dataclass(slots=True)
class Kept:
    """Per held job: the attempts read at a version, the nodes of its open attempt, and
    the record of a job stepped last pass (a quiet one's is dropped: its spec is what a
    record weighs most)."""

    attempts: dict[str, list[AttemptRecord]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    """The job's version its kept attempts were read at."""
    records: dict[str, JobRecord] = field(default_factory=dict)
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    """Provider -> instance id -> job id, for the open attempts of the jobs kept: what
    each pass describes, kept up to date as attempts are read rather than rebuilt."""
    _open: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def set_attempts(self, job_id: str, version: int, attempts: list[AttemptRecord]) -> None:
        """Keep the job's attempts as read at ``version``."""
        self.attempts[job_id] = attempts
        self.versions[job_id] = version
        self._unindex(job_id)
        open_ = open_attempt(attempts)
        if open_ is not None and open_.instance_ids:
            provider = open_.pool.provider
            self._open[job_id] = (provider, open_.instance_ids)
            self.nodes.setdefault(provider, {}).update(dict.fromkeys(open_.instance_ids, job_id))

    def stale(self, held: Mapping[str, int]) -> list[str]:
        """The held jobs whose attempts are not kept at their version."""
        return [job_id for job_id, _ in held.items() - self.versions.items()]

    def keep_only(self, held: Mapping[str, int]) -> None:
        """Forget what is kept of jobs no longer held."""
        for job_id in self.attempts.keys() - held.keys():
            del self.attempts[job_id]
            del self.versions[job_id]
            self._unindex(job_id)
        for job_id in self.records.keys() - held.keys():
            del self.records[job_id]

    def _unindex(self, job_id: str) -> None:
        provider, ids = self._open.pop(job_id, ("", ()))
        owners = self.nodes.get(provider, {})
        for iid in ids:
            if owners.get(iid) == job_id:
                del owners[iid]


if TYPE_CHECKING:
    from spotd.store.sql import SqlStore

    # mypy proves here that the SQL store has what the engine reads.
    def _fits(store: SqlStore) -> EngineStore:
        return store
