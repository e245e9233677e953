"""What the HTTP API returns and the CLI shows: plain pydantic models built from records."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

from pydantic import BaseModel, Field, model_validator

from spotd.billing.ledger import ledger_so_far, spend_by_attempt
from spotd.core.agent_wire import GpuReading, PreflightFigures
from spotd.core.failures import exit_sentence, failure_sentence
from spotd.core.intents import IntentRecord
from spotd.core.progress import job_done_hours, reported_steps, running_rate
from spotd.core.states import ACTIVE, TERMINAL, FailureCause, JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventFacts,
    EventRecord,
    InstanceReport,
    JobRecord,
    LedgerEntry,
    Offering,
    SubmitWarning,
    SubmitWarningKind,
    attempt_reports,
)
from spotd.daemon.forecasting import ForecastView
from spotd.engine.attempts import error_exits
from spotd.engine.gang import gang_state
from spotd.market.cache import Snapshot

STATUS_WORDS: dict[str, frozenset[JobStatus]] = {
    "active": frozenset(ACTIVE),
    "ended": frozenset(TERMINAL),
    **{s.value: frozenset({s}) for s in JobStatus},
}
"""What a job listing's status filter accepts (``status=`` of ``GET /v1/jobs``, the
dashboard's): a status, or ``active`` / ``ended``."""


class GpuView(BaseModel):
    """A node's GPUs: the latest sample, and over the attempt."""

    instance_id: str
    util_pct: list[float]
    """Each GPU's utilisation in the latest sample."""
    mean_lowest_pct: float | None
    """The node's lowest GPU, averaged over its samples."""
    low_share: float | None
    """Share of samples in which some GPU was under the threshold."""
    samples: int


class GangView(BaseModel):
    """An attempt's nodes as their agents reported them."""

    addresses: list[str]
    """Every node's address, in rank order, once it joined."""
    joined: int
    started: int
    preflight: PreflightFigures | None
    step: int | None
    """The job's own step count (from rank 0's progress file)."""
    total_steps: int | None
    checkpoint: str | None
    """The last complete checkpoint the job reported."""
    gpus: list[GpuView]


class AttemptView(BaseModel):
    """One placement attempt."""

    seq: int
    provider: str
    region: str
    zone: str
    instance_type: str
    market: str
    nodes: int
    price_per_node_hour: float
    instance_ids: list[str]
    resume_from: str | None
    started_at: datetime
    running_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    cost_usd: float
    """What the attempt cost by the job's ledger, an open attempt billed up to now."""
    work_per_hour: float | None = None
    """Reference compute hours a running hour here does (None: not known)."""
    checkpoint_interval_hours: float | None = None
    saves_on_notice: bool | None = None
    exit_code: int | None = None
    """The job command's exit code that ended the attempt (its first failing node's)."""
    gang: GangView | None = None
    """What the attempt's agents reported; None where none did (or an older daemon)."""
    held_until: datetime | None = None
    """While a hold keeps the failed attempt's nodes for inspection: when it runs out."""
    released_at: datetime | None = None
    """When the nodes a hold kept were stopped."""


class HeldView(BaseModel):
    """The nodes a failed job keeps for inspection (``keep_on_failure``), while it does."""

    attempt: int
    """The seq of the attempt whose nodes they are."""
    until: datetime
    """When the hold runs out and the nodes are stopped (``spotd release`` stops them
    sooner, ``spotd retry`` too)."""
    instance_ids: list[str]
    addresses: list[str]
    """The nodes' addresses as their agents reported them, in rank order."""


