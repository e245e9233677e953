"""What users asked of a job (its open intents), judged into a verdict.

An intent comes before everything else the step would judge: a job asked to
stop is not placed, launched or watched first. Pure, like :mod:`spotd.engine.judge`.
"""

from __future__ import annotations

from collections.abc import Sequence

from spotd.core.intents import IntentKind, IntentRecord
from spotd.core.values import AttemptEnd, AttemptRecord, EventCause, JobStatus
from spotd.engine.drills import judge_drill
from spotd.engine.verdicts import End, Reprioritise, Verdict


def judge_intents(
    intents: Sequence[IntentRecord],
    attempt: AttemptRecord | None,
    status: JobStatus | None = None,
) -> Verdict | None:
    """The verdict of the job's open ``intents`` (a cancel first, then a priority, then a
    drill), or None when it has none; ``attempt`` is its open attempt, which a cancel
    closes, and ``status`` the job's (a drill is carried out only while it runs)."""
    if any(i.kind is IntentKind.CANCEL for i in intents):
        return cancel(attempt)
    asked = [i for i in intents if i.kind is IntentKind.PRIORITY]
    if asked:
        return Reprioritise(asked[-1])
    drills = [i for i in intents if i.kind is IntentKind.DRILL]
    if drills:
        return judge_drill(drills[0], attempt, status)
    return None


def cancel(attempt: AttemptRecord | None) -> End:
    """End the job as cancelled, closing its open attempt (if any) and stopping its nodes."""
    end = AttemptEnd.CANCELLED if attempt is not None else None
    return End(JobStatus.CANCELLED, EventCause.CANCELLED, "", attempt=attempt, end=end)
