"""What a step decided for a job: typed verdicts, carried out by :mod:`spotd.engine.executor`.

The judging functions (:mod:`spotd.engine.judge`, :mod:`spotd.engine.placing`)
turn a job's facts into one of these and touch nothing; the executor is the
only code that turns one into store writes and provider calls. A verdict
names its reason as a type (a job status, an attempt end, a failure cause,
an event cause), with the human detail beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotd.core.intents import IntentRecord
from spotd.core.orders import StopReason
from spotd.core.values import (
    EMPTY_FACTS,
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventFacts,
    FailureCause,
    JobRecord,
    JobStatus,
    NewAttempt,
)
from spotd.engine.waiting import WaitingReason


@dataclass(frozen=True, slots=True)
class Stay:
    """Nothing to change this pass (a node still booting, some nodes done first, no
    better pool to move to)."""


@dataclass(frozen=True, slots=True)
class Defer:
    """A passing failure (a throttled launch, say): the same step is tried next pass."""

    why: str


@dataclass(frozen=True, slots=True)
class Wait:
    """The job stays where it is, for ``reason``; said with an event when its gist changed."""

    reason: WaitingReason
    cause: EventCause = EventCause.WAITING
    make_way: JobRecord | None = None
    """A running job of the team that is to stop for this one (a held job's only)."""


@dataclass(frozen=True, slots=True)
class Place:
    """Open ``attempt`` (the job moves to provisioning), then launch it."""

    attempt: NewAttempt
    detail: str


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch the open attempt that has no instances yet (a crash came between the two)."""

    attempt: AttemptRecord


@dataclass(frozen=True, slots=True)
class Running:
    """Every node is up (and a gang assembled): the attempt runs."""

    attempt: AttemptRecord
    detail: str
    calm: bool
    """Nothing on the nodes for the next pass to act on: the job may sleep."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A node is under a preemption notice: the job checkpoints."""

    attempt: AttemptRecord
    facts: EventFacts = EMPTY_FACTS
    """The noticed node (its id and rank), for the event."""


@dataclass(frozen=True, slots=True)
class Yield:
    """The daemon stops the running job as on a preemption notice
    (:mod:`spotd.core.orders`): it checkpoints, and waits for ``reason`` to pass."""

    attempt: AttemptRecord
    reason: StopReason


@dataclass(frozen=True, slots=True)
class Replan:
    """A running job whose re-plan is due: ask the policy whether it should move."""

    attempt: AttemptRecord


@dataclass(frozen=True, slots=True)
class End:
    """Close ``attempt`` (if any) as ``end`` and move the job to ``status``: recovering
    (it is placed again), or a terminal status. Its nodes are stopped and it is billed."""

    status: JobStatus
    cause: EventCause | AttemptEnd
    detail: str
    attempt: AttemptRecord | None = None
    end: AttemptEnd | None = None
    failure: FailureCause | None = None
    exit_code: int | None = None
    """The command's exit code that ended the attempt, kept with it."""
    facts: EventFacts = EMPTY_FACTS
    """What the event says beside its cause (the exit code, the node, the error)."""

    @classmethod
    def attempt_ended(
        cls,
        attempt: AttemptRecord,
        status: JobStatus,
        end: AttemptEnd,
        detail: str,
        *,
        failure: FailureCause | None = None,
        exit_code: int | None = None,
        facts: EventFacts = EMPTY_FACTS,
    ) -> End:
        """The attempt ended as ``end``, which is also the event's cause."""
        return cls(status, end, detail, attempt=attempt, end=end, failure=failure,
                   exit_code=exit_code, facts=facts)  # fmt: skip

    @classmethod
    def failed(
        cls,
        cause: EventCause | AttemptEnd,
        failure: FailureCause,
        detail: str,
        *,
        attempt: AttemptRecord | None = None,
        end: AttemptEnd | None = None,
        facts: EventFacts = EMPTY_FACTS,
    ) -> End:
        """The job fails for ``failure``."""
        return cls(JobStatus.FAILED, cause, detail, attempt=attempt, end=end, failure=failure,
                   facts=facts)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Repair:
    """Some nodes of a gang went and the others stand by (:mod:`spotd.engine.repair`):
    close ``attempt`` as ``end``, stop only the lost nodes, and open the next attempt in
    the same pool and market with the kept nodes at their ranks and new nodes launched
    for the others."""

    attempt: AttemptRecord
    end: AttemptEnd
    """How the attempt ended (preempted, lost), which is also its close event's cause."""
    detail: str
    facts: EventFacts
    """The (first) lost node, its id and rank."""
    kept: tuple[str | None, ...]
    """By rank: the instance id kept there, or None where a new node is launched."""

    @property
    def kept_ids(self) -> tuple[str, ...]:
        """The instances the next attempt keeps."""
        return tuple(i for i in self.kept if i is not None)

    @property
    def lost_ids(self) -> tuple[str, ...]:
        """The instances of the attempt that the next one does not keep."""
        return tuple(i for i in self.attempt.instance_ids if i not in self.kept)


@dataclass(frozen=True, slots=True)
class Reprioritise:
    """A user asked for another priority: give the job the one ``intent`` names."""

    intent: IntentRecord


@dataclass(frozen=True, slots=True)
class Drill:
    """A user asked for a drill (``spotd drill``): have the provider preempt node ``rank``
    of the running ``attempt`` through its own notice, and say so with an event. The
    notice then takes the path of any preemption (:mod:`spotd.engine.drills`)."""

    intent: IntentRecord
    attempt: AttemptRecord
    rank: int


@dataclass(frozen=True, slots=True)
class Moot:
    """An intent left with nothing to do (a drill of a job that stopped running first):
    settle it as moot."""

    intent: IntentRecord
    why: str


Verdict = (
    Stay | Defer | Wait | Place | Launch | Running | Checkpoint | Yield | Replan | End
    | Reprioritise | Repair | Drill | Moot
)
"""Everything a step can decide for one job."""
