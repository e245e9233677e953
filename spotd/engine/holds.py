"""Debug holds: the nodes of the attempt that failed a job, kept for inspection.

A job with ``keep_on_failure`` (job.toml) that fails keeps the nodes of its
failing attempt running for that long, in real time: the attempt closes as
usual, but with a ``held_until`` (written in the same transaction as the
failure, :func:`hold_until`), and the executor leaves its nodes alone. While
the hold is in force the reaper does not count them as orphans, ``spotd
status JOB`` and the dashboard show their addresses, and the ledger bills them
as any node (a held attempt is priced up to now; :mod:`spotd.billing.ledger`).

The hold's keeper (:class:`HoldKeeper`) ends it: at its expiry, on ``spotd
release JOB`` (a ``release`` intent), or at once after ``spotd retry`` cut it
short (a retry reuses no kept node, :mod:`spotd.engine.retrying`). It stops
the nodes, records the end (``released_at``, a ``nodes released`` event) and
bills the job again, now with the hold's time. Each daemon keeps the holds of
the jobs it held, every pass; the leader, when it reaps, those of every
owner, so a hold outlives no dead daemon by more than its expiry.

A job that failed over its budget keeps nothing: its nodes would spend past it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from spotd.core.contracts import Clock, EngineStore
from spotd.core.errors import SpotdError, StoreUnavailable
from spotd.core.intents import IntentKind
from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import AttemptRecord, JobRecord
from spotd.engine.bills import Bills
from spotd.engine.verdicts import End

log = logging.getLogger(__name__)


def hold_until(job: JobRecord, verdict: End, clock: Clock) -> datetime | None:
    """When the hold of the nodes ``verdict`` fails the job on ends (engine time), or None:
    the job does not fail, asks for no hold (``keep_on_failure``), has no node to keep, or
    fails over its budget."""
    keep = job.spec.keep_on_failure
    attempt = verdict.attempt
    if keep is None or verdict.status is not JobStatus.FAILED:
        return None
    if attempt is None or not attempt.instance_ids:
        return None
    if verdict.failure is FailureCause.OVER_BUDGET:
        return None
    # keep_on_failure is real time, a person's: on a fast simulated clock it is longer.
    engine_seconds = keep.total_seconds() / clock.seconds_to_real(1.0)
    return clock.now() + timedelta(seconds=engine_seconds)


def held_note(job: JobRecord, until: datetime | None) -> str:
    """What the failure's event adds about the hold, if the nodes are kept."""
    keep = job.spec.keep_on_failure
    if until is None or keep is None:
        return ""
    return (f"; its nodes are kept for inspection for {keep.total_seconds() / 60:g} min "
            f"(keep_on_failure; `spotd release {job.id}` stops them sooner)")  # fmt: skip


def keeps_nodes(attempt: AttemptRecord) -> bool:
    """Whether a hold keeps the attempt's nodes (in force, or run out and not ended by
    the keeper yet): the reaper leaves them to the keeper."""
    return attempt.held_until is not None


class HoldKeeper:
    """Ends the holds that are due: stops their nodes, records it, bills the job.

    ``terminate`` stops a closed attempt's nodes and deletes its placement objects
    (:meth:`spotd.engine.executor.Executor.terminate`); ``bills`` are the engine's.
    """

    def __init__(
        self,
        store: EngineStore,
        bills: Bills,
        terminate: Callable[[AttemptRecord], None],
        clock: Clock,
    ) -> None:
        self._store = store
        self._bills = bills
        self._terminate = terminate
        self._clock = clock

    def keep(self, owners: Sequence[str]) -> int:
        """End the holds of the jobs ``owners`` hold or last held that ran out, were
        released (``spotd release``) or were cut by a retry; return how many ended.

        One indexed read of the holds in force per call (none, most passes), and one of
        their jobs' open intents when there are any.
        """
        held = self._store.held_attempts(owners)
        if not held:
            return 0
        now = self._clock.now()
        asked = self._store.open_intents({a.job_id for a in held})
        ended = 0
        for attempt in held:
            released = any(i.kind is IntentKind.RELEASE for i in asked.get(attempt.job_id, ()))
            until = attempt.held_until
            if until is None or (not released and now < until):
                continue
            try:
                ended += self._end(attempt, now, released=released)
            except StoreUnavailable:
                raise  # the database's fault: the caller says so once
            except SpotdError as exc:
                log.warning("hold of %s attempt %d not ended, the next pass retries: %s",
                            attempt.job_id, attempt.seq, exc)  # fmt: skip
        return ended

    def _end(self, attempt: AttemptRecord, now: datetime, *, released: bool) -> bool:
        """Stop the kept nodes (the reaper retries a stop that fails once the hold is
        ended), record the end, and bill the job with the hold's time."""
        job = self._store.get_job(attempt.job_id)
        if released:
            why = "released by `spotd release`"
        elif not job.status.terminal:
            why = "the job was retried"
        else:
            why = "keep_on_failure ran out"
        self._terminate(attempt)
        detail = f"attempt {attempt.seq}: {len(attempt.instance_ids)} node(s) stopped, {why}"
        if not self._store.end_hold(attempt.id, at=now, detail=detail):
            return False  # another daemon ended it first
        log.info("job %s: %s", job.id, detail)
        self._bills.bill(job)
        if job.status.terminal:
            self._bills.forget(job.id)
        return True
