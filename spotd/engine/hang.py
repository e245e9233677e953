"""The hang watch: a running gang whose steps stopped moving while its nodes are up.

A rank that dies, stops or gets stuck while the others wait for it in a
collective leaves a gang that neither progresses nor exits: its nodes stay up,
billed, and no exit code ever tells the daemon. With ``gang.hang_timeout`` set,
the job's own reports tell it instead. Every heartbeat carries the job's
progress (the single progress file and each rank's own, :mod:`spotd.core.ranks`),
and the daemon keeps, per node and on its own clock, when that progress last
moved and when a heartbeat last said it (:class:`~spotd.engine.reports.StoreReports`).

The rules, pure over those facts:

* Only a running job is watched (not one checkpointing on a notice), and only
  once a node reported progress: a job that never reports a step cannot be
  told from a slow one, and is never judged hung.
* The gang is hung when a heartbeat came ``hang_timeout`` or more after the
  last time any node's progress moved: a heartbeat must say so, so that a
  daemon that was down, or agents that could not reach it, never make a hang
  out of silence.
* The suspects are the ranks whose process is dead or stopped; failing those,
  the ranks whose step is behind the others'. The event names them (global
  ranks, nodes; :class:`~spotd.core.values.EventFacts`) and the first one's
  node, which a placement may avoid.
* The attempt ends ``hung`` and the job resumes from its last checkpoint on new
  nodes, as after a preemption, unless ``retry.hangs`` attempts in a row hung
  before: then it fails (cause ``hung``).

A quiet running job is not stepped on heartbeats alone (:mod:`spotd.engine.watch`):
:func:`next_check` says when it must be looked at again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from spotd.core.ranks import RankReading, ranks_of
from spotd.core.values import (
    EMPTY_FACTS,
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventFacts,
    FailureCause,
    InstanceReport,
    JobRecord,
    JobStatus,
    attempt_reports,
)
from spotd.engine.attempts import since_retry
from spotd.engine.verdicts import End

RECHECKS_PER_TIMEOUT = 10
"""A gang past its timeout that no heartbeat confirmed yet is looked at again after this
share of the timeout."""
_NAMED = 8
"""The most suspects an event's detail names one by one."""


@dataclass(frozen=True, slots=True)
class RankSeen:
    """One rank of the gang as its node's last heartbeat showed it."""

    node: str
    """The instance id of its node."""
    node_rank: int
    """Its node's place in the attempt's instance ids."""
    reading: RankReading


@dataclass(frozen=True, slots=True)
class GangProgress:
    """What the attempt's agents said of its progress, on the daemon's clock."""

    moved_at: datetime
    """The last time any node's progress moved."""
    heard_at: datetime
    """The last heartbeat that said how far a node got."""
    ranks: tuple[RankSeen, ...] = ()
    """Every rank the nodes reported, by node then rank (none from a job that writes
    only the single progress file)."""


def gang_progress(attempt: AttemptRecord, reports: Sequence[InstanceReport]) -> GangProgress | None:
    """The attempt's progress from its nodes' reports; None when no node reported any."""
    mine = attempt_reports(attempt, reports)
    moved = [r.progress_at for r in mine.values() if r.progress_at is not None]
    heard = [r.heard_at for r in mine.values() if r.heard_at is not None]
    if not moved or not heard:
        return None
    return GangProgress(max(moved), max(heard), _ranks(attempt, mine))


def _ranks(attempt: AttemptRecord, mine: Mapping[str, InstanceReport]) -> tuple[RankSeen, ...]:
    return tuple(
        RankSeen(iid, place, reading)
        for place, iid in enumerate(attempt.instance_ids)
        if iid in mine
        for reading in ranks_of(mine[iid].ranks)
    )