class EventFactsView(BaseModel):
    """What an event says beside its cause (:class:`~spotd.core.values.EventFacts`); a
    field is None where the event says nothing of it."""

    exit_code: int | None = None
    """The exit code of the command (or setup) the event is about, in shell terms."""
    signal: int | None = None
    """The number of the signal that killed it (the exit code was 128 + it)."""
    signal_name: str | None = None
    """That signal's name (``SIGKILL``)."""
    node: str | None = None
    """The instance id of the node the event is about."""
    rank: int | None = None
    """That node's rank in its gang."""
    error_class: str | None = None
    """spotd's error class that caused the event (``CapacityError``)."""
    error_code: str | None = None
    """That error's stable code (``provider-capacity``)."""
    provider: str | None = None
    provider_code: str | None = None
    """The provider's own error code (``InsufficientInstanceCapacity``)."""
    exit_cause: str | None = None
    """How the command failed (:class:`~spotd.core.values.ExitCause`): ``not-found``,
    ``not-executable``, ``out-of-memory``, ``signal`` or ``error``."""
    oom_kills: int | None = None
    """Processes of the job the kernel's OOM killer killed while it ran (its agent's count)."""
    check: str | None = None
    """The preflight check that failed."""
    process_ranks: list[int] | None = None
    """The job's processes the event is about, by global rank (a hang's suspects)."""
    nodes: list[str] | None = None
    """Every node the event is about, ``node`` first (a hang's suspect nodes)."""
    drill: bool | None = None
    """True on the notice and the end of an attempt a drill preempted (``spotd drill``)."""
    exit_said: str | None = None
    """How the command ended, in a few words (``command not found (exit 127)``):
    :func:`spotd.core.failures.exit_sentence` of these facts."""


class EventView(BaseModel):
    """One applied transition."""

    at: datetime
    from_status: str | None
    to_status: str
    cause: str
    detail: str
    clock: str | None = None
    """What clock ``at`` is on when it is not the wall's: ``simulated clock, 600x real time``."""
    facts: EventFactsView = Field(default_factory=EventFactsView)
    """What the event says beside its cause; all None from an older daemon."""


class ProgressView(BaseModel):
    """How far a job is, as the daemon estimates it (:mod:`spotd.core.progress`).

    Hours are the reference compute hours ``deadline.compute_hours`` is stated
    in; a job that succeeded is complete. ``slack_hours`` is the time to the
    deadline less the work left at reference speed: what the job can still
    spare for waiting, changeovers and slower offerings. Both deadline figures
    are None once the job has ended. ``finish_in_hours`` is how long the work
    left takes at the rate of the attempt running now (its offering's speed,
    fabric and checkpoint writes; no preemption counted): None while nothing
    runs, and without ``compute_hours``.
    """

    done_hours: float
    compute_hours: float | None
    finish_by: datetime | None
    hours_to_deadline: float | None
    slack_hours: float | None
    finish_in_hours: float | None = None
    step: int | None = None
    """The job's own step count, where it reports one (``spotd.train``)."""
    total_steps: int | None = None
    from_job: bool = False
    """``done_hours`` is the job's own count (steps done of its total), not an estimate."""


class WarningView(BaseModel):
    """A warning given with a stored job (:class:`~spotd.core.values.SubmitWarning`)."""

    kind: str
    """:class:`~spotd.core.values.SubmitWarningKind`: ``market``, ``no-email`` or
    ``no-address``."""
    detail: str

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        # An older daemon gave its one kind of warning (the market's) as a bare string.
        if isinstance(data, str):
            return {"kind": str(SubmitWarningKind.MARKET), "detail": data}
        return data


def warning_view(warning: SubmitWarning) -> WarningView:
    """The view of a submit warning."""
    return WarningView(kind=str(warning.kind), detail=warning.detail)


class IntentView(BaseModel):
    """What a user asked of the job that its daemon has yet to do
    (:mod:`spotd.core.intents`)."""

    kind: str
    """``cancel``, ``priority``, ``release`` or ``drill``."""
    requested_at: datetime
    priority: int | None = None
    """The priority asked for (``priority`` only)."""
    node: int | None = None
    """The rank of the node to drill (``drill`` only)."""


