"""What on-VM agents report, kept in the store where the engine reads it.

The daemon's agent routes hand every authenticated report to
:class:`StoreReports`; the engine hands it the exits that nodes kept beside
their checkpoints (:mod:`spotd.exits`) when their reports never arrived, so
both are stored alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from spotd.core.agent_wire import (
    GPU_UTIL_THRESHOLD_PCT,
    AgentReport,
    ExitReport,
    GpuReading,
    HeartbeatReport,
    JoinReport,
    NoticeReport,
    PreflightReport,
    Roster,
    Waiting,
)
from spotd.core.contracts import Clock, Store
from spotd.core.errors import CheckpointError
from spotd.core.ranks import progress_key, ranks_json
from spotd.core.values import (
    AttemptRecord,
    Instance,
    InstanceReport,
    InstanceState,
    attempt_reports,
)
from spotd.engine.attempts import with_kept_exit
from spotd.engine.gang import roster_for
from spotd.exits import kept_exits

log = logging.getLogger(__name__)


class StoreReports:
    """Each kind of agent report merged into its instance's report in ``store``.

    ``clock`` is the engine's: with it, a heartbeat that says how far the job got
    also records when (on that clock) the node's progress last moved, which the hang
    watch reads (:mod:`spotd.engine.hang`). Without it nothing is recorded of that,
    and the job is not watched for hangs.
    """

    def __init__(self, store: Store, clock: Clock | None = None) -> None:
        self._store = store
        self._clock = clock

    def heartbeat(self, report: HeartbeatReport) -> None:
        """The agent is alive; its job's progress (its ranks' too) and a GPU sample."""
        fields: dict[str, Any] = {
            "heartbeat_at": report.at,
            "step": report.step,
            "total_steps": report.total_steps,
            "checkpoint": report.checkpoint,
        }
        if report.gpus:
            fields.update(gpu_fields(report.gpus))
        if report.ranks:
            fields["ranks"] = ranks_json(report.ranks)
        key = progress_key(report.step, report.checkpoint, report.ranks)
        if key is not None and self._clock is not None:
            # The store keeps progress_at unless the key changed (spotd.store.history).
            now = self._clock.now()
            fields.update(progress_key=key, progress_at=now, heard_at=now)
        self._store.save_report(_base(report, **fields))

    def join(self, report: JoinReport) -> Roster | Waiting:
        """A node joins its gang: the roster once the gang is whole, else how many joined."""
        # The store keeps the first ask's time: the node asks until its gang is complete.
        self._store.save_report(
            _base(report, address=report.address, joined_at=report.at,
                  ports=",".join(map(str, report.ports)))
        )  # fmt: skip
        attempt = next(
            (a for a in self._store.attempts(report.job_id) if a.seq == report.attempt), None
        )
        if attempt is None:  # authorised a moment ago: only a deleted job gets here
            return Waiting(joined=0, nodes=0)
        own = attempt_reports(attempt, self._store.reports(report.job_id))
        return roster_for(attempt, own, report.instance_id)

    def preflight(self, report: PreflightReport) -> None:
        """The gang's preflight ended on this node, with its figures."""
        passed = report.figures.passed
        self._store.save_report(
            _base(report, preflight=report.figures.model_dump_json(),
                  command_at=report.at if passed else None)
        )  # fmt: skip

    def notice(self, report: NoticeReport) -> None:
        """The provider announced it takes the node back (or may)."""
        self._store.save_report(
            _base(report, notice_at=report.at, notice_kind=report.kind,
                  notice_deadline=report.deadline)
        )

    def exited(self, report: ExitReport) -> None:
        """The job (or the agent before it) ended on this node."""
        self._store.save_report(
            _base(report, exit_code=report.exit_code, exited_at=report.at,
                  exit_phase=report.phase, exit_detail=report.detail or None,
                  oom_kills=report.oom_kills)
        )  # fmt: skip


def gpu_fields(readings: Sequence[GpuReading]) -> dict[str, Any]:
    """One GPU sample as report fields: the readings, and its share of the running sums.

    The sums follow the node's lowest GPU: one idle GPU of eight is a bottleneck
    for a synchronous job all the same.
    """
    lowest = min(r.util_pct for r in readings)
    return {
        "gpus": json.dumps([r.model_dump() for r in readings]),
        "gpu_util_sum": lowest,
        "gpu_samples": 1,
        "gpu_low_samples": int(lowest < GPU_UTIL_THRESHOLD_PCT),
    }


def _base(report: AgentReport, **fields: Any) -> InstanceReport:
    return InstanceReport(
        instance_id=report.instance_id,
        provider=report.provider,
        job_id=report.job_id,
        attempt=report.attempt,
        **fields,
    )


def with_kept_exits(
    store: Store,
    checkpoint_uri: str,
    attempt: AttemptRecord,
    instances: Sequence[Instance | None],
    reports: Sequence[InstanceReport],
) -> Sequence[Instance | None]:
    """``instances``, with the exits kept beside the checkpoints (:mod:`spotd.exits`)
    by nodes that ended without reporting one, stored as if reported.

    A job that finished while the daemon was down ended on its node all the same:
    its node's word, not the provider's view of a VM taken back later, says how.
    """
    mine = attempt_reports(attempt, reports)
    ids = attempt.instance_ids
    unheard = {iid for iid, i in zip(ids, instances, strict=True)
               if (i is None or i.ended) and _no_exit(mine.get(iid))}  # fmt: skip
    if not unheard:
        return instances
    try:
        kept = kept_exits(checkpoint_uri, attempt.job_id, attempt.seq)
    except CheckpointError as exc:
        log.warning("job %s: cannot read the exits its nodes kept: %s", attempt.job_id, exc)
        return instances
    heard = unheard & kept.keys()
    if not heard:
        return instances
    book = StoreReports(store)
    for iid in heard:
        if (notice := kept[iid].notice) is not None:
            book.notice(notice)
        book.exited(kept[iid].exit)
    log.info("job %s: exits kept by %s while no daemon heard them",
             attempt.job_id, sorted(heard))  # fmt: skip
    return [
        with_kept_exit(i or _gone(iid, attempt), kept[iid]) if iid in heard else i
        for iid, i in zip(ids, instances, strict=True)
    ]


def _no_exit(report: InstanceReport | None) -> bool:
    return report is None or report.exit_code is None


def _gone(instance_id: str, attempt: AttemptRecord) -> Instance:
    """A node the provider no longer lists, as an ended instance of its attempt."""
    return Instance(instance_id, attempt.pool, attempt.market, InstanceState.TERMINATED)