def hung(
    job: JobRecord,
    attempt: AttemptRecord,
    attempts: Sequence[AttemptRecord],
    progress: GangProgress | None,
) -> End | None:
    """End the running ``attempt`` when its gang is hung (see the module doc); its
    nodes are up (the caller checked). ``attempts`` are the job's, the open one too."""
    timeout = job.spec.gang.hang_timeout
    if timeout is None or progress is None or job.status is not JobStatus.RUNNING:
        return None
    still = progress.heard_at - progress.moved_at
    if still < timeout:
        return None
    bad = suspects(progress.ranks)
    detail = (f"no rank's step moved for {_seconds(still)} (gang.hang_timeout "
              f"{_seconds(timeout)}) while its nodes were up; {_said(bad)}")  # fmt: skip
    facts = hang_facts(attempt, bad)
    before = hung_in_a_row(attempts, attempt)
    allowed = job.spec.retry.hangs
    if before >= allowed:
        detail += f" ({before + 1} hung attempts in a row, retry.hangs is {allowed})"
        return End.failed(EventCause.HANG, FailureCause.HUNG, detail, attempt=attempt,
                          end=AttemptEnd.HUNG, facts=facts)  # fmt: skip
    detail += "; resumed from the last checkpoint on new nodes"
    return End(JobStatus.RECOVERING, EventCause.HANG, detail, attempt=attempt,
               end=AttemptEnd.HUNG, facts=facts)  # fmt: skip


def suspects(ranks: Sequence[RankSeen]) -> list[RankSeen]:
    """The ranks a hang is blamed on, by global rank: those whose process is dead or
    stopped; failing those, those whose step is behind the furthest one's; else none."""
    ordered = sorted(ranks, key=lambda r: r.reading.rank)
    gone = [r for r in ordered if r.reading.state.suspect]
    if gone:
        return gone
    steps = [r.reading.step for r in ordered if r.reading.step is not None]
    if not steps:
        return []
    furthest = max(steps)
    return [r for r in ordered if r.reading.step is not None and r.reading.step < furthest]


def hang_facts(attempt: AttemptRecord, bad: Sequence[RankSeen]) -> EventFacts:
    """The hang's facts: the first suspect's node (and its rank in a gang of several
    nodes), every suspect's global rank, and every suspect node."""
    if not bad:
        return EMPTY_FACTS
    first = bad[0]
    nodes = tuple(dict.fromkeys(r.node for r in bad))
    return EventFacts(node=first.node, rank=first.node_rank if attempt.nodes > 1 else None,
                      process_ranks=tuple(r.reading.rank for r in bad),
                      nodes=nodes)  # fmt: skip


def hung_in_a_row(attempts: Sequence[AttemptRecord], current: AttemptRecord) -> int:
    """How many of the job's last ended attempts (``current`` left out, and none from
    before a user's retry) ended ``hung``."""
    count = 0
    for a in reversed(since_retry(attempts)):
        if a.id == current.id or a.end_reason is None:
            continue
        if a.end_reason is not AttemptEnd.HUNG:
            break
        count += 1
    return count


def next_check(job: JobRecord, progress: GangProgress | None, now: datetime) -> datetime | None:
    """When a running job must be looked at again for a hang, should nothing else wake
    it first; None when it is not watched. A provisioning job is stepped on every pass
    anyway: its check is set for the quiet passes that follow its start."""
    timeout = job.spec.gang.hang_timeout
    if timeout is None or job.status not in (JobStatus.PROVISIONING, JobStatus.RUNNING):
        return None
    if progress is None:
        return now + timeout  # nothing reported yet: look again for its first report
    due = progress.moved_at + timeout
    if due > now:
        return due
    # Past due, but no heartbeat said so yet (or it just moved again): soon.
    return now + timeout / RECHECKS_PER_TIMEOUT


def _said(bad: Sequence[RankSeen]) -> str:
    """The suspects in words: ``rank 1 (pid 4242, stopped, step 120) on i-0abc``."""
    if not bad:
        return "no rank stands out (each process lives, at the same step)"
    named = [_one(r) for r in bad[:_NAMED]]
    more = f" and {len(bad) - _NAMED} more" if len(bad) > _NAMED else ""
    return "suspect " + ", ".join(named) + more


def _one(seen: RankSeen) -> str:
    r = seen.reading
    about = [f"pid {r.pid}" if r.pid is not None else "", str(r.state),
             f"step {r.step}" if r.step is not None else ""]  # fmt: skip
    return f"rank {r.rank} ({', '.join(a for a in about if a)}) on {seen.node}"


def _seconds(span: timedelta) -> str:
    return f"{round(span.total_seconds())} s"
