"""Carries verdicts out: the only code of the loop that writes a job's transitions and
calls providers to launch, stop or release its nodes.

Every change of status goes through :func:`spotd.core.states.transition`
(a compare-and-set that writes its event in the same transaction). An attempt
is committed before its launch, and the launch carries the attempt's client
token, so repeating a step after a crash at any point starts nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from spotd.core.contracts import Clock, EngineStore, Provider
from spotd.core.errors import CapacityError, ProviderError, StoreError
from spotd.core.intents import IntentOutcome
from spotd.core.orders import STOP_WHY
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus, Transition, transition
from spotd.core.values import (
    EMPTY_FACTS,
    AttemptClose,
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventFacts,
    FailureCause,
    JobRecord,
    Market,
    NewAttempt,
    Offering,
    Pool,
)
from spotd.engine import judge
from spotd.engine.attempts import open_attempt
from spotd.engine.bills import Bills
from spotd.engine.drills import carry_out_drill
from spotd.engine.holds import held_note, hold_until
from spotd.engine.launching import launch_request
from spotd.engine.placements import attempt_tags, gang_chain, release
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, EngineSettings, checkpoint_uri
from spotd.engine.verdicts import (
    Checkpoint,
    Defer,
    Drill,
    End,
    Launch,
    Moot,
    Place,
    Reprioritise,
    Running,
    Verdict,
    Wait,
    Yield,
)
from spotd.market.cache import MarketCache

log = logging.getLogger(__name__)

IntervalHours = Callable[[JobSpec, Offering, Market], float]


class Executor:
    """Applies verdicts through the store and the providers."""

    def __init__(
        self,
        store: EngineStore,
        providers: Mapping[str, Provider],
        market: MarketCache,
        clock: Clock,
        settings: EngineSettings,
        *,
        bills: Bills,
        interval_hours: IntervalHours,
        changed: Callable[[str], None],
    ) -> None:
        self._store = store
        self._providers = providers
        self._market = market
        self._clock = clock
        self._settings = settings
        self.bills = bills
        self._interval_hours = interval_hours
        self._changed = changed
        """Told of every job a transition or a launch changed (the pass reads it back)."""
        self.on_end: Callable[[JobRecord], None] | None = None
        """Called with a job that just reached a terminal status (e.g. the mailer)."""

    def carry_out(self, job: JobRecord, verdict: Verdict) -> JobRecord | None:
        """Apply ``verdict`` to ``job``; the job as moved, None if it did not move.
        (:class:`~spotd.engine.verdicts.Wait` and
        :class:`~spotd.engine.verdicts.Replan` are the loop's own to apply.)"""
        match verdict:
            case End():
                return self.end(job, verdict)
            case Place():
                return self.place(job, verdict)
            case Launch():
                self.launch(job, verdict.attempt)
            case Running():
                self._store.mark_attempt_running(verdict.attempt.id, at=self._clock.now())
                self._changed(job.id)
                return self.move(job, JobStatus.RUNNING, EventCause.RUNNING,
                                 detail=verdict.detail,
                                 facts=on_pool(EMPTY_FACTS, verdict.attempt.pool))  # fmt: skip
            case Checkpoint():
                return self.move(job, JobStatus.CHECKPOINTING, EventCause.NOTICE,
                                 detail=str(verdict.attempt.pool),
                                 facts=on_pool(verdict.facts, verdict.attempt.pool))  # fmt: skip
            case Yield():
                return self.move(job, JobStatus.CHECKPOINTING, EventCause.YIELDING,
                                 detail=f"{verdict.attempt.pool}: stops as on a preemption "
                                 f"notice: {STOP_WHY[verdict.reason]}",
                                 facts=on_pool(EMPTY_FACTS, verdict.attempt.pool))  # fmt: skip
            case Reprioritise():
                return self.reprioritise(job, verdict)
            case Drill():
                carry_out_drill(self._store, self._providers[verdict.attempt.pool.provider],
                                verdict, at=self._clock.now())  # fmt: skip
                self._changed(job.id)
            case Moot():
                self._store.settle_intent(verdict.intent, IntentOutcome.MOOT, at=self._clock.now())
                log.info("job %s: %s intent moot: %s", job.id, verdict.intent.kind, verdict.why)
            case Defer():
                log.warning("job %s: %s", job.id, verdict.why)
            case _:
                pass
        return None

    def move(
        self,
        job: JobRecord,
        new: JobStatus,
        cause: EventCause | AttemptEnd,
        *,
        detail: str = "",
        failure: FailureCause | None = None,
        open_: NewAttempt | None = None,
        close: AttemptClose | None = None,
        facts: EventFacts = EMPTY_FACTS,
    ) -> JobRecord:
        """Apply one transition (compare-and-set, with its event and the event's facts)."""
        change = Transition(job_id=job.id, expected=job.status, new=new, cause=cause,
                            detail=detail, failure=failure, open_attempt=open_,
                            close_attempt=close, facts=facts)  # fmt: skip
        moved = transition(self._store, change, now=self._clock.now())
        self._changed(job.id)
        # A job that ended is announced by settle, once its ledger is final.
        log.info("job %s: %s -> %s (%s) %s", job.id, job.status, new, cause, detail)
        return moved

    def end(self, job: JobRecord, verdict: End) -> JobRecord:
        """Close the verdict's attempt, move the job, then stop the attempt's nodes and bill.
        The nodes of an attempt that fails a job with ``keep_on_failure`` are kept instead,
        until the hold's keeper stops them (:mod:`spotd.engine.holds`)."""
        attempt = verdict.attempt
        close = None
        facts = verdict.facts
        held = hold_until(job, verdict, self._clock)
        if attempt is not None:
            close = AttemptClose(attempt.id, verdict.end or AttemptEnd.CANCELLED,
                                 exit_code=verdict.exit_code, held_until=held)  # fmt: skip
            facts = on_pool(facts, attempt.pool)
        moved = self.move(job, verdict.status, verdict.cause,
                          detail=verdict.detail + held_note(job, held),
                          failure=verdict.failure, close=close, facts=facts)  # fmt: skip
        # Gang: one lost node ends the attempt; stop the rest. The reaper covers a
        # crash between the transition and this call.
        self.settle(moved, attempt if held is None else None)
        return moved

    def place(self, job: JobRecord, verdict: Place) -> JobRecord:
        """Open the attempt (the job moves to provisioning), then launch it."""
        moved = self.move(job, JobStatus.PROVISIONING, EventCause.PLACED, detail=verdict.detail,
                          open_=verdict.attempt,
                          facts=on_pool(EMPTY_FACTS, verdict.attempt.pool))  # fmt: skip
        opened = open_attempt(self._store.attempts(job.id))
        if opened is not None:
            self.launch(moved, opened)
        return moved

    def launch(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Launch the attempt's nodes and record them; a failed launch is judged
        (:func:`spotd.engine.judge.launch_failure`) and that verdict carried out."""
        provider = self._providers[attempt.pool.provider]
        offering = self._market.find(attempt.pool)
        if offering is None:
            raise ProviderError(f"{attempt.pool} is no longer offered", provider=provider.name)
        interval = attempt.checkpoint_interval_hours
        if interval is None:  # placed by a version that did not keep it
            interval = self._interval_hours(job.spec, offering, attempt.market)
        request = launch_request(job, attempt, offering, owner=self._settings.owner,
                                 checkpoint_uri=checkpoint_uri(job, self._settings),
                                 interval_hours=interval)  # fmt: skip
        try:
            instances = provider.launch(request)
        except ProviderError as exc:
            self._launch_failed(job, attempt, exc)
            return
        if self._market.signals.signal(attempt.pool) is not None:
            # A success only moves a signal the pool has: without one it would store
            # "no signal" again, and the market would rebuild its whole offering index
            # for nothing (once per launch, which made a pass placing 10,000 jobs
            # take many minutes).
            self._market.launch_succeeded(attempt.pool)
        self._store.set_attempt_instances(attempt.id, [i.id for i in instances])
        self._changed(job.id)

    def _launch_failed(self, job: JobRecord, attempt: AttemptRecord, exc: ProviderError) -> None:
        verdict = judge.launch_failure(job, attempt, self._store.attempts(job.id), exc)
        if isinstance(exc, CapacityError):
            self._market.launch_refused(attempt.pool)
        if isinstance(verdict, End):
            self.end(job, verdict)
        else:
            self.carry_out(job, verdict)

    def wait(self, job: JobRecord, verdict: Wait) -> bool:
        """Record why the job waits, with an event; whether it was written (not when the
        record already says the same, or the job moved meanwhile)."""
        if not self._store.set_waiting(job.id, job.status, verdict.reason.text,
                                       now=self._clock.now(), cause=verdict.cause):  # fmt: skip
            return False
        self._changed(job.id)
        log.info("job %s waits: %s", job.id, verdict.reason.text)
        return True

    def reprioritise(self, job: JobRecord, verdict: Reprioritise) -> JobRecord:
        """Give the job the priority a user asked for (with an event, the intent settled);
        the next pass orders it by the new one."""
        moved = self._store.apply_priority(verdict.intent, at=self._clock.now())
        self._changed(job.id)
        log.info("job %s: priority %s -> %s", job.id, job.spec.priority, moved.spec.priority)
        return moved

    def settle(self, job: JobRecord, closed: AttemptRecord | None) -> None:
        """After a transition that closed ``closed`` or ended the job: stop the closed
        attempt's nodes, bill the job, and then, for a job that ended, call ``on_end``:
        its ledger is final, so the job-end email carries the job's cost."""
        if closed is not None:
            self.terminate(closed)
        # An attempt that never got nodes (its launch failed) adds nothing to the bill.
        if job.status.terminal or (closed is not None and closed.instance_ids):
            self.bills.bill(job)
        if job.status.terminal:
            self.announce_end(job)
            self.bills.forget(job.id)

    def announce_end(self, job: JobRecord) -> None:
        """Tell ``on_end`` of a job whose ledger is final."""
        if self.on_end is not None:
            self.on_end(job)

    def terminate(self, attempt: AttemptRecord) -> None:
        """Stop a closed attempt's nodes, then delete its placement objects."""
        provider = self._providers[attempt.pool.provider]
        if attempt.instance_ids:
            try:
                provider.terminate(attempt.instance_ids)
            except ProviderError as exc:
                log.warning("terminate of %s failed, the reaper retries: %s",
                            attempt.instance_ids, exc)  # fmt: skip
                return  # its placement still holds the nodes: the reaper deletes both
        self.release(attempt)

    def release(self, attempt: AttemptRecord) -> None:
        """Delete the placement objects of the attempt's gang (a placement group, say): its
        own, and, for a gang repaired before, those of the attempts it kept nodes of, in
        which its nodes were launched (:func:`spotd.engine.placements.gang_chain`)."""
        provider = self._providers[attempt.pool.provider]
        try:
            chain = gang_chain(self._store.attempts(attempt.job_id), attempt)
        except StoreError as exc:
            log.warning("job %s: only its last placement released, its attempts could not "
                        "be read (the reaper deletes the others): %s", attempt.job_id, exc)
            chain = [attempt]
        for held in chain:
            tags = attempt_tags(held.job_id, held.seq, job_tag=TAG_JOB, attempt_tag=TAG_ATTEMPT)
            release(provider, held, tags)


def on_pool(facts: EventFacts, pool: Pool) -> EventFacts:
    """``facts`` of an event about an attempt in ``pool``: its provider named, unless the
    facts name one already (the provider that raised an error)."""
    return facts if facts.provider is not None else replace(facts, provider=pool.provider)
