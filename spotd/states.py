"""The job state machine as data, and the one function that applies a transition.

``TRANSITIONS`` is the whole machine: a status may only change to one listed
for it. :func:`transition` checks the table, then asks the store for a
compare-and-set (``UPDATE jobs SET status = new WHERE id = ? AND status =
expected``) that writes the event row in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from spotd.errors import IllegalTransition

if TYPE_CHECKING:
    from spotd.contracts import Store
    from spotd.domain import AttemptClose, JobRecord, NewAttempt


class JobStatus(StrEnum):
    """Where a job is in its life."""

    PENDING = "pending"
    """Submitted, waiting for its first placement."""
    PROVISIONING = "provisioning"
    """An attempt is open and its nodes are being launched or booting."""
    RUNNING = "running"
    """All nodes of the open attempt run the job."""
    CHECKPOINTING = "checkpointing"
    """A preemption notice came: the job is writing its checkpoint."""
    RECOVERING = "recovering"
    """The last attempt ended early; waiting for a new placement."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Ended without success; ``failure`` says why."""
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class FailureCause(StrEnum):
    """Why a job failed, kept apart so users and reports can tell them apart."""

    NO_CAPACITY = "no-capacity"
    OVER_BUDGET = "over-budget"
    DEADLINE_IMPOSSIBLE = "deadline-impossible"
    USER_COMMAND_FAILED = "user-command-failed"
    PROVIDER_ERROR = "provider-error"
    INVALID_SPEC = "invalid-spec"


S = JobStatus
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})

TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    S.PENDING: frozenset({S.PROVISIONING, S.FAILED, S.CANCELLED}),
    S.PROVISIONING: frozenset({S.RUNNING, S.RECOVERING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.CHECKPOINTING, S.RECOVERING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.CHECKPOINTING: frozenset({S.RECOVERING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.RECOVERING: frozenset({S.PROVISIONING, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
"""Allowed changes of status. Terminal statuses allow none."""


def allowed(from_status: JobStatus, to_status: JobStatus) -> bool:
    """Whether the table allows ``from_status -> to_status``."""
    return to_status in TRANSITIONS[from_status]


@dataclass(frozen=True, slots=True)
class Transition:
    """One requested change of a job's status, with what goes with it.

    An attempt may be opened (``open_attempt``) or closed (``close_attempt``)
    in the same transaction, so history and status never disagree.
    """

    job_id: str
    expected: JobStatus
    new: JobStatus
    cause: str
    detail: str = ""
    failure: FailureCause | None = None
    open_attempt: NewAttempt | None = None
    close_attempt: AttemptClose | None = None


def transition(store: Store, change: Transition, *, now: datetime) -> JobRecord:
    """Apply ``change`` or raise.

    Raises :class:`IllegalTransition` when the table forbids it and
    :class:`~spotd.errors.LostTransition` when the job is no longer in
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
