"""What the loop remembers between passes, and what one pass read in bulk.

A pass claims the jobs it holds, reads (in a few bulk queries and one
describe per provider) what changed since the last pass, and steps only the
jobs something changed for (:mod:`spotd.engine.watch`). The steps read their
facts from here, not from the store, unless the pass has not read them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from spotd.core.contracts import EngineStore, Provider
from spotd.core.errors import ProviderError, ProviderUnavailable
from spotd.core.intents import IntentRecord
from spotd.core.states import ACTIVE
from spotd.core.values import AttemptRecord, Instance, InstanceReport, JobRecord, JobStatus
from spotd.engine.settings import MISSING_BEFORE_LOST
from spotd.engine.watch import DueTimes, Kept, QuietJobs, ReportMirror, changed_instances

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pass:
    """What one reconcile pass read in bulk before stepping the jobs, and what it did."""

    attempts: dict[str, list[AttemptRecord]]
    described: dict[str, dict[str, Instance] | None]
    """Provider -> its instances by id; None when the bulk describe failed."""
    wrote: set[str] = field(default_factory=set)
    """Jobs the pass wrote to (a transition, a launch or start recorded): read back at its end."""
    calm: dict[str, int] = field(default_factory=dict)
    """Jobs a step moved to running with nothing there for the next pass, by the version."""
    intents: dict[str, list[IntentRecord]] = field(default_factory=dict)
    """The held jobs' open intents (what users asked of them), by job."""


