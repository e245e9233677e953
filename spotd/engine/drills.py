"""Drills: a user has the provider preempt one node of a running job on purpose.

``spotd drill JOB --node N`` proves a job's checkpoint and resume before a real
preemption counts. The API checks the job can have one (:func:`drill_refusal`) and
stores a ``drill`` intent; the loop of the daemon that holds the job asks the
node's provider to preempt it through its own mechanism
(:class:`~spotd.core.contracts.Driller`), writes a ``drill`` event naming the
node, and settles the intent (:func:`carry_out_drill`). From there on the
provider's notice takes the path of any preemption: the agent relays it, the job
checkpoints, the attempt ends ``preempted`` and the job resumes. The notice and
the attempt's end carry the ``drill`` fact (:func:`with_drill_fact`), so the
attempt a drill ended, and what it cost, can be told from the market's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from spotd.core.contracts import Driller, IntentStore, Provider
from spotd.core.drill import drilled
from spotd.core.errors import (
    DrillRefused,
    FieldProblem,
    InvalidRequestError,
    ProviderError,
    RequestInvalid,
)
from spotd.core.intents import IntentOutcome, IntentRecord
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventRecord,
    JobRecord,
    JobStatus,
    Market,
)
from spotd.engine.judge import error_facts, node_facts
from spotd.engine.verdicts import Checkpoint, Drill, End, Moot, Repair, Verdict

__all__ = ["carry_out_drill", "drill_refusal", "judge_drill", "with_drill_fact"]

log = logging.getLogger(__name__)


def drill_refusal(
    job: JobRecord, attempt: AttemptRecord | None, rank: int, provider: Provider | None
) -> None:
    """Raise unless node ``rank`` of ``job`` can be drilled now: :class:`DrillRefused` for
    a job that is not running, an on-demand attempt or a provider without drills,
    :class:`RequestInvalid` (field ``node``) for a rank the running attempt does not have.
    ``attempt`` is the job's open attempt, ``provider`` the one it runs on."""
    if job.status is not JobStatus.RUNNING or attempt is None or not attempt.instance_ids:
        raise DrillRefused(f"job {job.id} is {job.status}: only a running job can be drilled",
                           job_id=job.id)  # fmt: skip
    if not 0 <= rank < len(attempt.instance_ids):
        message = (f"node: job {job.id} runs {len(attempt.instance_ids)} node(s), ranks 0 to "
                   f"{len(attempt.instance_ids) - 1}; there is no node {rank}")  # fmt: skip
        raise RequestInvalid(message, [FieldProblem("node", message)])
    if attempt.market is not Market.SPOT:
        raise DrillRefused(f"job {job.id} runs on-demand on {attempt.pool}: only a spot node "
                           "is preempted", job_id=job.id)  # fmt: skip
    if not isinstance(provider, Driller):
        raise DrillRefused(f"{attempt.pool.provider} cannot preempt a node on purpose: job "
                           f"{job.id} cannot be drilled there", job_id=job.id)  # fmt: skip


def judge_drill(
    intent: IntentRecord, attempt: AttemptRecord | None, status: JobStatus | None
) -> Drill | Moot:
    """The step of a job asked for a drill: drill its running attempt, or settle the drill
    as moot when the job stopped running (or moved to another attempt) first."""
    if status is not JobStatus.RUNNING or attempt is None:
        return Moot(intent, f"the job is {status} before its drill")
    if intent.requested_at < attempt.started_at:
        return Moot(intent, "the drill was asked of an earlier attempt")
    rank = intent.node or 0
    if not 0 <= rank < len(attempt.instance_ids):
        return Moot(intent, f"the attempt has no node {rank}")
    return Drill(intent, attempt, rank)


def carry_out_drill(
    store: IntentStore, provider: Provider, verdict: Drill, *, at: datetime
) -> None:
    """Ask ``provider`` to preempt the drilled node, then write the ``drill`` event and
    settle the intent (applied); a refusal writes ``drill failed`` with the error and
    settles it as failed. A passing failure (a throttle, a 5xx) is raised: the intent
    stays open, and the next pass tries again."""
    attempt, rank = verdict.attempt, verdict.rank
    node = attempt.instance_ids[rank]
    facts = replace(node_facts(attempt, node), rank=rank, provider=attempt.pool.provider)
    where = f"{attempt.pool}: node {rank} ({node})"
    try:
        if not isinstance(provider, Driller):
            raise InvalidRequestError(f"{provider.name} cannot preempt a node on purpose",
                                      provider=provider.name, code="DrillUnsupported")  # fmt: skip
        provider.drill(node)
    except ProviderError as exc:
        if exc.retryable:
            raise
        said = replace(error_facts(attempt, exc), node=node, rank=rank)
        store.settle_intent(verdict.intent, IntentOutcome.FAILED, at=at,
                            cause=EventCause.DRILL_FAILED,
                            detail=f"{where}: {type(exc).__name__}: {exc}", facts=said)  # fmt: skip
        log.warning("job %s: drill of %s refused: %s", attempt.job_id, where, exc)
        return
    store.settle_intent(verdict.intent, IntentOutcome.APPLIED, at=at, cause=EventCause.DRILL,
                        detail=f"{where}: preempted by its provider, with the provider's notice",
                        facts=facts)  # fmt: skip
    log.info("job %s: drill of %s sent", attempt.job_id, where)


def with_drill_fact(verdict: Verdict, events: Callable[[], Sequence[EventRecord]]) -> Verdict:
    """``verdict`` with the ``drill`` fact when it records the notice or the preemption of
    an attempt one of whose nodes a drill was sent to (a ``drill`` event since the attempt
    began names it); ``events`` reads the job's events, only for such a verdict."""
    match verdict:
        case Checkpoint(attempt=attempt, facts=facts):
            pass
        case End(attempt=AttemptRecord() as attempt, end=AttemptEnd.PREEMPTED, facts=facts):
            pass
        case Repair(attempt=attempt, end=AttemptEnd.PREEMPTED, facts=facts):
            pass
        case _:
            return verdict
    if not drilled(attempt, events()):
        return verdict
    return replace(verdict, facts=replace(facts, drill=True))
