"""One node of the in-process simulated market: boot, run, notice, end, on a test's clock.

It lives what a ``spotd_sim.vm`` process lives (:mod:`spotd_sim.vm`), in the
same records (:class:`~spotd_sim.records.InstanceSpec`,
:class:`~spotd_sim.records.VmStatus`), but only when asked: :meth:`catch_up`
plays every event up to a moment, each at its own simulated time, and nothing
happens between two calls. So a run depends on the moments a test sets and
on nothing else: no process, no thread, no sleep.

1. It boots for the spec's ``boot_seconds`` (a stalled node never finishes);
   a spot node whose capacity goes meanwhile ends ``preempted``.
2. Its workload runs (:mod:`spotd_sim.workload`) until it ends by itself
   (``exited``; ``preempted`` for a non-zero exit during a notice), the node
   is terminated (``terminated``, with the job's exit code), or, for spot,
   the market takes the capacity back: state ``notice`` from that moment,
   with ``kill_at`` the notice's end, and ``preempted`` with exit code -9 at
   ``kill_at`` if the job is still running then.
3. A node of a gang of several (``SPOTD_NUM_NODES``) whose job ended with no
   notice on it *stands by*, as the agent does on a process node
   (:mod:`spotd.core.rejoin`), where its provider was given a way to ask
   (:class:`Rejoin`): it stays up and asks at every catch-up; told ``rejoin``, a
   new workload runs for the job's next attempt from that moment, told
   ``leave`` (or after ``wait_seconds``) the node ends ``exited``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from spotd.core.rejoin import RejoinAnswer, RejoinAsk, RejoinStep
from spotd.core.values import Instance, InstanceState, Market, NodeUsage

from .billing import usage_of
from .market import SimMarket
from .records import InstanceSpec, VmStatus, instance_of
from .workload import Workload, WorkloadExit

EXIT_KILLED = -9
"""The job's exit code when the node is powered off under it (SIGKILL), as the VM sees it."""


@dataclass(frozen=True, slots=True)
class Rejoin:
    """How a gang's node stands by after its job (see the module)."""

    ask: Callable[[RejoinAsk], RejoinAnswer]
    """The daemon's answer (``spotd.daemon.rejoin.DaemonRejoin.next_step`` over a store)."""
    restart: Callable[[Mapping[str, str]], Workload]
    """A new workload of the node, with the job's environment as given."""
    wait_seconds: float = 300.0
    """How long the node stands by at most (the agent's ``rejoin_wait_seconds``)."""


