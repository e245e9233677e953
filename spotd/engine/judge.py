"""Pure judgement of a job's facts: what its step should do, as a verdict.

Nothing here reads a clock, a store or a provider: the loop gathers the facts
(:class:`WatchFacts`), these functions weigh them, and the executor carries
the verdict out. The same facts always give the same verdict.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from spotd.core.errors import (
    CapacityError,
    InvalidRequestError,
    PriceTooLowError,
    ProviderError,
    QuotaError,
)
from spotd.core.values import (
    EMPTY_FACTS,
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventFacts,
    FailureCause,
    Instance,
    InstanceState,
    JobRecord,
    JobStatus,
    Market,
    Pool,
    exit_cause_of,
    signal_of_exit,
)
from spotd.engine.attempts import error_exits, failed_launches, restartable, since_retry
from spotd.engine.gang import GangState, assembly_seconds, job_failure, preflight_summary
from spotd.engine.hang import GangProgress, hung
from spotd.engine.verdicts import Checkpoint, Defer, End, Replan, Running, Stay, Verdict

# -- limits that end a job wherever it is -------------------------------------


def over_budget(job: JobRecord, spent: float, running: AttemptRecord | None = None) -> End | None:
    """The job fails once its spend reaches ``budget.max_usd`` (its running attempt ends)."""
    budget = job.spec.budget
    if budget is None or spent < budget.max_usd:
        return None
    return End.failed(
        EventCause.OVER_BUDGET, FailureCause.OVER_BUDGET,
        f"spent {spent:,.2f} of {budget.max_usd:,.2f} USD",
        attempt=running, end=AttemptEnd.OVER_BUDGET if running else None,
    )  # fmt: skip


def deadline_impossible(job: JobRecord, now: datetime) -> End | None:
    """A pending job whose compute hours cannot end by its ``finish_by`` fails now."""
    deadline = job.spec.deadline
    if deadline is None or deadline.finish_by is None or deadline.compute_hours is None:
        return None
    if now + timedelta(hours=deadline.compute_hours) <= deadline.finish_by:
        return None
    return End.failed(
        EventCause.DEADLINE_IMPOSSIBLE, FailureCause.DEADLINE_IMPOSSIBLE,
        f"{deadline.compute_hours:g} h of compute cannot end by "
        f"{deadline.finish_by.isoformat()}",
    )  # fmt: skip


def waited_too_long(job: JobRecord, now: datetime, limit_hours: float | None) -> End | None:
    """A job no offering passed for ``no_capacity_timeout_hours`` fails."""
    if limit_hours is None or now - job.updated_at < timedelta(hours=limit_hours):
        return None
    return End.failed(
        EventCause.NO_CAPACITY, FailureCause.NO_CAPACITY,
        f"no offering passed the filters for {limit_hours:g} h",
    )  # fmt: skip


def every_pool_failed(
    job: JobRecord, spent_pools: Collection[Pool], choice: Pool | None
) -> End | None:
    """Fail the job when the policy, shown the pools it may no longer use
    (``retry.launch_failures_per_pool``), would pick one of them: it would wait forever."""
    if choice is None or choice not in spent_pools:
        return None
    pools = ", ".join(sorted(str(p) for p in spent_pools))
    return End.failed(
        EventCause.LAUNCH_FAILED_EVERYWHERE, FailureCause.LAUNCH_FAILED,
        f"every pool it can use failed {job.spec.retry.launch_failures_per_pool} launch(es) "
        f"(retry.launch_failures_per_pool): {pools}",
    )  # fmt: skip


# -- a launch that failed -------------------------------------------------------


def launch_failure(
    job: JobRecord, attempt: AttemptRecord, attempts: Sequence[AttemptRecord], exc: ProviderError
) -> Verdict:
    """What a failed launch of ``attempt`` means for the job.

    A throttle or a 5xx defers (the same request may pass next pass); a request
    every pool would refuse fails the job; otherwise the attempt ends and the job
    is placed again, within ``retry.launch_failures``. ``attempts`` include the
    open one, which is not counted.
    """
    if exc.retryable and not isinstance(exc, CapacityError):
        return Defer(f"launch of {attempt.pool} deferred: {exc}")
    no_capacity = isinstance(exc, CapacityError | QuotaError | PriceTooLowError)
    end = AttemptEnd.NO_CAPACITY if no_capacity else AttemptEnd.LAUNCH_FAILED
    detail = f"{attempt.pool}: {type(exc).__name__}: {exc}"
    facts = error_facts(attempt, exc)
    if isinstance(exc, InvalidRequestError):
        # The request the job makes cannot be carried (its env would carry the
        # daemon's token, say): every pool would refuse it alike.
        return End.failed(EventCause.LAUNCH_REFUSED, FailureCause.INVALID_SPEC, detail,
                          attempt=attempt, end=end, facts=facts)  # fmt: skip
    retry = job.spec.retry
    failed_before = failed_launches(attempts)
    if failed_before >= retry.launch_failures:
        detail += (f" ({failed_before + 1} failed launches, "
                   f"retry.launch_failures is {retry.launch_failures})")  # fmt: skip
        return End.attempt_ended(attempt, JobStatus.FAILED, end, detail,
                                 failure=FailureCause.LAUNCH_FAILED, facts=facts)  # fmt: skip
    detail += f" ({retry.launch_failures - failed_before - 1} more failed launch(es) allowed"
    if failed_launches(attempts, attempt.pool) + 1 >= retry.launch_failures_per_pool:
        detail += f"; {attempt.pool} is not used for this job again"
    return End.attempt_ended(attempt, JobStatus.RECOVERING, end, detail + ")", facts=facts)


def error_facts(attempt: AttemptRecord, exc: ProviderError) -> EventFacts:
    """The facts of a failed launch: spotd's error class and code, the provider's code."""
    return EventFacts(
        error_class=type(exc).__name__, error_code=exc.error_code,
        provider=exc.provider or attempt.pool.provider, provider_code=exc.code or None,
    )  # fmt: skip


def node_facts(
    attempt: AttemptRecord,
    instance_id: str,
    exit_code: int | None = None,
    oom_kills: int | None = None,
) -> EventFacts:
    """The facts of an event about one node of ``attempt``: its id, its rank in a gang
    (its place in the attempt's instance ids), the exit code it ended with, and how that
    exit failed (:func:`~spotd.core.values.exit_cause_of`, with the agent's count of OOM
    kills as the only evidence of running out of memory)."""
    rank = None
    if attempt.nodes > 1 and instance_id in attempt.instance_ids:
        rank = attempt.instance_ids.index(instance_id)
    return EventFacts(exit_code=exit_code, signal=signal_of_exit(exit_code), node=instance_id,
                      rank=rank, exit_cause=exit_cause_of(exit_code, oom_kills),
                      oom_kills=oom_kills)  # fmt: skip


# -- a watched attempt ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchFacts:
    """What the loop knows of a provisioning, running or checkpointing job."""

    job: JobRecord
    attempt: AttemptRecord
    """Its open attempt."""
    attempts: Sequence[AttemptRecord]
    instances: Sequence[Instance | None]
    """The attempt's nodes in launch order, with their agents' reports (and kept exits)
    merged; None for a node the provider no longer lists."""
    gang: GangState
    now: datetime
    spent: float
    real_per_second: float
    """Real seconds per second of the engine's clock (the gang timeouts are real)."""
    unweighed_warning: bool
    """A node reported a rebalance warning that no re-plan has weighed yet."""
    progress: GangProgress | None = None
    """What its agents said of its progress, for the hang watch (:mod:`spotd.engine.hang`)."""


def watch(facts: WatchFacts) -> Verdict:
    """The step of a job whose attempt is open and launched."""
    job, attempt, instances = facts.job, facts.attempt, facts.instances
    if (ended := over_budget(job, facts.spent, attempt)) is not None:
        return ended
    if (ended := gang_failure(facts)) is not None:
        return ended
    if any(i is None or i.ended for i in instances):
        return attempt_ended(job, attempt, facts.attempts, instances)
    if job.status is JobStatus.PROVISIONING:
        up = all(i is not None and i.state in _UP for i in instances)
        if up and (attempt.nodes == 1 or facts.gang.assembled(attempt.nodes)):
            detail = str(attempt.pool)
            if facts.gang.preflight is not None:
                detail += f"; {preflight_summary(facts.gang.preflight)}"
            calm = not _noticed(instances) and not facts.unweighed_warning
            return Running(attempt, detail, calm=calm)
        return Stay()
    if job.status is JobStatus.RUNNING:
        noticed = _first(instances, InstanceState.NOTICE)
        if noticed is None:
            stuck = hung(job, attempt, facts.attempts, facts.progress)
            return Replan(attempt) if stuck is None else stuck
        return Checkpoint(attempt, facts=node_facts(attempt, noticed.id))
    return Stay()


_UP = (InstanceState.RUNNING, InstanceState.NOTICE)


def _noticed(instances: Sequence[Instance | None]) -> bool:
    return _first(instances, InstanceState.NOTICE) is not None


def _first(instances: Sequence[Instance | None], state: InstanceState) -> Instance | None:
    """The first of ``instances`` (in rank order) in ``state``."""
    return next((i for i in instances if i is not None and i.state is state), None)


def gang_failure(facts: WatchFacts) -> End | None:
    """End the attempt if its preflight failed or its gang did not assemble in time.

    Checked before the nodes' exits: an agent that gave up on its gang or on a
    failed preflight exits too, and that is no verdict on the job's command. No
    job ever runs on a partial gang.
    """
    job, attempt, gang = facts.job, facts.attempt, facts.gang
    if gang.gave_up == "setup":
        return setup_failed(job, attempt, facts.attempts, gang)
    if gang.preflight_failed:
        return preflight_failed(attempt, gang)
    if gang.gave_up == "rendezvous" or _assembly_overdue(facts):
        running = sum(1 for i in facts.instances if i is not None and not i.ended)
        return End.attempt_ended(
            attempt, JobStatus.RECOVERING, AttemptEnd.LOST,
            f"{attempt.pool}: gang did not assemble in "
            f"{assembly_seconds(job.spec):g} s ({running} of {attempt.nodes} node(s) up, "
            f"{gang.joined} joined, {gang.started} passed preflight)",
        )  # fmt: skip
    return None


def _assembly_overdue(facts: WatchFacts) -> bool:
    """A multi-node attempt still assembling past its gang and preflight timeouts."""
    job, attempt = facts.job, facts.attempt
    if job.status is not JobStatus.PROVISIONING or attempt.nodes == 1:
        return False
    if facts.gang.assembled(attempt.nodes):
        return False
    waited = (facts.now - attempt.started_at).total_seconds()
    # The timeouts are real seconds; the engine's clock may run faster (simulator).
    return waited >= assembly_seconds(job.spec) / facts.real_per_second


def setup_failed(
    job: JobRecord, attempt: AttemptRecord, attempts: Sequence[AttemptRecord], gang: GangState
) -> End:
    """A node could not be prepared (code, secrets or a setup command): place the job
    again, within ``retry.setup_failures``; past it, the job fails."""
    report = gang.setup_failure
    detail = f"setup failed on {attempt.pool}"
    facts = EMPTY_FACTS
    if report is not None:
        detail = f"setup on {report.instance_id} exited with {report.exit_code}"
        if report.exit_detail:
            detail += f": {report.exit_detail}"
        facts = node_facts(attempt, report.instance_id, report.exit_code, report.oom_kills)
    failed_before = sum(1 for a in since_retry(attempts) if a.end_reason is AttemptEnd.SETUP_FAILED)
    if failed_before >= job.spec.retry.setup_failures:
        return End.attempt_ended(attempt, JobStatus.FAILED, AttemptEnd.SETUP_FAILED, detail,
                                 failure=FailureCause.SETUP_FAILED, facts=facts)  # fmt: skip
    left = job.spec.retry.setup_failures - failed_before - 1
    detail += f" (placed again: {left} more setup failure(s) allowed)"
    return End.attempt_ended(attempt, JobStatus.RECOVERING, AttemptEnd.SETUP_FAILED, detail,
                             facts=facts)  # fmt: skip


def preflight_failed(attempt: AttemptRecord, gang: GangState) -> End:
    """The pool failed the gang's checks: cool it and go elsewhere. A check that every
    pool would fail alike (the checkpoint location) fails the job instead."""
    summary = "preflight failed (its figures never reached the daemon)"
    if gang.preflight is not None:
        summary = preflight_summary(gang.preflight)
    detail = f"{attempt.pool}: {summary}"
    facts = preflight_facts(attempt, gang)
    if gang.job_at_fault:
        return End.attempt_ended(attempt, JobStatus.FAILED, AttemptEnd.PREFLIGHT_FAILED, detail,
                                 failure=FailureCause.INVALID_SPEC, facts=facts)  # fmt: skip
    return End.attempt_ended(attempt, JobStatus.RECOVERING, AttemptEnd.PREFLIGHT_FAILED, detail,
                             facts=facts)  # fmt: skip


def preflight_facts(attempt: AttemptRecord, gang: GangState) -> EventFacts:
    """The node a failed preflight names (its instance id and rank) and the check it
    failed: the job's own first, as it is why the job fails, if it does."""
    figures = gang.preflight
    if figures is None:
        return EMPTY_FACTS
    failed = [(c.name, c.reason) for c in figures.checks if not c.ok]
    verdict = [(figures.failed_check, figures.failed_reason)] if figures.failed_check else []
    # The job's own first; then the verdict's; then, from an agent that did not name the
    # verdict's check, the first that failed.
    candidates = [*(f for f in (*verdict, *failed) if job_failure(*f)), *verdict, *failed]
    check = candidates[0][0] if candidates else None
    facts = EMPTY_FACTS
    rank = figures.failed_rank
    if rank is not None and 0 <= rank < len(attempt.instance_ids):
        facts = node_facts(attempt, attempt.instance_ids[rank])
    return replace(facts, check=None if check is None else str(check))


def attempt_ended(
    job: JobRecord,
    attempt: AttemptRecord,
    attempts: Sequence[AttemptRecord],
    instances: Sequence[Instance | None],
) -> Verdict:
    """How an attempt with an ended (or vanished) node ends, if it does yet."""
    ended = [i for i in instances if i is not None and i.ended]
    # EXITED without a code: the VM shut down but nobody said how the job ended.
    # That is neither success nor the user's failure: recover it.
    failed = [
        i for i in ended if i.state is InstanceState.EXITED and i.exit_code not in (None, 0)
    ]
    preempted = [i for i in ended if i.state is InstanceState.PREEMPTED]
    # A gang's other nodes stop with the noticed one (their ranks agreed to
    # checkpoint and leave); their exit is part of the preemption, not a failure.
    noticed = [i for i in instances if i is not None and i.state is InstanceState.NOTICE]
    done = [i for i in ended if i.state is InstanceState.EXITED and i.exit_code == 0]
    if failed and not preempted and not noticed:
        return command_failed(job, attempt, attempts, failed)
    if preempted or (noticed and failed):
        count = len(preempted or noticed)
        return End.attempt_ended(
            attempt, JobStatus.RECOVERING, AttemptEnd.PREEMPTED,
            f"{attempt.pool} preempted {count} of {len(instances)} node(s)",
            facts=node_facts(attempt, (preempted or noticed)[0].id),
        )  # fmt: skip
    if len(done) == len(instances):
        return End.attempt_ended(attempt, JobStatus.SUCCEEDED, AttemptEnd.SUCCEEDED, "exit 0",
                                 facts=EventFacts(exit_code=0))  # fmt: skip
    if len(done) == len(ended) and not any(i is None for i in instances):
        return Stay()  # some nodes finished first; wait for the rest
    return End.attempt_ended(attempt, JobStatus.RECOVERING, AttemptEnd.LOST,
                             f"{attempt.pool}: node(s) gone without notice",
                             facts=_lost_facts(attempt, instances))  # fmt: skip


def _lost_facts(attempt: AttemptRecord, instances: Sequence[Instance | None]) -> EventFacts:
    """The first node that is gone: no longer listed, or ended without its command's exit
    code (``instances`` are in the order of the attempt's ids)."""
    for instance_id, instance in zip(attempt.instance_ids, instances, strict=False):
        if instance is None or (instance.ended and instance.exit_code is None):
            return node_facts(attempt, instance_id)
    return EMPTY_FACTS


def command_failed(
    job: JobRecord,
    attempt: AttemptRecord,
    attempts: Sequence[AttemptRecord],
    failed: Sequence[Instance],
) -> End:
    """The job's command exited non-zero: restart it from its last checkpoint within
    ``retry.max_restarts_on_errors`` (for the codes ``retry.restart_on_exit_codes``
    covers), else fail the job.

    A restart closes the attempt ``user-failed`` and recovers: the next pass
    places the job as after a preemption, resuming from the latest checkpoint.
    """
    detail = "command " + ", ".join(f"on {i.id} exited with {i.exit_code}" for i in failed)
    retry = job.spec.retry
    exits = [i.exit_code for i in failed if i.exit_code is not None]
    first = exits[0] if exits else None
    facts = node_facts(attempt, failed[0].id, first, failed[0].oom_kills) if failed else EMPTY_FACTS
    restarted = error_exits(attempts)  # the open attempt is not counted
    if retry.max_restarts_on_errors > 0:
        if not restartable(exits, retry.restart_on_exit_codes):
            listed = ", ".join(map(str, retry.restart_on_exit_codes))
            detail += f" (not restarted: retry.restart_on_exit_codes is {listed})"
        elif restarted >= retry.max_restarts_on_errors:
            detail += f" (restarted {restarted} time(s), retry.max_restarts_on_errors)"
        else:
            detail += (f"; restart {restarted + 1} of {retry.max_restarts_on_errors}, "
                       "from the last checkpoint")  # fmt: skip
            return End.attempt_ended(attempt, JobStatus.RECOVERING, AttemptEnd.USER_FAILED,
                                     detail, exit_code=first, facts=facts)  # fmt: skip
    return End.attempt_ended(attempt, JobStatus.FAILED, AttemptEnd.USER_FAILED, detail,
                             failure=FailureCause.USER_COMMAND_FAILED,
                             exit_code=first, facts=facts)  # fmt: skip


def move(
    attempt: AttemptRecord, target: tuple[Pool, Market] | None, deadline_controlled: bool
) -> End | Stay:
    """Whether a running job should leave its pool for ``target`` (None: wait for spot).

    A job with nothing better to go to keeps running, unless its deadline plan
    says to stop and wait for spot.
    """
    if target is None and not deadline_controlled:
        return Stay()
    if target == (attempt.pool, attempt.market):
        return Stay()
    where = f"{target[0]} {target[1]}" if target is not None else "waiting for spot"
    return End.attempt_ended(
        attempt, JobStatus.RECOVERING, AttemptEnd.MIGRATED,
        f"policy moves it from {attempt.pool} {attempt.market} to {where}",
    )  # fmt: skip
