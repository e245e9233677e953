"""Which running jobs of a team must give way, and how a job that gives way ends.

Two things stop a running job that the market would leave alone, both by the
same notice a spot preemption gives (:mod:`spotd.core.orders`), so it
checkpoints and waits with the reason shown:

- **Priority.** A pending job held back by its team's ``max_running_jobs`` takes
  the place of the team's running job of the lowest priority below its own (the
  newest of those first: it has the least work behind it).
- **Budget.** A team's monthly budget is kept before it is spent, not after:
  while what the team spent, plus what each running job costs until the next
  check and its notice are over, would reach the budget, the running jobs stop,
  lowest priority first, until the rest fit.

Pure: the loop gathers the team's jobs and figures, these functions choose.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from spotd.core.intents import STOP_KINDS, IntentRecord
from spotd.core.orders import STOP_INTENTS, STOP_WHY, StopReason
from spotd.core.values import AttemptEnd, AttemptRecord, JobRecord, JobStatus
from spotd.engine.verdicts import End, Verdict, Yield
from spotd.market.catalog import notice_seconds

__all__ = [
    "STOP_GRACE_SECONDS",
    "RunningCost",
    "budget_stops",
    "give_way",
    "make_way_for",
    "open_stop",
    "stop_notice_hours",
]


STOP_GRACE_SECONDS = 90.0
"""Real seconds a job told to stop has beyond its provider's notice before its nodes are
stopped: its agents ask for their orders with their heartbeats (every 30 s by default),
and the job needs the notice from then on."""


@dataclass(frozen=True, slots=True)
class RunningCost:
    """A running job of a team, with what keeping it running costs."""

    job: JobRecord
    period_usd: float
    """What it spends until the next check (its price for all its nodes)."""
    notice_usd: float
    """What it spends during the notice it gets when stopped."""


def _stop_order(job: JobRecord) -> tuple[int, float]:
    """Lowest priority first, then the newest (the least work behind it)."""
    return job.spec.priority, -job.submitted_at.timestamp()


def make_way_for(
    job: JobRecord, running: Sequence[JobRecord], leaving: Collection[str]
) -> JobRecord | None:
    """The running job of ``job``'s team that stops so ``job`` can start, or None when
    none has a lower priority (or each such is already ``leaving``)."""
    lower = [r for r in running if r.spec.priority < job.spec.priority and r.id not in leaving]
    return min(lower, key=_stop_order, default=None)


def budget_stops(
    budget_usd: float, spent_usd: float, running: Sequence[RunningCost], leaving: Collection[str]
) -> list[JobRecord]:
    """The running jobs to stop so that the team's spend stays under ``budget_usd``."""
    staying = sorted((r for r in running if r.job.id not in leaving),
                     key=lambda r: _stop_order(r.job))  # fmt: skip
    projected = spent_usd + sum(r.notice_usd for r in running)
    projected += sum(r.period_usd for r in staying)
    stops: list[JobRecord] = []
    for candidate in staying:
        if projected < budget_usd:
            break
        stops.append(candidate.job)
        projected -= candidate.period_usd
    return stops


def open_stop(
    intents: Sequence[IntentRecord], attempt: AttemptRecord | None
) -> IntentRecord | None:
    """The stop asked of the job's open ``attempt`` (the oldest), if any: one asked before
    the attempt began was about an earlier one."""
    if attempt is None:
        return None
    stops = [i for i in intents if i.kind in STOP_KINDS and i.requested_at >= attempt.started_at]
    return stops[0] if stops else None


def give_way(
    job: JobRecord,
    attempt: AttemptRecord,
    stop: IntentRecord,
    watched: Verdict,
    *,
    now: datetime,
    notice_hours: float,
) -> Verdict:
    """The step of a job asked to stop (``stop``) whose attempt is open: notice a running
    job, end a launching one, and end a checkpointing one as ``yielded`` when its nodes
    leave (``watched``: what watching the attempt gave) or its notice is over."""
    reason = STOP_INTENTS[stop.kind]
    if job.status is JobStatus.RUNNING:
        return Yield(attempt, reason)
    if job.status is JobStatus.PROVISIONING:
        return _yielded(attempt, reason, "stopped while it started")
    if isinstance(watched, End) and watched.status is JobStatus.RECOVERING:
        return _yielded(attempt, reason, "checkpointed and left")
    if isinstance(watched, End):
        return watched  # it ended for its own reasons (succeeded, failed) meanwhile
    elapsed = (now - stop.requested_at).total_seconds() / 3600
    if elapsed > notice_hours:
        return _yielded(attempt, reason, "its notice ran out; its nodes are stopped")
    return watched


def stop_notice_hours(provider: str, real_per_second: float) -> float:
    """How long (engine hours) a job told to stop has before its nodes are stopped: its
    provider's notice, and the time its agents take to ask for their orders (real
    seconds, ``real_per_second`` of them to a second of the engine's clock)."""
    return (notice_seconds(provider) + STOP_GRACE_SECONDS / real_per_second) / 3600


def _yielded(attempt: AttemptRecord, reason: StopReason, how: str) -> End:
    return End.attempt_ended(attempt, JobStatus.RECOVERING, AttemptEnd.YIELDED,
                             f"{attempt.pool}: {how} ({STOP_WHY[reason]})")  # fmt: skip
