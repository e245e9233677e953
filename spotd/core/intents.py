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


class IntentOutcome(StrEnum):
    """How an intent was settled."""

    APPLIED = "applied"
    """The loop did what the intent asked."""
    MOOT = "moot"
    """The job ended before the loop could act on it."""


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """One stored intent; open while ``settled_at`` is None."""

    id: int
    job_id: str
    kind: IntentKind
    requested_at: datetime
    priority: int | None = None
    """The priority asked for (a ``priority`` intent only)."""
    settled_at: datetime | None = None
    outcome: IntentOutcome | None = None

    @property
    def open(self) -> bool:
        """Whether the loop has yet to act on it."""
        return self.settled_at is None