class JobView(BaseModel):
    """A job with its attempts and what they cost."""

    id: str
    name: str
    status: str
    failure: str | None
    failure_reason: str | None = None
    """Why the failed job failed, in a few words (``command not found (exit 127)``,
    ``over budget: spent 16.39 of 15.00 USD``): :func:`spotd.core.failures.failure_sentence`
    of ``failure`` and ``failure_facts``. None for a job that did not fail."""
    failure_facts: EventFactsView | None = None
    """The facts of the event that failed the job (exit code, signal, node...)."""
    submitted_at: datetime
    updated_at: datetime
    preemptions: int
    providers: list[str]
    cost_usd: float
    """The job's cost by its ledger (:func:`spotd.billing.ledger.spend_so_far`): what its
    budget is enforced against and what reports, alerts and job-end emails show."""
    attempts: list[AttemptView]
    spec: dict[str, Any]
    progress: ProgressView | None = None
    """None from a daemon older than the field."""
    restarts: int = 0
    """Times the job was started again after its command exited non-zero."""
    max_restarts: int = 0
    """Its ``retry.max_restarts_on_errors``."""
    last_exit_code: int | None = None
    """The non-zero code of the latest error exit (its first failing node's)."""
    clock: str | None = None
    """What clock the job's times are on when it is not at real speed
    (:func:`spotd.core.clock.clock_note`);
    None on the wall's, and from a daemon older than the field."""
    waiting: str | None = None
    """Why the pending or recovering job is placed nowhere yet (``spotd.engine.waiting``);
    None once placed, before the engine's first pass over it, or from an older daemon."""
    warnings: list[WarningView] = Field(default_factory=list)
    """At submit only: what the job asks that will not happen as asked
    (:meth:`spotd.daemon.reader.Reader.submit_warnings`): no offering of the market as it
    stands can ever run it, or its ``notify`` cannot be carried out. The job is stored
    all the same."""
    asked: list[IntentView] = Field(default_factory=list)
    """What users asked of the job (a cancel, a priority) that its daemon has yet to do."""
    held: HeldView | None = None
    """The nodes the failed job keeps for inspection, while it keeps them; None otherwise
    (and from an older daemon)."""
    forecast: ForecastView | None = None
    """What the job is expected to spend from now and when it ends, with their P90
    (:mod:`spotd.daemon.forecasting`): in the view of one job that has not ended; None in
    lists, for a job of unknown size, and from an older daemon."""

    @property
    def status_ended(self) -> bool:
        """Whether the job has ended (a terminal status)."""
        return JobStatus(self.status).terminal


class JobPageView(BaseModel):
    """One page of ``GET /v1/jobs``: jobs newest first, and the cursor of the next page."""

    jobs: list[JobView]
    next: str | None
    """Pass as ``cursor`` for the next page; None on the last page."""


def gang_view(a: AttemptRecord, reports: Sequence[InstanceReport]) -> GangView | None:
    """What the attempt's agents said, None when none said anything."""
    own = attempt_reports(a, reports)
    if not own:
        return None
    state = gang_state(a, reports)
    ranked = [own[i] for i in a.instance_ids if i in own]
    progress = max(ranked, key=lambda r: r.step if r.step is not None else -1)
    return GangView(
        addresses=[r.address for r in ranked if r.address],
        joined=state.joined,
        started=state.started,
        preflight=state.preflight,
        step=progress.step,
        total_steps=progress.total_steps,
        checkpoint=progress.checkpoint,
        gpus=[g for g in map(_gpu_view, ranked) if g is not None],
    )


def _gpu_view(r: InstanceReport) -> GpuView | None:
    if not r.gpus or not r.gpu_samples:
        return None
    latest = [GpuReading.model_validate(g) for g in json.loads(r.gpus)]
    return GpuView(
        instance_id=r.instance_id,
        util_pct=[g.util_pct for g in latest],
        mean_lowest_pct=r.gpu_util_mean_pct,
        low_share=(r.gpu_low_samples or 0) / r.gpu_samples,
        samples=r.gpu_samples,
    )


def attempt_view(
    a: AttemptRecord, cost_usd: float, reports: Sequence[InstanceReport] = ()
) -> AttemptView:
    """The view of one attempt, with its cost by the job's ledger (:func:`job_view`)."""
    return AttemptView(
        seq=a.seq,
        provider=a.pool.provider,
        region=a.pool.region,
        zone=a.pool.zone,
        instance_type=a.pool.instance_type,
        market=str(a.market),
        nodes=a.nodes,
        price_per_node_hour=a.price_per_node_hour,
        instance_ids=list(a.instance_ids),
        resume_from=a.resume_from,
        started_at=a.started_at,
        running_at=a.running_at,
        ended_at=a.ended_at,
        end_reason=str(a.end_reason) if a.end_reason else None,
        exit_code=a.exit_code,
        cost_usd=round(cost_usd, 6),
        work_per_hour=a.work_per_hour,
        checkpoint_interval_hours=a.checkpoint_interval_hours,
        saves_on_notice=a.saves_on_notice,
        gang=gang_view(a, reports),
        held_until=a.held_until,
        released_at=a.released_at,
    )


