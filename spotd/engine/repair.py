"""When one node of a running gang goes: replace it and keep the others (pure judgement).

A gang runs on all its nodes or none, so a node preempted or lost ends the
attempt. Before, that meant a whole new gang: every node stopped and billed a
new boot, wherever the policy placed it. Most of the time the healthy nodes
could simply go on with a new peer:

1. The healthy nodes' agents *stand by* once their command has exited
   (:mod:`spotd.core.rejoin`): on a preemption notice every rank of
   ``spotd.train`` agrees to checkpoint and leave at the same step, so the
   survivors' commands exit cleanly with the noticed one.
2. The judge ends the attempt as it always did (:func:`spotd.engine.judge.attempt_ended`);
   this module then weighs that end (:func:`judge_repair`) and may turn it into a
   :class:`~spotd.engine.verdicts.Repair`: the attempt closes as preempted or
   lost, only the lost nodes are stopped, and the next attempt opens in the
   same pool and market (same zone; on a cloud, the same placement object)
   with the kept nodes at their ranks and new nodes launched for the others
   (:mod:`spotd.engine.repairing`). The new attempt has its own client token
   and rendezvous id; every node joins its gang and passes its preflight as a
   new gang does, and the job resumes from the last complete checkpoint.
3. Should that launch fail (no capacity), the kept nodes are stopped too and
   the job is placed as after any preemption.

A gang whose preflight failed on one node's own checks (its GPUs, driver or torch,
or its links under the fabric's floor: :data:`NODE_CHECKS`), which the verdict
names, is repaired the same way before it ever ran: that node is the host's fault,
not the pool's, so it alone is replaced and the nodes that passed stand by and keep
their ranks. A verdict that names no node (a timeout, a bandwidth under the floor
that no one node's links explain: the gang's) restarts the gang.

``[gang] on_node_failure`` (:class:`~spotd.core.spec.NodeFailure`) says what a job
wants: ``replace`` whenever it can; ``restart`` and ``move`` never (``move`` also
keeps the next placement out of the pool, :func:`moved_from`); ``auto`` (the
default) replaces when that is the cheaper way on, by a simple rule: the pool
still sells the node (offered in the attempt's market, its spot capacity signal
not zero) and the policy would not move the job anyway (its re-plan would stay).
Both ways resume from the same checkpoint; replacing boots only the lost nodes
while the kept ones wait, restarting boots them all, so replacing never costs
more in the same pool, and restarting elsewhere pays only where the policy
moves the job regardless.

A node is kept only if its provider still runs it, it had no notice of its own,
and its agent stands by (its command exited and it asked what next since). The
survivors of a preemption get :data:`STANDBY_WAIT_SECONDS` from the notice (or
the lost node's end) to stand by; a node lost without notice is replaced only if
the others already stand by, as their commands would otherwise fail at their next
collective as the user's failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from spotd.core.agent_wire import PreflightCheckName
from spotd.core.rejoin import RejoinStep
from spotd.core.spec import JobSpec, NodeFailure
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    Instance,
    InstanceReport,
    InstanceState,
    JobRecord,
    JobStatus,
    Market,
    Offering,
    Pool,
)
from spotd.engine.attempts import open_attempt
from spotd.engine.judge import WatchFacts
from spotd.engine.verdicts import Checkpoint, End, Repair, Stay, Verdict

STANDBY_WAIT_SECONDS = 180.0
"""Real seconds the healthy nodes of a preempted gang have, from the notice (or the lost
node's end), to checkpoint, exit and stand by; past them the gang restarts."""

REPAIRABLE = frozenset({AttemptEnd.PREEMPTED, AttemptEnd.LOST})
"""Attempt ends a repair may follow: a node went (with or without notice)."""
NODE_CHECKS = frozenset({
    PreflightCheckName.GPU_DRIVER,
    PreflightCheckName.GPU_COUNT,
    PreflightCheckName.GPU_MODEL,
    PreflightCheckName.GPU_MEMORY,
    PreflightCheckName.JOB_PYTHON,
    PreflightCheckName.TORCH,
    PreflightCheckName.TORCH_GPUS,
    PreflightCheckName.NODE_LINK,
})  # fmt: skip
"""Preflight checks of one node's own (its GPUs, its driver, the job's Python and torch on
it, its links to its neighbours): failed by the pool's node, not by the job, they are that
host's, and a new node in its place may pass them."""
_STOOD_BY_AFTER = frozenset({None, "command", "preflight"})

_WANTS_REPAIR = frozenset({NodeFailure.AUTO, NodeFailure.REPLACE})
_GOING = frozenset({InstanceState.NOTICE, InstanceState.PREEMPTED})


class Refusal(StrEnum):
    """Why the lost nodes of a gang are not replaced, said in the attempt's end event."""

    PROVIDER = "its provider cannot add a node to a running gang yet"
    NOT_OFFERED = "the pool no longer sells the node in this market"
    NO_CAPACITY = "the pool shows no spot capacity now"
    POLICY_MOVES = "the policy would move the job anyway"
    NOT_STANDING_BY = "the other node(s) did not stand by for a new peer"


@dataclass(frozen=True, slots=True)
class RepairFacts:
    """What the engine adds to a watched attempt's facts when a node of its gang went."""

    alive: frozenset[str]
    """The attempt's instances the provider shows not ended."""
    reports: Mapping[str, InstanceReport]
    """The attempt's own reports, by instance id."""
    offering: Offering | None
    """The attempt's pool as the market offers it now; None: not offered."""
    policy_moves: bool = False
    """Whether the policy's re-plan would move the job now (weighed for ``auto`` only)."""
    replaces_nodes: bool = True
    """Whether the attempt's provider can add nodes to a running gang
    (:attr:`spotd.core.kinds.ProviderKind.replaces_gang_nodes`)."""


def candidate(verdict: Verdict, job: JobRecord) -> End | None:
    """``verdict`` when it is an end a repair may follow, the job recovering and not asking
    to restart or move: a gang attempt that ran, preempted or lost, or whose preflight
    failed on one named node's own checks (:func:`node_at_fault`). (Any other gang that
    never ran has nothing to keep: its nodes are still assembling.)"""
    if not isinstance(verdict, End) or verdict.attempt is None or verdict.attempt.nodes < 2:
        return None
    if verdict.status is not JobStatus.RECOVERING:
        return None
    if node_at_fault(verdict) is None and (
        verdict.attempt.running_at is None or verdict.end not in REPAIRABLE
    ):
        return None
    return verdict if job.spec.gang.on_node_failure in _WANTS_REPAIR else None


def node_at_fault(end: End) -> str | None:
    """The node whose own preflight checks failed the attempt ``end`` closes, as the
    verdict names it; None for any other end, or a preflight the gang as a whole failed."""
    if end.end is not AttemptEnd.PREFLIGHT_FAILED or end.facts.node is None:
        return None
    return end.facts.node if end.facts.check in NODE_CHECKS else None


def judge_repair(end: End, facts: WatchFacts, seen: RepairFacts) -> Verdict:
    """What follows ``end`` (a :func:`candidate`): a repair, a wait for the healthy nodes
    to stand by, or ``end`` itself (the whole gang restarts), said why in its detail."""
    attempt = facts.attempt
    faulty = node_at_fault(end)
    kept = tuple(
        iid if healthy(iid, instance, seen) and iid != faulty else None
        for iid, instance in zip(attempt.instance_ids, facts.instances, strict=True)
    )
    if all(k is None for k in kept) or None not in kept:
        return end  # nothing left to keep, or nothing lost
    refusal = market_refusal(facts.job, attempt, seen)
    if refusal is not None:
        return _refused(end, refusal)
    if not all(standing_by(seen.reports.get(k)) for k in kept if k is not None):
        if _may_wait(end, facts, seen, kept):
            if facts.job.status is JobStatus.RUNNING:
                # The market took the node before the daemon saw its notice: the others
                # checkpoint and leave as on one, and the job says so.
                return Checkpoint(attempt, facts=end.facts)
            return Stay()
        return _refused(end, Refusal.NOT_STANDING_BY)
    return Repair(attempt, end.end or AttemptEnd.PREEMPTED, _repair_detail(end, kept),
                  end.facts, kept)  # fmt: skip


def healthy(iid: str, instance: Instance | None, seen: RepairFacts) -> bool:
    """A node that may be kept: its provider still runs it and it had no notice of its own
    (a node under notice is going, whatever its agent does)."""
    if instance is None or iid not in seen.alive or instance.state in _GOING:
        return False
    report = seen.reports.get(iid)
    return report is None or report.notice_at is None or report.notice_kind == "rebalance"


def standing_by(report: InstanceReport | None) -> bool:
    """Whether the node's agent stands by: its command exited (or its preflight failed on
    another node), and it asked what next since (the ask is its heartbeat,
    :mod:`spotd.core.rejoin`)."""
    if report is None or report.exit_code is None or report.exited_at is None:
        return False
    if report.exit_phase not in _STOOD_BY_AFTER:
        return False
    return report.heartbeat_at is not None and report.heartbeat_at > report.exited_at


def market_refusal(job: JobRecord, attempt: AttemptRecord, seen: RepairFacts) -> Refusal | None:
    """Why the pool cannot take the lost nodes back now, or why ``auto`` would rather not;
    None: it can."""
    if not seen.replaces_nodes:
        return Refusal.PROVIDER
    offering = seen.offering
    if offering is None or offering.price(attempt.market) is None:
        return Refusal.NOT_OFFERED
    if attempt.market is Market.SPOT and offering.capacity is not None and offering.capacity <= 0:
        return Refusal.NO_CAPACITY
    if job.spec.gang.on_node_failure is NodeFailure.AUTO and seen.policy_moves:
        return Refusal.POLICY_MOVES
    return None


def _may_wait(end: End, facts: WatchFacts, seen: RepairFacts, kept: Sequence[str | None]) -> bool:
    """Whether the healthy nodes of a preempted gang, or of one whose preflight failed on
    one node, still have time to stand by."""
    if end.end is not AttemptEnd.PREEMPTED and node_at_fault(end) is None:
        return False
    since = _went_at(facts, seen, kept)
    if since is None:
        return False
    waited = (facts.now - since).total_seconds()
    # The wait is real seconds; the engine's clock may run faster (simulator).
    return waited < STANDBY_WAIT_SECONDS / facts.real_per_second


def _went_at(facts: WatchFacts, seen: RepairFacts, kept: Sequence[str | None]) -> datetime | None:
    """When the lost nodes went: the latest notice, exit or end known of them."""
    times: list[datetime] = []
    for iid, instance, keep in zip(facts.attempt.instance_ids, facts.instances, kept,
                                   strict=True):  # fmt: skip
        if keep is not None:
            continue
        report = seen.reports.get(iid)
        if report is not None:
            times += [t for t in (report.notice_at, report.exited_at) if t is not None]
        if instance is not None and instance.ended_at is not None:
            times.append(instance.ended_at)
    return max(times, default=None)


def _refused(end: End, why: Refusal) -> End:
    return replace(end, detail=f"{end.detail}; the whole gang restarts: {why}")


def _repair_detail(end: End, kept: Sequence[str | None]) -> str:
    return f"{end.detail}; {nodes_said(kept, None)} replaced, {nodes_said(kept, 'kept')} kept"


def nodes_said(kept: Sequence[str | None], which: str | None) -> str:
    """``node 1`` or ``nodes 0, 2``: the ranks that are replaced (``which`` None) or kept."""
    ranks = [str(r) for r, k in enumerate(kept) if (k is None) == (which is None)]
    return ("node " if len(ranks) == 1 else "nodes ") + ", ".join(ranks)


# -- the standing-by node's side ----------------------------------------------------


def next_step(
    status: JobStatus, attempts: Sequence[AttemptRecord], asked: int, instance_id: str
) -> tuple[RejoinStep, AttemptRecord | None]:
    """What the node ``instance_id``, standing by after its command in attempt ``asked``,
    is to do: rejoin the job's open attempt (given) when that keeps it, wait while the
    daemon has not decided, else leave."""
    if status.terminal:
        return RejoinStep.LEAVE, None
    current = open_attempt(attempts)
    if current is not None and current.seq > asked:
        if instance_id in current.instance_ids:
            return RejoinStep.REJOIN, current
        # Launched without this node, or not launched yet.
        return (RejoinStep.LEAVE if current.instance_ids else RejoinStep.WAIT), None
    if current is not None and current.seq == asked:
        return RejoinStep.WAIT, None  # the attempt is not judged yet
    if any(a.seq > asked for a in attempts) or current is not None:
        return RejoinStep.LEAVE, None
    # Closed, and the next not opened yet (a repair opens it next): ask again.
    return RejoinStep.WAIT, None


# -- ``move``: the next placement leaves the pool ------------------------------------


def moved_from(spec: JobSpec, attempts: Sequence[AttemptRecord]) -> Pool | None:
    """The pool a ``move`` job leaves: that of its last attempt that ran, when a node of
    its gang went there (preempted or lost); None for any other job, or once it ran again."""
    if spec.gang.on_node_failure is not NodeFailure.MOVE:
        return None
    ran = [a for a in attempts if a.running_at is not None]
    if not ran:
        return None
    last = ran[-1]
    if last.open or last.nodes < 2 or last.end_reason not in REPAIRABLE:
        return None
    return last.pool