class PassMemory:
    """The held jobs' attempts, reports and nodes as last read, and which jobs are quiet."""

    def __init__(self, store: EngineStore, providers: Mapping[str, Provider]) -> None:
        self._store = store
        self._providers = providers
        self._kept = Kept()
        self._reports = ReportMirror()
        self.quiet = QuietJobs()
        self.replans = DueTimes[datetime]()
        """When each running job is next asked whether it should move."""
        self.hang_checks = DueTimes[datetime]()
        """When each watched running job is next looked at for a hang (:mod:`spotd.engine.hang`)."""
        self._seen: dict[str, dict[str, Instance]] = {}
        """The last describe of each provider, by instance id: a pass wakes the jobs of
        the instances that changed."""
        self._missing: dict[str, int] = {}
        self._last_held: dict[str, int] = {}
        self._pass: _Pass | None = None

    @property
    def in_pass(self) -> bool:
        """Whether a pass is stepping its jobs now."""
        return self._pass is not None

    def begin(
        self, held: Mapping[str, int], replans_due_before: datetime, now: datetime
    ) -> tuple[list[JobRecord], bool]:
        """Read what changed for the ``held`` jobs (job id -> version) and start a pass;
        return the active jobs to step, and whether the same jobs are held as before
        (else what is kept of others should go)."""
        # The same jobs at the same versions (one comparison in C): nothing to read.
        same = held == self._last_held
        same_jobs = same or held.keys() == self._last_held.keys()
        self._last_held = dict(held)
        if not same_jobs:
            self._forget_unheld(held)
        # Bulk reads only: the attempts of jobs whose version moved, the reports written
        # since the last pass, one describe per provider. A pass over 50,000 jobs must
        # make neither 50,000 calls nor read 50,000 rows it read before.
        moved = [] if same else self._read_attempts(held)
        described = self._describe_all()
        self.quiet.wake(self._reports.refresh(self._store, held, same_jobs=same_jobs))
        due = self.replans.due(replans_due_before) | self.quiet.budget.due(now)
        due |= self.hang_checks.due(now)
        stepped = self.quiet.to_step(held, moved, due, same_jobs=same_jobs)
        jobs = self._records(held, stepped)
        # An intent bumps its job's version, so the job is stepped; the open intents are
        # few and indexed, so one read of all of them costs a pass next to nothing.
        asked = {k: v for k, v in self._store.open_intents().items() if k in held}
        self._pass = _Pass({j.id: self._kept.attempts[j.id] for j in jobs}, described,
                           intents=asked)  # fmt: skip
        return jobs, same_jobs

    def end(self, jobs: Sequence[JobRecord]) -> None:
        """The pass is over: keep the records of the jobs it stepped, and read back what
        it wrote."""
        if self._pass is None:
            return
        wrote, self._pass = self._pass.wrote, None
        self._kept.records = {j.id: j for j in jobs if j.id not in self.quiet.versions}
        self._read_back(wrote)

    # -- a step's reads --------------------------------------------------------

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """The job's attempts as the pass read them, or from the store."""
        if self._pass is not None and job_id in self._pass.attempts:
            return self._pass.attempts[job_id]
        return self._store.attempts(job_id)

    def intents(self, job_id: str) -> list[IntentRecord]:
        """The job's open intents as the pass read them, or from the store."""
        if self._pass is not None:
            return self._pass.intents.get(job_id, [])
        return self._store.open_intents([job_id]).get(job_id, [])

    def reports(self, job_id: str) -> list[InstanceReport]:
        """The job's agents' reports as last read, or from the store."""
        kept = self._reports.of(job_id) if self._pass is not None else None
        return self._store.reports(job_id) if kept is None else kept

    def described(self, provider: Provider, ids: Sequence[str]) -> dict[str, Instance]:
        """The provider's view of ``ids``: the pass's bulk describe where it covers them."""
        if self._pass is not None and provider.name in self._pass.described:
            seen = self._pass.described[provider.name]
            if seen is None:
                raise ProviderUnavailable(
                    f"{provider.name} could not describe its instances this pass",
                    provider=provider.name,
                )
            if all(i in seen for i in ids):
                return seen
        return {i.id: i for i in provider.describe(ids)}

    def seen_or_missing(self, iid: str, seen: Mapping[str, Instance]) -> Instance | None:
        """The instance, or None once it was missing from several describes in a row.

        Clouds list a new instance a little after launching it, and a single
        failed lookup must not restart a healthy job: only a repeated absence
        counts as a lost node.
        """
        if iid in seen:
            self._missing.pop(iid, None)
            return seen[iid]
        self._missing[iid] = self._missing.get(iid, 0) + 1
        if self._missing[iid] >= MISSING_BEFORE_LOST:
            return None
        raise ProviderError(f"instance {iid} not listed yet ({self._missing[iid]}x)")

    # -- what a step did ---------------------------------------------------------

    def wrote(self, job_id: str) -> None:
        """The job just changed: drop what the pass read of it, read it back at the end."""
        if self._pass is not None:
            self._pass.attempts.pop(job_id, None)
            self._pass.wrote.add(job_id)

    def calm(self, job_id: str, version: int) -> None:
        """The job just moved to running with nothing there for its next pass to act on."""
        if self._pass is not None:
            self._pass.calm[job_id] = version

    def settle(
        self,
        job: JobRecord,
        now: datetime,
        budget_due: Callable[[JobRecord, datetime], datetime | None],
    ) -> None:
        """After a step that raised nothing: the job is quiet if it runs and the step
        wrote nothing (or it just moved to running with nothing there to act on).
        ``budget_due``: when a quiet running job's spend may reach its budget."""
        if self._pass is None:
            return  # stepped outside a pass: the next pass steps it
        if self.replans.get(job.id) is None:
            # Its re-plan came due (or it was never planned here): the next pass asks.
            self.quiet.wake([job.id])
        elif job.id in self._pass.calm:
            # Its attempts are read back at the pass's end: its budget is weighed next pass.
            due = now if job.spec.budget is not None else None
            self.quiet.settle(job.id, self._pass.calm[job.id], due)
        elif job.status is JobStatus.RUNNING and job.id not in self._pass.wrote:
            # At the version its attempts were read at: a record read later may be newer.
            self.quiet.settle(job.id, self._kept.versions[job.id], budget_due(job, now))
        else:
            self.quiet.wake([job.id])

    # -- bulk reads ----------------------------------------------------------------

    def _read_attempts(self, held: Mapping[str, int]) -> list[str]:
        """Keep the held jobs' attempts: read again, in one query, only those of jobs
        whose version moved (returned).

        Every change of a job's status or attempts bumps its version, whichever daemon
        or command makes it, so an unchanged version means unchanged attempts. The
        pass's own writes are read back at its end (:meth:`_read_back`).
        """
        stale = self._kept.stale(held)
        for job_id, records in (self._store.attempts_for(stale) if stale else {}).items():
            self._kept.set_attempts(job_id, held[job_id], records)
        return stale

    def _describe_all(self) -> dict[str, dict[str, Instance] | None]:
        """One describe per provider of the nodes of every held job's open attempt (a
        provisioning, running or checkpointing job's); the jobs of nodes that changed
        since the last describe, or are missing, wake."""
        described: dict[str, dict[str, Instance] | None] = {}
        for name, owners in self._kept.nodes.items():
            if name not in self._providers or not owners:
                continue
            described[name] = seen = _describe_one(self._providers[name], list(owners))
            before = self._seen.get(name, {})
            changed = owners if seen is None else changed_instances(before, seen, owners)
            self.quiet.wake({owners[iid] for iid in changed})
            if seen is not None:
                self._seen[name] = seen
        return described

    def _records(self, held: Mapping[str, int], wanted: set[str]) -> list[JobRecord]:
        """The records of the ``wanted`` held jobs: kept from the last pass at an
        unchanged version, the rest read in one query."""
        kept = self._kept.records
        fresh = {j: kept[j] for j in wanted if j in kept and kept[j].version == held[j]}
        missing = [j for j in wanted if j not in fresh]
        for job_id in missing:
            # Let go of the old record (its spec above all) before its successor is read.
            kept.pop(job_id, None)
        fresh.update(self._store.jobs_by_id(missing) if missing else {})
        return [job for job in fresh.values() if job.status in ACTIVE]

    def _forget_unheld(self, held: Mapping[str, int]) -> None:
        """Drop what is kept of jobs this daemon no longer holds (ended, or taken over)."""
        self._kept.keep_only(held)
        self._reports.keep_only(held)
        self.replans.keep_only(held)
        self.hang_checks.keep_only(held)

    def _read_back(self, wrote: set[str]) -> None:
        """Read the attempts of the jobs the pass wrote to, at their new versions: the
        next pass then reads nothing of a job whose only change was this pass's own.
        Versions first: attempts read after them are at least as new."""
        if not wrote:
            return
        versions = self._store.job_versions(wrote)
        for job_id, records in self._store.attempts_for(list(versions)).items():
            self._kept.set_attempts(job_id, versions[job_id], records)
            if self.quiet.versions.get(job_id, versions[job_id]) != versions[job_id]:
                self.quiet.wake([job_id])  # changed elsewhere since it moved to running


def _describe_one(provider: Provider, instance_ids: list[str]) -> dict[str, Instance] | None:
    try:
        return {i.id: i for i in provider.describe(instance_ids)}
    except ProviderError as exc:
        log.warning("describe of %d %s instances failed: %s",
                    len(instance_ids), provider.name, exc)  # fmt: skip
    except Exception:
        # An error the adapter failed to map is a bug in it; it must not stall the
        # jobs of every other provider. Its own jobs wait as on a failure.
        log.exception("describe of %d %s instances raised", len(instance_ids), provider.name)
    return None