def held_view(attempts: Sequence[AttemptRecord], views: Sequence[AttemptView]) -> HeldView | None:
    """The nodes a hold keeps (its attempt's ``views``, with their reported addresses), if
    one does."""
    for a, v in zip(attempts, views, strict=True):
        if a.held_until is not None:
            addresses = v.gang.addresses if v.gang is not None else []
            return HeldView(attempt=a.seq, until=a.held_until, instance_ids=list(a.instance_ids),
                            addresses=addresses)  # fmt: skip
    return None


def job_view(
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    now: datetime,
    reports: Sequence[InstanceReport] = (),
    *,
    ledger: Sequence[LedgerEntry] = (),
    asked: Sequence[IntentRecord] = (),
    zone: tzinfo = UTC,
    clock: str | None = None,
    forecast: ForecastView | None = None,
) -> JobView:
    """The view of a job and its attempts (with what their agents reported), and its
    open intents (``asked``).

    Costs are the job's ledger: ``ledger`` holds its stored lines
    (``store.ledger(job_id=...)``), the attempts they do not cover are billed
    up to ``now`` by the same rules (:func:`spotd.billing.ledger.ledger_so_far`).
    ``zone``: the zone times in its sentences are shown in; ``clock``: the
    :func:`~spotd.core.clock.clock_note` of the clock its times are on.
    """
    spend = spend_by_attempt(ledger_so_far(job, attempts, ledger, now))
    views = [attempt_view(a, spend.get(a.seq, 0.0), reports) for a in attempts]
    cost = round(sum(spend.values()), 6)
    return JobView(
        id=job.id,
        name=job.name,
        status=str(job.status),
        failure=str(job.failure) if job.failure else None,
        failure_reason=failure_sentence(job.failure, job.failure_facts, job.spec,
                                        spent_usd=cost, zone=zone) if job.failure else None,
        failure_facts=event_facts_view(job.failure_facts) if job.failure else None,
        submitted_at=job.submitted_at,
        updated_at=job.updated_at,
        preemptions=sum(a.end_reason is AttemptEnd.PREEMPTED for a in attempts),
        providers=sorted({a.pool.provider for a in attempts if a.running_at is not None}),
        cost_usd=cost,
        attempts=views,
        spec=job.spec.model_dump(mode="json"),
        progress=progress_view(job, attempts, now, reports),
        restarts=restarts_of(job, attempts),
        max_restarts=job.spec.retry.max_restarts_on_errors,
        last_exit_code=last_error_exit(attempts, reports),
        waiting=job.waiting,
        asked=[intent_view(i) for i in asked],
        held=held_view(attempts, views),
        clock=clock,
        forecast=forecast,
    )


def intent_view(intent: IntentRecord) -> IntentView:
    """The view of an open intent."""
    return IntentView(kind=str(intent.kind), requested_at=intent.requested_at,
                      priority=intent.priority, node=intent.node)  # fmt: skip


def restarts_of(job: JobRecord, attempts: Sequence[AttemptRecord]) -> int:
    """How often the job was restarted after an error exit: its ``user-failed`` attempts,
    less the last one when that failed the job."""
    exits = error_exits(attempts)
    if job.failure is FailureCause.USER_COMMAND_FAILED and exits:
        return exits - 1
    return exits


def last_error_exit(
    attempts: Sequence[AttemptRecord], reports: Sequence[InstanceReport]
) -> int | None:
    """The non-zero exit code of the latest ``user-failed`` attempt (the first failing
    node's), as the attempt keeps it, else as its agents reported it; None without one."""
    failed = [a for a in attempts if a.end_reason is AttemptEnd.USER_FAILED]
    if not failed:
        return None
    if failed[-1].exit_code is not None:
        return failed[-1].exit_code
    own = attempt_reports(failed[-1], reports)
    codes = [own[i].exit_code for i in failed[-1].instance_ids if i in own]
    return next((c for c in codes if c not in (None, 0)), None)


