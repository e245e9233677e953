"""``spotd retry``: a failed or cancelled job runs again, under the same id.

A retry moves the job from ``failed`` or ``cancelled`` to ``recovering``
(:data:`~spotd.core.states.TRANSITIONS`, cause ``retried``). From there the
loop treats it as any recovering job: it places a new attempt, which resumes
from the job's last complete checkpoint (its ``resume_from``, the nodes'
``SPOTD_RESUME_FROM``), as after a preemption. The earlier attempts stay, and
with them the job's ledger: its cost, and its budget, count every attempt.
The ``[retry]`` bounds start afresh (they count the attempts since the latest
retry, :func:`spotd.engine.attempts.since_retry`), and a team's limits hold
the job back as they hold a new one. Nodes a hold still keeps
(``keep_on_failure``) are stopped in the next pass: a retry reuses none.

Why here, and not an intent for the loop: every other change a user asks of
a job is an intent that the loop of the daemon holding the job carries out,
because that loop is the job's one writer. An ended job has no such loop. A
pass claims and steps active jobs only (``claim_job_versions``), so an intent
on an ended job would wait for a loop that never comes, unless every claim
read the ended jobs too. The retry is therefore the one compare-and-set a
request makes itself, through the store, exactly as a submit stores a new
job: guarded on the ended status the job was read in, with its event in the
same transaction. Nothing else writes an ended job's status, so the guard
loses only to another retry (one of two racing retries wins, the other gets
:class:`~spotd.core.errors.LostTransition`). Once recovering, the job is active
again: the daemon that held it (its ``owner`` stays) takes it in its next
pass, or any daemon does once that owner's lease has run out.
"""

from __future__ import annotations

from datetime import datetime

from spotd.billing.ledger import spend_so_far
from spotd.core.contracts import Store
from spotd.core.errors import RetryRefused
from spotd.core.states import JobStatus, Transition, transition
from spotd.core.values import EventCause, JobRecord

RETRYABLE = frozenset({JobStatus.FAILED, JobStatus.CANCELLED})
"""The statuses a job may be retried from."""


def retry_refusal(job: JobRecord, spent_usd: float) -> str | None:
    """Why ``job``, which has cost ``spent_usd`` by its ledger, cannot be retried; None
    when it can. Only a failed or cancelled job can; and not one whose spend reached its
    ``budget.max_usd``: its budget covers every attempt, so it would fail over budget at
    once (submit it again with a larger budget instead)."""
    if job.status not in RETRYABLE:
        if job.status is JobStatus.SUCCEEDED:
            return f"job {job.id} succeeded: only a failed or cancelled job can be retried"
        return (f"job {job.id} is {job.status}, not ended: only a failed or cancelled job "
                "can be retried")  # fmt: skip
    budget = job.spec.budget
    if budget is not None and spent_usd >= budget.max_usd:
        return (f"job {job.id} has spent {spent_usd:,.2f} of its {budget.max_usd:,.2f} USD "
                "budget.max_usd, which covers every attempt: a retry would fail over budget "
                "at once; submit it again with a larger budget")  # fmt: skip
    return None


def retry(store: Store, job_id: str, *, now: datetime) -> JobRecord:
    """Move the failed or cancelled job to ``recovering``, for the loop to place it again
    from its last complete checkpoint; the job as it is now.

    :class:`~spotd.core.errors.RetryRefused` for a job that cannot be retried
    (:func:`retry_refusal`), :class:`~spotd.core.errors.LostTransition` when another
    retry won, :class:`~spotd.core.errors.JobNotFound` for an unknown id.
    """
    job = store.get_job(job_id)
    spent = spend_so_far(job, store.attempts(job.id), store.ledger(job_id=job.id), now)
    refusal = retry_refusal(job, spent)
    if refusal is not None:
        raise RetryRefused(refusal, job_id=job.id)
    was = f"failed ({job.failure})" if job.failure is not None else "was cancelled"
    change = Transition(job_id=job.id, expected=job.status, new=JobStatus.RECOVERING,
                        cause=EventCause.RETRIED,
                        detail=f"retried by a user after it {was}; resumes from its last "
                        "complete checkpoint")  # fmt: skip
    return transition(store, change, now=now)
