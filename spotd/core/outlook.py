"""What a plan's figures cover, and whether it keeps the job's deadline: the verdict
``spotd plan`` gives, with its slack.

The figures are the policy's own, for the offering it chose (its candidate's
breakdown): the hours it expects the work left to take there, preemptions,
checkpoint writes and the changeover included, and the hours it would take
with no preemption at all. The margin is what the default policy's safety nets
keep in hand (``spotd_policies.balanced``): one more changeover, and on spot a
preemption that throws away a whole checkpoint interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CostBasis(StrEnum):
    """What the expected figures (cost, hours, loss) of a plan are for."""

    WORK_LEFT = "work-left"
    """The compute hours the job has left: ``deadline.compute_hours`` less what is done."""
    ONE_HOUR = "one-hour"
    """The spec gives no ``deadline.compute_hours``: one compute hour of work, not the
    whole job (the hour the policies price such a job by)."""


class DeadlineVerdict(StrEnum):
    """What a plan says of a job's ``deadline.finish_by``."""

    MEETS = "meets"
    """Expected to end in time, with the margin to spare."""
    AT_RISK = "at-risk"
    """Can end in time, but with less than the margin to spare, or nothing placed now."""
    CANNOT_MEET = "cannot-meet"
    """Cannot end in time even with no preemption at all (or the deadline has passed)."""


@dataclass(frozen=True, slots=True)
class Outlook:
    """A verdict and its slack: the hours to the deadline less the hours expected."""

    verdict: DeadlineVerdict
    slack_hours: float


def outlook(
    *,
    hours_left: float,
    expected_hours: float,
    fastest_hours: float,
    margin_hours: float,
    placed: bool = True,
) -> Outlook:
    """The verdict on ``hours_left`` to the deadline for a choice expected to take
    ``expected_hours`` (``fastest_hours`` without a preemption), keeping ``margin_hours``.

    ``placed`` False: the policy chose nothing now (no capacity, or its plan waits),
    so the hours are the work's own and the slack runs down while the job waits: at
    best at risk.
    """
    slack = hours_left - expected_hours
    if hours_left <= 0 or hours_left < fastest_hours:
        return Outlook(DeadlineVerdict.CANNOT_MEET, slack)
    if not placed or slack < margin_hours:
        return Outlook(DeadlineVerdict.AT_RISK, slack)
    return Outlook(DeadlineVerdict.MEETS, slack)
