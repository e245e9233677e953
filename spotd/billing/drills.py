"""Drills in reports: which preemptions a user asked for, and what resuming from them cost.

A drill (``spotd drill``) preempts a node through its provider's own notice, so its
attempt ends ``preempted`` like a market's. A report that counted it so would
call a pool unreliable for a preemption the team asked for, and hide what the
drill cost. Here a drilled attempt is told from the market's by its job's
events (:func:`spotd.core.drill.drilled`), and a drill's cost is what resuming
from it took: the changeover (launch to running) of the attempt that followed,
as the ledger bills it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from spotd.core.contracts import JobStore
from spotd.core.drill import drilled
from spotd.core.values import AttemptEnd, AttemptRecord, LedgerEntry

__all__ = ["Drilled", "drilled_attempts", "resume_entries"]

Drilled = frozenset[tuple[str, int]]
"""(job id, attempt seq) of the attempts a drill ended."""


def drilled_attempts(store: JobStore, attempts: Mapping[str, Sequence[AttemptRecord]]) -> Drilled:
    """The attempts among ``attempts`` (by job id) that a drill ended; only the jobs
    with a preempted attempt have their events read."""
    found: set[tuple[str, int]] = set()
    for job_id, theirs in attempts.items():
        preempted = [a for a in theirs if a.end_reason is AttemptEnd.PREEMPTED]
        if not preempted:
            continue
        events = store.events(job_id)
        found.update((job_id, a.seq) for a in preempted if drilled(a, events))
    return frozenset(found)


def resume_entries(
    entries: Collection[LedgerEntry], drilled_seqs: Collection[tuple[str, int]]
) -> list[LedgerEntry]:
    """The changeover lines of the attempts that resumed from a drill (the next attempt of
    each drilled one): what the drills cost."""
    return [
        e for e in entries
        if e.kind == "changeover" and (e.job_id, e.attempt - 1) in drilled_seqs
    ]  # fmt: skip
