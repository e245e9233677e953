"""Node repair, the engine's side: what judging one needs, and carrying one out.

:mod:`spotd.engine.repair` judges; :class:`Repairer` gathers what it judges on
(which nodes the provider still runs, their agents' reports, the pool's
offering, whether the policy would move the job) and carries a
:class:`~spotd.engine.verdicts.Repair` out, in an order that is safe to cut at
any point:

1. Close the attempt as preempted or lost (the job recovers), stop only its
   lost nodes, bill it.
2. Open the next attempt in the same pool and market (``node replaced``),
   resuming from the last complete checkpoint, and record the kept nodes in it
   at once: from then on they belong to an open attempt (the reaper leaves them)
   and their agents rejoin it.
3. Launch new nodes for the lost ranks only, with the new attempt's client
   token, into the running gang (:attr:`~spotd.core.values.LaunchRequest.joins`:
   the placement objects its kept nodes are in, which the closed attempt left
   standing), and record every node at its rank.

A failed launch ends the new attempt as judged for any failed launch (its kept
nodes are stopped with it) and the job is placed again as after any
preemption. A crash between two steps leaves either a recovering job (placed as
today; the reaper stops the nodes no open attempt holds) or an attempt short of
nodes, whose gang cannot assemble and so ends as lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from spotd import checkpoints
from spotd.core.contracts import Clock, EngineStore, Provider
from spotd.core.errors import CapacityError, CheckpointError, ProviderError
from spotd.core.spec import NodeFailure, deadline_controlled
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptClose,
    AttemptEnd,
    AttemptRecord,
    EventCause,
    JobRecord,
    NewAttempt,
    attempt_reports,
)
from spotd.engine import judge, repair
from spotd.engine.attempts import open_attempt
from spotd.engine.executor import Executor, on_pool
from spotd.engine.launching import gang_ref, launch_request
from spotd.engine.memory import PassMemory
from spotd.engine.placing import Placer
from spotd.engine.settings import EngineSettings, checkpoint_uri
from spotd.engine.verdicts import End, Repair, Stay, Verdict
from spotd.market.cache import MarketCache
from spotd.registry import find_kind_of

log = logging.getLogger(__name__)


class Repairer:
    """Weighs the ends of gang attempts for a repair, and carries repairs out."""

    def __init__(
        self,
        store: EngineStore,
        providers: Mapping[str, Provider],
        market: MarketCache,
        settings: EngineSettings,
        clock: Clock,
        *,
        executor: Executor,
        placer: Placer,
        memory: PassMemory,
        changed: Callable[[str], None],
    ) -> None:
        self._store = store
        self._providers = providers
        self._market = market
        self._settings = settings
        self._clock = clock
        self._executor = executor
        self._placer = placer
        self._memory = memory
        self._changed = changed

    # -- judging -----------------------------------------------------------------

    def weigh(self, job: JobRecord, verdict: Verdict, facts: judge.WatchFacts) -> Verdict:
        """``verdict`` on a watched attempt, or the repair (or the wait for one) that
        follows it instead (:func:`spotd.engine.repair.judge_repair`)."""
        end = repair.candidate(verdict, job)
        if end is None:
            return verdict
        try:
            seen = self._facts(job, facts.attempt)
        except ProviderError as exc:
            log.warning("job %s: no repair weighed, its nodes could not be read: %s", job.id, exc)
            return verdict
        return repair.judge_repair(end, facts, seen)

    def _facts(self, job: JobRecord, attempt: AttemptRecord) -> repair.RepairFacts:
        provider = self._providers[attempt.pool.provider]
        described = self._memory.described(provider, attempt.instance_ids)
        alive = frozenset(
            iid for iid in attempt.instance_ids if iid in described and not described[iid].ended
        )
        moves = job.spec.gang.on_node_failure is NodeFailure.AUTO and self._policy_moves(
            job, attempt
        )
        return repair.RepairFacts(
            alive=alive,
            reports=attempt_reports(attempt, self._memory.reports(job.id)),
            offering=self._market.find(attempt.pool),
            policy_moves=moves,
            replaces_nodes=replaces_gang_nodes(attempt.pool.provider),
        )

    def _policy_moves(self, job: JobRecord, attempt: AttemptRecord) -> bool:
        """Whether the policy's re-plan would move the job from its pool now."""
        choice = self._placer.decide(job)[2].choice
        target = None if choice is None else (choice.offering.pool, choice.market)
        return not isinstance(judge.move(attempt, target, deadline_controlled(job.spec)), Stay)

    # -- carrying out --------------------------------------------------------------

    def carry_out(self, job: JobRecord, verdict: Repair) -> JobRecord:
        """Close the attempt, stop its lost nodes, open the next one with the kept nodes
        and launch the others (see the module); the job as moved."""
        attempt = verdict.attempt
        facts = on_pool(verdict.facts, attempt.pool)
        closed = self._executor.move(job, JobStatus.RECOVERING, verdict.end, detail=verdict.detail,
                                     close=AttemptClose(attempt.id, verdict.end),
                                     facts=facts)  # fmt: skip
        self._stop(attempt, verdict.lost_ids)
        self._executor.bills.bill(closed)
        planned = self._next_attempt(job, attempt)
        if planned is None:
            self._restart(attempt, verdict.kept_ids)
            return closed
        new, step = planned
        opened_job = self._executor.move(closed, JobStatus.PROVISIONING, EventCause.NODE_REPLACED,
                                         detail=_replaced(verdict, new, step), open_=new,
                                         facts=facts)  # fmt: skip
        # Its first re-plan is due scheduling.replan_seconds from now, as for a placement.
        self._memory.replans.schedule(job.id, self._clock.now())
        opened = open_attempt(self._store.attempts(job.id))
        if opened is None:  # moved meanwhile by no one but this loop: cannot happen
            return opened_job
        self._store.set_attempt_instances(opened.id, verdict.kept_ids)
        self._launch(opened_job, replace(opened, instance_ids=verdict.kept_ids), verdict)
        return opened_job

    def _next_attempt(
        self, job: JobRecord, attempt: AttemptRecord
    ) -> tuple[NewAttempt, int | None] | None:
        """The next attempt in the attempt's pool and market, resuming from the last
        complete checkpoint (with its step); None when the checkpoints cannot be read
        (the gang restarts)."""
        try:
            latest = checkpoints.latest_complete(checkpoint_uri(job, self._settings))
        except CheckpointError as exc:
            log.warning("job %s: no repair, its checkpoints cannot be read: %s", job.id, exc)
            return None
        offering = self._market.find(attempt.pool)
        price = offering.price(attempt.market) if offering is not None else None
        new = NewAttempt(
            pool=attempt.pool,
            market=attempt.market,
            nodes=attempt.nodes,
            price_per_node_hour=price if price is not None else attempt.price_per_node_hour,
            resume_from=latest.uri if latest is not None else None,
            work_per_hour=attempt.work_per_hour,
            checkpoint_interval_hours=attempt.checkpoint_interval_hours,
            saves_on_notice=attempt.saves_on_notice,
        )
        return new, latest.step if latest is not None else None

    def _launch(self, job: JobRecord, opened: AttemptRecord, verdict: Repair) -> None:
        """Launch new nodes for the lost ranks of ``opened`` and record every node at its
        rank; a failed launch ends ``opened`` (its kept nodes stopped) and the job recovers."""
        pool = opened.pool
        provider = self._providers[pool.provider]
        missing = verdict.kept.count(None)
        try:
            offering = self._market.find(pool)
            if offering is None:
                raise ProviderError(f"{pool} is no longer offered", provider=provider.name)
            interval = opened.checkpoint_interval_hours
            if interval is None:  # an attempt stored before spotd kept it
                interval = self._placer.interval_hours(job.spec, offering, opened.market)
            request = launch_request(job, opened, offering, owner=self._settings.owner,
                                     checkpoint_uri=checkpoint_uri(job, self._settings),
                                     interval_hours=interval)  # fmt: skip
            # The new nodes join the kept ones' placement objects, not a new gang's.
            joins = gang_ref(self._store.attempts(job.id), opened, verdict.kept_ids,
                             owner=self._settings.owner)  # fmt: skip
            instances = provider.launch(replace(request, nodes=missing, joins=joins))
            if len(instances) != missing:
                raise ProviderError(f"{pool}: {len(instances)} node(s) launched, {missing} asked",
                                    provider=provider.name)  # fmt: skip
        except ProviderError as exc:
            self._launch_failed(job, opened, exc)
            return
        new_ids = iter(i.id for i in instances)
        self._store.set_attempt_instances(opened.id, [k or next(new_ids) for k in verdict.kept])
        if self._market.signals.signal(pool) is not None:
            self._market.launch_succeeded(pool)
        self._changed(job.id)

    def _launch_failed(self, job: JobRecord, opened: AttemptRecord, exc: ProviderError) -> None:
        """The new nodes could not be launched: end the repair attempt as any failed launch
        (its kept nodes are stopped with it); the next pass places the whole gang."""
        if isinstance(exc, CapacityError):
            self._market.launch_refused(opened.pool)
        verdict = judge.launch_failure(job, opened, self._store.attempts(job.id), exc)
        if not isinstance(verdict, End):
            # A throttle: waiting for the next pass would keep the kept nodes idle.
            verdict = End.attempt_ended(opened, JobStatus.RECOVERING, AttemptEnd.LAUNCH_FAILED,
                                        f"{opened.pool}: replacement not launched: {exc}",
                                        facts=judge.error_facts(opened, exc))  # fmt: skip
        log.warning("job %s: replacement node(s) not launched, the whole gang restarts: %s",
                    job.id, exc)  # fmt: skip
        self._executor.end(job, verdict)

    def _stop(self, attempt: AttemptRecord, instance_ids: tuple[str, ...]) -> None:
        """Stop these nodes of ``attempt``; a failure is left to the reaper (no open attempt
        holds them)."""
        if not instance_ids:
            return
        try:
            self._providers[attempt.pool.provider].terminate(instance_ids)
        except ProviderError as exc:
            log.warning("terminate of %s failed, the reaper retries: %s", instance_ids, exc)

    def _restart(self, attempt: AttemptRecord, kept: tuple[str, ...]) -> None:
        """No repair after all: stop the nodes that were to be kept and the attempt's
        placement objects; the recovering job is placed as after any preemption."""
        self._stop(attempt, kept)
        self._executor.release(attempt)


def replaces_gang_nodes(provider: str) -> bool:
    """Whether the provider named ``provider`` can add nodes to a running gang."""
    kind = find_kind_of(provider)
    return kind is not None and kind.replaces_gang_nodes


def _replaced(verdict: Repair, new: NewAttempt, step: int | None) -> str:
    """The ``node replaced`` event's detail."""
    kept, lost = verdict.kept, verdict.lost_ids
    detail = (
        f"{new.pool} {new.market}: {repair.nodes_said(kept, None)} ({', '.join(lost)}) "
        f"replaced by {len(lost)} new node(s); {repair.nodes_said(kept, 'kept')} "
        f"({', '.join(verdict.kept_ids)}) kept"
    )
    if step is not None:
        detail += f", resume from step {step}"
    return detail