def progress_view(
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    now: datetime,
    reports: Sequence[InstanceReport] = (),
) -> ProgressView:
    """The job's progress (its own count where it reports one, else the daemon's
    estimate) and, while it is active with a deadline, its time left and slack."""
    deadline = job.spec.deadline
    total = deadline.compute_hours if deadline else None
    steps = reported_steps(reports)
    done = job_done_hours(job.spec, attempts, steps, now)
    if job.status is JobStatus.SUCCEEDED and total is not None:
        done = total  # its command said so; the estimate may have lagged
    finish_by = deadline.finish_by if deadline else None
    to_go = None
    if finish_by is not None and not job.status.terminal:
        to_go = (finish_by - now).total_seconds() / 3600
    slack = None if to_go is None or total is None else to_go - (total - done)
    rate = None if job.status.terminal else running_rate(attempts)
    finish_in = None if not rate or total is None else (total - done) / rate
    return ProgressView(
        done_hours=round(done, 4),
        compute_hours=total,
        finish_by=finish_by,
        hours_to_deadline=None if to_go is None else round(to_go, 4),
        slack_hours=None if slack is None else round(slack, 4),
        finish_in_hours=None if finish_in is None else round(finish_in, 4),
        step=steps[0] if steps else None,
        total_steps=steps[1] if steps else None,
        from_job=steps is not None and total is not None,
    )


def event_view(e: EventRecord, clock: str | None = None) -> EventView:
    """The view of one event; ``clock``: the :func:`~spotd.core.clock.clock_note` of
    its time."""
    return EventView(
        at=e.at,
        from_status=str(e.from_status) if e.from_status else None,
        to_status=str(e.to_status),
        cause=str(e.cause),
        detail=e.detail,
        clock=clock,
        facts=event_facts_view(e.facts),
    )


def event_facts_view(facts: EventFacts) -> EventFactsView:
    """The view of an event's facts."""
    return EventFactsView(
        exit_code=facts.exit_code, signal=facts.signal, signal_name=facts.signal_name,
        node=facts.node, rank=facts.rank, error_class=facts.error_class,
        error_code=facts.error_code, provider=facts.provider, provider_code=facts.provider_code,
        exit_cause=str(facts.exit_cause) if facts.exit_cause else None,
        oom_kills=facts.oom_kills, check=facts.check, exit_said=exit_sentence(facts),
        process_ranks=list(facts.process_ranks) if facts.process_ranks is not None else None,
        nodes=list(facts.nodes) if facts.nodes is not None else None, drill=facts.drill,
    )  # fmt: skip


class OfferingView(BaseModel):
    """One offering with both prices and its fabric."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpus_per_node: int
    gpu_memory_gb: int
    fabric: str
    gbps_per_gpu: float
    spot_price: float | None
    on_demand_price: float | None
    capacity: float | None


class ProviderMarketView(BaseModel):
    """How fresh one provider's offerings are."""

    provider: str
    offerings: int
    age_seconds: float | None
    """Seconds since the last good poll; None if there never was one."""
    stale: bool
    error: str | None
    failures: int


class MarketView(BaseModel):
    """The current market as the daemon sees it."""

    providers: list[ProviderMarketView]
    offerings: list[OfferingView]


def offering_view(o: Offering) -> OfferingView:
    """The view of one offering."""
    return OfferingView(
        provider=o.pool.provider,
        region=o.pool.region,
        zone=o.pool.zone,
        instance_type=o.pool.instance_type,
        gpu=o.gpu,
        gpus_per_node=o.gpus_per_node,
        gpu_memory_gb=o.gpu_memory_gb,
        fabric=str(o.interconnect.fabric),
        gbps_per_gpu=o.interconnect.gbps_per_gpu,
        spot_price=o.spot_price,
        on_demand_price=o.on_demand_price,
        capacity=o.capacity,
    )


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def market_view(snapshots: Mapping[str, Snapshot], now: float) -> MarketView:
    """The view of every provider's snapshot, as of wall time ``now``."""
    return MarketView(
        providers=[
            ProviderMarketView(
                provider=name,
                offerings=len(s.offerings),
                age_seconds=_rounded(s.age(now)),
                stale=s.stale,
                error=s.error,
                failures=s.failures,
            )
            for name, s in sorted(snapshots.items())
        ],
        offerings=[offering_view(o) for s in snapshots.values() for o in s.offerings],
    )
