"""The job state machine as data, and the one function that applies a transition.

``TRANSITIONS`` is the whole machine: a status may only change to one listed
for it. :func:`transition` checks the table, then asks the store for a
compare-and-set (``UPDATE jobs SET status = new WHERE id = ? AND status =
expected``) that writes the event row in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from spotd.core.errors import IllegalTransition
from spotd.core.values import TERMINAL, EventCause, FailureCause, JobStatus, Transition

if TYPE_CHECKING:
    from spotd.core.contracts import JobStore
    from spotd.core.values import JobRecord


# The statuses, values and the transition, from one import path.
__all__ = [
    "ACTIVE",
    "TERMINAL",
    "TRANSITIONS",
    "WAITING_CAUSE",
    "FailureCause",
    "JobStatus",
    "Transition",
    "allowed",
    "transition",
]

S = JobStatus

ACTIVE: tuple[JobStatus, ...] = tuple(s for s in JobStatus if s not in TERMINAL)
"""Every status of a job that is not over, in declaration order."""

WAITING_CAUSE = EventCause.WAITING
"""The cause of an event that records a job's new waiting reason (``Store.set_waiting``):
from and to its own status, no transition."""

TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    # PENDING -> PENDING records a hold (a team limit keeps the job back) as an event:
    # the job stays pending and its events say why.
    S.PENDING: frozenset({S.PENDING, S.PROVISIONING, S.FAILED, S.CANCELLED}),
    S.PROVISIONING: frozenset({S.RUNNING, S.RECOVERING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.CHECKPOINTING, S.RECOVERING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.CHECKPOINTING: frozenset({S.RECOVERING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.RECOVERING: frozenset({S.PROVISIONING, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    # A retry (``spotd retry``, cause RETRIED) and nothing else: the job recovers, under
    # the same id, from its last complete checkpoint (spotd.engine.retrying).
    S.FAILED: frozenset({S.RECOVERING}),
    S.CANCELLED: frozenset({S.RECOVERING}),
}
"""Allowed changes of status. A job that succeeded is over for good; one that failed or
was cancelled may only be retried (to recovering), by a user, never by the loop."""


def allowed(from_status: JobStatus, to_status: JobStatus) -> bool:
    """Whether the table allows ``from_status -> to_status``."""
    return to_status in TRANSITIONS[from_status]


def transition(store: JobStore, change: Transition, *, now: datetime) -> JobRecord:
    """Apply ``change`` or raise.

    Raises :class:`IllegalTransition` when the table forbids it and
    :class:`~spotd.core.errors.LostTransition` when the job is no longer in
    ``change.expected`` (another writer won).
    """
    if not allowed(change.expected, change.new):
        raise IllegalTransition(
            f"job {change.job_id}: {change.expected} -> {change.new} is not allowed"
        )
    if (change.new is JobStatus.FAILED) != (change.failure is not None):
        raise IllegalTransition(
            f"job {change.job_id}: a failure cause goes with FAILED and only with it"
        )
    return store.compare_and_set(change, now=now)