class InProcessNode:
    """One simulated node and its workload, moved on by :meth:`catch_up`."""

    def __init__(
        self,
        spec: InstanceSpec,
        workload: Workload,
        market: SimMarket,
        rejoin: Rejoin | None = None,
    ) -> None:
        self.spec = spec
        self.status = VmStatus(InstanceState.PENDING, None, spec.launched_at)
        self._workload = workload
        self._market = market
        self._seen = spec.launched_at
        """The moment up to which the node has lived."""
        self._stalled = False
        self._reclaim_at: datetime | None = None
        self._rejoin = rejoin
        self._env = dict(spec.env)
        """The job's environment of the attempt the node runs (or ran) now."""
        self._standing: WorkloadExit | None = None
        """The exit of the job the node stands by after, while it does."""
        self._asked_at: datetime | None = None
        self._earlier = ""
        """What the jobs of the node's earlier attempts printed."""

    def catch_up(self, now: datetime) -> None:
        """Play every event of this node up to ``now``, in order."""
        while not self.status.ended and self._next_event(now):
            pass
        self._seen = max(self._seen, now)

    def terminate(self, now: datetime) -> None:
        """Stop the node at ``now`` (already caught up to it); an ended one is left alone."""
        if self.status.ended:
            return
        code = None
        if self.status.state is not InstanceState.PENDING:
            code = self._workload.stop(now)
        self._end(InstanceState.TERMINATED, now, exit_code=code, reason="terminate requested")

    def reclaim(self, now: datetime) -> None:
        """The market takes this spot node back from ``now`` on, with the usual notice."""
        if self.spec.market is Market.SPOT and self._reclaim_at is None:
            self._reclaim_at = now

    def stall(self) -> None:
        """The node never finishes booting (its job never starts) until terminated."""
        self._stalled = True

    @property
    def gang(self) -> str:
        """The rendezvous id of the gang the node runs (or ran) in; "" for none."""
        return self._env.get("SPOTD_RDZV_ID", "")

    @property
    def going(self) -> bool:
        """Under notice, or taken back: its gang's other ranks stop with it."""
        return self.status.state in (InstanceState.NOTICE, InstanceState.PREEMPTED)

    def stop_with_gang(self, at: datetime) -> None:
        """Another node of its gang is going: its job stops at its next step, checkpointed."""
        if self.status.state is InstanceState.RUNNING and self._standing is None:
            self._workload.stop_with_gang(at)

    def instance(self) -> Instance:
        """The node as its provider describes it."""
        return instance_of(self.spec, self.status)

    def usage(self) -> NodeUsage:
        """The meter's record of the node."""
        return usage_of(self.spec, self.status)

    def output(self) -> str:
        """What the job printed so far (over every attempt the node ran)."""
        return self._earlier + self._workload.output()

    # -- events -------------------------------------------------------------------

    def _next_event(self, now: datetime) -> bool:
        """Play the node's next event if it is due by ``now``; whether there was one."""
        if self.status.state is InstanceState.PENDING:
            return self._booting(now)
        if self._standing is not None:
            return self._standing_by(now)
        return self._running(now)

    def _booting(self, now: datetime) -> bool:
        ready = None
        if not self._stalled:
            ready = self.spec.launched_at + timedelta(seconds=self.spec.boot_seconds)
        lost = self._capacity_lost_at()
        if lost is not None and lost <= now and (ready is None or lost < ready):
            self._end(InstanceState.PREEMPTED, lost, reason="spot capacity reclaimed while booting")
            return True
        if ready is not None and ready <= now:
            self.status = replace(self.status, state=InstanceState.RUNNING, running_at=ready)
            self._seen = ready
            self._workload.start(ready)
            return True
        return False

    def _running(self, now: datetime) -> bool:
        noticed = self.status.state is InstanceState.NOTICE
        kill_at = self.status.kill_at if noticed else None
        lost = None if noticed else self._capacity_lost_at()
        horizon = min(t for t in (now, lost, kill_at) if t is not None)
        exited = self._workload.advance(horizon)
        if exited is not None and not noticed and self._stands_by():
            self._standing, self._seen = exited, exited.at
            return True
        if exited is not None:
            # Ending by itself with 0 during the notice is a finished job.
            done = not noticed or exited.code == 0
            state = InstanceState.EXITED if done else InstanceState.PREEMPTED
            self._end(state, exited.at, exit_code=exited.code, reason="job exited")
            return True
        if kill_at is not None and kill_at <= now:
            self._workload.kill(kill_at)
            self._end(InstanceState.PREEMPTED, kill_at, exit_code=EXIT_KILLED,
                      reason="spot capacity reclaimed")  # fmt: skip
            return True
        if lost is not None and lost <= now:
            deadline = lost + timedelta(seconds=self.spec.notice_seconds)
            self.status = replace(self.status, state=InstanceState.NOTICE, notice_at=lost,
                                  kill_at=deadline)  # fmt: skip
            self._seen = lost
            self._workload.notice(lost, deadline)
            return True
        return False

    def _stands_by(self) -> bool:
        """Whether the node stands by after its job: a node of a gang of several, on a
        provider that can ask what next."""
        nodes, attempt = self._env.get("SPOTD_NUM_NODES", "1"), self._env.get("SPOTD_ATTEMPT", "")
        return self._rejoin is not None and nodes.isdigit() and int(nodes) > 1 and attempt.isdigit()

    def _standing_by(self, now: datetime) -> bool:
        """Ask what next (once a moment has passed since the exit: the ask is the node's
        heartbeat after it); the market may take the node back meanwhile."""
        assert self._standing is not None and self._rejoin is not None
        code, lost = self._standing.code, self._capacity_lost_at()
        if lost is not None and lost <= now:
            self._end(InstanceState.PREEMPTED, lost, exit_code=code, reason="spot capacity "
                      "reclaimed while standing by")  # fmt: skip
            return True
        if now <= self._standing.at or now == self._asked_at:
            return False  # asked at this moment already
        self._asked_at = now
        answer = self._rejoin.ask(RejoinAsk(
            job_id=self._env.get("SPOTD_JOB_ID", ""), attempt=int(self._env["SPOTD_ATTEMPT"]),
            instance_id=self.spec.id, provider=self.spec.provider, at=now,
        ))  # fmt: skip
        if answer.step is RejoinStep.REJOIN and answer.attempt is not None:
            self._env.update(answer.env)
            self._earlier += self._workload.output()
            self._workload = self._rejoin.restart(dict(self._env))
            self._standing, self._seen = None, now
            self._workload.start(now)
            return True
        waited = (now - self._standing.at).total_seconds()
        if answer.step is RejoinStep.LEAVE or waited >= self._rejoin.wait_seconds:
            self._end(InstanceState.EXITED, now, exit_code=code, reason="job exited")
            return True
        return False

    def _capacity_lost_at(self) -> datetime | None:
        """The first moment since the node was last seen at which the market takes its
        capacity back: a reclaim, the end of its lifetime, or its pool running short."""
        spec = self.spec
        if spec.market is not Market.SPOT:
            return None
        moments = [] if self._reclaim_at is None else [self._reclaim_at]
        if spec.taken_back_at is not None:
            moments.append(max(spec.taken_back_at, self._seen))
        elif not self._market.available(spec.pool, self._seen, spec.nodes):
            moments.append(self._seen)
        else:
            change = self._market.next_change(spec.pool, self._seen, spec.nodes)
            if change is not None:
                moments.append(change)
        return min(moments, default=None)

    def _end(
        self, state: InstanceState, at: datetime, *, exit_code: int | None = None, reason: str
    ) -> None:
        self.status = replace(self.status, state=state, exit_code=exit_code, ended_at=at,
                              reason=reason)  # fmt: skip
        self._seen = at
