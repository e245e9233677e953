"""How much of a job's compute is behind it, counted in the hours its spec states.

A deadline job states ``compute_hours`` on a reference setup: its first listed
GPU model and, on more than one node, an InfiniBand fabric
(:data:`spotd.core.facts.REFERENCE_FABRIC_EFFICIENCY`). The policies plan in those
hours, so the daemon must count the work behind a job in the same hours: an
hour on a slower fabric or GPU, or an hour spent writing checkpoints, is less
than an hour of the job's compute, and counting it as a whole one makes a job
look further along than it is, which spends its slack unseen. The simulator
counts progress exactly and hands the policies the same measure.

What each attempt does per running hour is fixed when it is placed
(:func:`work_per_hour`) and kept on its record, so the count does not change
when prices, statistics or the catalog do, nor across a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from spotd.core import facts
from spotd.core.cadence import checkpoint_interval, checkpoint_write_hours
from spotd.core.spec import JobSpec
from spotd.core.values import AttemptEnd, AttemptRecord, InstanceReport, Offering

STOPPED_EARLY = frozenset({
    AttemptEnd.PREEMPTED,
    AttemptEnd.MIGRATED,
    AttemptEnd.LOST,
    AttemptEnd.NO_CAPACITY,
    AttemptEnd.LAUNCH_FAILED,
    AttemptEnd.PREFLIGHT_FAILED,
    AttemptEnd.HUNG,
    AttemptEnd.YIELDED,
})
"""Ends after which the job resumes from a checkpoint, so the work since it is lost."""


def efficiency(spec: JobSpec, off: Offering) -> float:
    """Share of peak a run reaches on the offering's fabric; 1 for one node."""
    if spec.resources.nodes <= 1:
        return 1.0
    return facts.FABRIC_EFFICIENCY[off.interconnect.fabric]


def speed(spec: JobSpec, off: Offering) -> float:
    """GPU speed relative to the job's first-listed GPU model (its reference)."""
    return facts.gpu_speed(off.gpu) / facts.gpu_speed(spec.resources.gpus[0])


def relative_efficiency(spec: JobSpec, off: Offering) -> float:
    """The offering's fabric efficiency over the one ``compute_hours`` is measured at."""
    reference = facts.REFERENCE_FABRIC_EFFICIENCY if spec.resources.nodes > 1 else 1.0
    return efficiency(spec, off) / reference


def work_per_hour(spec: JobSpec, off: Offering, interval_hours: float) -> float:
    """Reference compute hours one running hour on ``off`` does, checkpointing every
    ``interval_hours`` (a write stops training, as the cost model assumes)."""
    writing = checkpoint_write_hours(spec) / interval_hours if interval_hours > 0 else 0.0
    return relative_efficiency(spec, off) * speed(spec, off) / (1 + writing)


def lost_hours(spec: JobSpec, attempt: AttemptRecord) -> float:
    """Running hours of an ended attempt that its last checkpoint did not keep.

    Half the checkpoint interval on average, in the attempt's running hours;
    nothing for a preemption whose notice has room for the checkpoint. A
    migration is not spared: the engine stops the nodes, and the job gets only
    the provider's shutdown grace, which no offering states. Attempts stored
    before spotd kept the interval are taken to have used the default one and
    to have saved nothing on a notice.
    """
    if attempt.end_reason not in STOPPED_EARLY:
        return 0.0
    noticed = attempt.end_reason in (AttemptEnd.PREEMPTED, AttemptEnd.YIELDED)
    if noticed and attempt.saves_on_notice:
        return 0.0
    interval = attempt.checkpoint_interval_hours
    if interval is None:
        interval = checkpoint_interval(spec, facts.DEFAULT_PREEMPTIONS_PER_HOUR)
    return interval / 2


def restore_hours(spec: JobSpec, attempt: AttemptRecord) -> float:
    """Running hours an attempt spent reading back the checkpoint it resumed from
    (at the rate a write is assumed to take): its nodes ran, the training did not."""
    return checkpoint_write_hours(spec) if attempt.resume_from else 0.0


def running_rate(attempts: Sequence[AttemptRecord]) -> float | None:
    """Reference compute hours an hour of the job's running attempt does; None while
    none runs (pending, provisioning, or between attempts)."""
    for a in reversed(attempts):
        if a.open and a.running_at is not None:
            return 1.0 if a.work_per_hour is None else a.work_per_hour
    return None


def done_hours(spec: JobSpec, attempts: Sequence[AttemptRecord], now: datetime) -> float:
    """Reference compute hours behind the job, as far as the daemon can tell.

    Each attempt's running hours, less the restore of its checkpoint
    (:func:`restore_hours`) and what its end lost (:func:`lost_hours`), at the
    work it does per hour. Where it must guess it errs on the side of
    less progress (a notice saves the work only where the write surely fits
    in it), so deadlines are kept.
    """
    done = 0.0
    for a in attempts:
        if a.running_at is None:
            continue
        ran = ((a.ended_at or now) - a.running_at).total_seconds() / 3600
        kept = max(0.0, ran - restore_hours(spec, a) - lost_hours(spec, a))
        done += kept * (1.0 if a.work_per_hour is None else a.work_per_hour)
    total = spec.deadline.compute_hours if spec.deadline else None
    return min(done, total) if total is not None else done


def reported_steps(reports: Sequence[InstanceReport]) -> tuple[int, int] | None:
    """The job's own count, (step, total steps), from its latest report that had both.

    ``spotd.train`` writes it from global rank 0 and the agent passes it on
    with its heartbeats, so it is the job's word rather than an estimate.
    """
    counted = [
        r for r in reports
        if r.step is not None and r.total_steps and r.heartbeat_at is not None
    ]  # fmt: skip
    if not counted:
        return None
    latest = max(counted, key=lambda r: (r.attempt, r.heartbeat_at or datetime.min))
    assert latest.step is not None and latest.total_steps is not None
    return latest.step, latest.total_steps


def job_done_hours(
    spec: JobSpec,
    attempts: Sequence[AttemptRecord],
    steps: tuple[int, int] | None,
    now: datetime,
) -> float:
    """Compute hours behind the job: the share of its own steps done (``steps`` from
    :func:`reported_steps`) where it has ``deadline.compute_hours`` and reports them,
    else the daemon's estimate (:func:`done_hours`)."""
    total = spec.deadline.compute_hours if spec.deadline else None
    if total is not None and steps is not None:
        step, of = steps
        return total * min(1.0, step / of)
    return done_hours(spec, attempts, now)
