"""Intents: what a user asked of a job, stored for the reconcile loop to carry out.

The API, the dashboard and the CLI change no job themselves. They store an
intent (cancel this job; give it this priority) and answer from what is
stored; the loop of the daemon that holds the job acts on it in its next pass,
through the same verdicts and executor as everything else it does. So one
owner changes a job, whichever daemon took the request and whichever thread.

An intent is settled once: ``applied`` when the loop did what it asked,
``moot`` when the job ended first (it succeeded before a cancel reached it).
The store settles the open intents of a job in the transaction that ends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class IntentKind(StrEnum):
    """What an intent asks."""

    CANCEL = "cancel"
    """Stop the job's instances and end it as cancelled."""
    PRIORITY = "priority"
    """Give the job another priority (``IntentRecord.priority``)."""
    RELEASE = "release"
    """Stop the nodes a failed job keeps for inspection (``keep_on_failure``) before its
    hold runs out. Asked of an ended job: the hold's keeper acts on it
    (:mod:`spotd.engine.holds`), not the job's step."""
    YIELD_PRIORITY = "yield-priority"
    """Asked by the loop, not a user: stop the running job as on a preemption notice, so
    that a pending job of its team with a higher priority takes its place
    (:mod:`spotd.core.orders`)."""
    YIELD_BUDGET = "yield-budget"
    """Asked by the loop: stop the running job as on a preemption notice before its
    team's monthly budget is spent."""
    DRILL = "drill"
    """Have the provider preempt one node of the running job through its own notice
    (``spotd drill``), to prove its checkpoint and resume: ``IntentRecord.node`` names the
    node by its rank (:mod:`spotd.engine.drills`)."""


class IntentOutcome(StrEnum):
    """How an intent was settled."""

    APPLIED = "applied"
    """The loop did what the intent asked."""
    MOOT = "moot"
    """The job ended (a drill: stopped running) before the loop could act on it."""
    FAILED = "failed"
    """The loop tried and the provider refused (a drill: the job's events say why)."""


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """One stored intent; open while ``settled_at`` is None."""

    id: int
    job_id: str
    kind: IntentKind
    requested_at: datetime
    priority: int | None = None
    """The priority asked for (a ``priority`` intent only)."""
    node: int | None = None
    """The rank of the node to drill (a ``drill`` intent only)."""
    settled_at: datetime | None = None
    outcome: IntentOutcome | None = None

    @property
    def open(self) -> bool:
        """Whether the loop has yet to act on it."""
        return self.settled_at is None


STOP_KINDS = frozenset({IntentKind.YIELD_PRIORITY, IntentKind.YIELD_BUDGET})
"""The intents that stop the job's running attempt as on a preemption notice; the loop
asks them, and they are settled when that attempt closes."""
