"""Product policies (``spotd.core.contracts.Policy``) replayed tick by tick on a trace.

Every tick the adapter shows the policy what the daemon would: the offerings
with a spot capacity signal of 1.0 or 0.0 taken from the trace at this tick
for the job's nodes, and a :class:`~spotd.core.values.PlacementContext` whose
``stats`` come only from the trace up to this tick. The decision is applied
like the engine applies a move: the place it runs now keeps running, another
place is a new start (changeover paid), no choice is idle.

With ``hindsight`` the stats cover the whole trace instead, its future too
(the present still the present): the policy plans on the market's true
statistics, though not on what happens next. Against the plain run it shows
what better estimates of the market could buy, as the omniscient optimum
shows what knowing the future would.

Offerings are built once per job (two variants each, with and without
capacity) so a tick only picks from them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import numpy as np
import numpy.typing as npt

from spotd.core.capacity import CapacitySeries
from spotd.core.contracts import Policy
from spotd.core.errors import PolicyError
from spotd.core.spec import DeadlineSpec, JobSpec
from spotd.core.values import Market, Offering, PlacementContext, Pool
from spotd.engine.context import JobPosition, placement_context
from spotd.simulate.model import IDLE, RunState, World
from spotd.simulate.world import EPOCH, Prepared

__all__ = ["HINDSIGHT", "MIN_HISTORY_HOURS", "PolicyAdapter", "TraceHistory", "TraceStats"]

MIN_HISTORY_HOURS = 1.0
"""Below this much observed time (or time up, for preemption rates) stats say None."""
HINDSIGHT = "+hindsight"
"""Suffix of the name of a policy replayed with the whole trace's statistics."""

IntArray = npt.NDArray[np.int64]


class TraceHistory:
    """Prefix counts of a timeline: ticks up and drops (up -> down) per offering.

    Entry ``[z, i]`` counts ticks ``0..i`` only, so anything read at tick ``i``
    depends on the past and the present alone, never on the future, unless
    ``hindsight`` asks for the whole trace's statistics.
    """

    def __init__(
        self,
        avail: npt.NDArray[np.bool_],
        tick_hours: float,
        window: int | None = None,
        *,
        hindsight: bool = False,
    ) -> None:
        self.avail = avail
        up = avail.astype(np.int64)
        drops = np.zeros_like(up)
        drops[:, 1:] = (avail[:, :-1] & ~avail[:, 1:]).astype(np.int64)
        self.up: IntArray = np.cumsum(up, axis=1)
        self.drops: IntArray = np.cumsum(drops, axis=1)
        self.tick_hours = tick_hours
        self.window = window
        """Ticks of capacity series shown (None: everything so far)."""
        self.hindsight = hindsight
        """Stats of the whole trace, future included (see :meth:`TraceStats.capacity_series`)."""
        days = math.floor(avail.shape[1] * tick_hours / 24 + 1e-9)
        self.whole_days = round(days * 24 / tick_hours)
        """Ticks in the trace's whole days: the future is moved back by this many."""


class TraceStats:
    """:class:`~spotd.core.values.PoolStats` as of one tick, from the trace seen so far."""

    __slots__ = ("_history", "_index", "_tick")

    def __init__(self, history: TraceHistory, index: dict[Pool, int], tick: int) -> None:
        self._history = history
        self._index = index
        self._tick = tick

    @property
    def _counted(self) -> int:
        """The last tick the counts cover: this one, or with hindsight the trace's last."""
        return self._history.up.shape[1] - 1 if self._history.hindsight else self._tick

    def availability(self, pool: Pool) -> float | None:
        """Share of the ticks so far in which the pool could hold the job."""
        z = self._index.get(pool)
        seen = self._counted + 1
        if z is None or seen * self._history.tick_hours < MIN_HISTORY_HOURS:
            return None
        return float(self._history.up[z, self._counted]) / seen

    def preemptions_per_hour(self, pool: Pool) -> float | None:
        """Drops of capacity per hour that capacity was up, so far."""
        z = self._index.get(pool)
        if z is None:
            return None
        up_hours = float(self._history.up[z, self._counted]) * self._history.tick_hours
        if up_hours < MIN_HISTORY_HOURS:
            return None
        return float(self._history.drops[z, self._counted]) / up_hours

    def capacity_series(self, pool: Pool) -> CapacitySeries | None:
        """The trace of the pool up to this tick, over the last ``window`` ticks at most.

        With hindsight (``window`` not applied), the trace's future within its
        whole days comes first, moved back by those days so each sample keeps its
        hour of day, then the past up to this tick: every spell the trace holds,
        ending in the present.
        """
        z = self._index.get(pool)
        if z is None:
            return None
        history = self._history
        if history.hindsight:
            now = self._tick + 1
            ahead = history.avail[z, now : history.whole_days]
            start = EPOCH - timedelta(hours=ahead.shape[0] * history.tick_hours)
            return CapacitySeries(start, history.tick_hours, np.concatenate(
                (ahead, history.avail[z, :now])))
        first = 0 if history.window is None else max(0, self._tick + 1 - history.window)
        start = EPOCH + timedelta(hours=first * history.tick_hours)
        return CapacitySeries(start, history.tick_hours, history.avail[z, first : self._tick + 1])


class PolicyAdapter:
    """Runs any :class:`~spotd.core.contracts.Policy` as a simulator policy."""

    def __init__(self, policy: Policy, prepared: Prepared, *, hindsight: bool = False) -> None:
        self.policy = policy
        self.name = f"policy:{policy.name}{HINDSIGHT if hindsight else ''}"
        self._prepared = prepared
        world = prepared.world
        self._up = [replace(o, capacity=1.0) for o in prepared.offerings]
        self._down = [replace(o, capacity=0.0) for o in prepared.offerings]
        self._index = {o.pool: z for z, o in enumerate(prepared.offerings)}
        self._history = TraceHistory(world.avail, world.tick_hours, hindsight=hindsight)
        # Its own job ids: a policy object replayed both ways keeps two sets of plans.
        self._job = f"sim-{prepared.job.name}{'-hindsight' if hindsight else ''}"
        self._tick = timedelta(hours=world.tick_hours)
        self._spec: JobSpec = prepared.spec
        self._start = 0

    def reset(self, world: World, start: int) -> None:
        """Give the job its deadline for this start point."""
        self._start = start
        finish_by = EPOCH + self._tick * (start + world.window)
        deadline = DeadlineSpec(compute_hours=world.compute_hours, finish_by=finish_by)
        self._spec = self._prepared.spec.model_copy(update={"deadline": deadline})

    def context(self, state: RunState) -> tuple[PlacementContext, list[Offering]]:
        """What the policy is shown at this tick: its context and the offerings."""
        w = state.world
        tick = self._start + state.t
        offerings = [up if ok else down for up, down, ok in zip(
            self._up, self._down, state.row, strict=True)]
        current = market = None
        if state.mode != IDLE:
            current = offerings[w.offering(state.mode)].pool
            market = Market.SPOT if state.on_spot else Market.ON_DEMAND
        # No attempt records here: the run's state says where the job is and how far.
        ctx = placement_context(
            f"{self._job}-{self._start}",
            self._spec,
            EPOCH + self._tick * tick,
            changeover_hours=w.changeover * w.tick_hours,
            spent_usd=state.cost,
            stats=TraceStats(self._history, self._index, tick),
            position=JobPosition(
                current=current,
                current_market=market,
                done_hours=state.progress / w.need * w.compute_hours,
            ),
        )
        return ctx, offerings

    def act(self, state: RunState) -> int:
        """Ask the policy and turn its choice into a mode."""
        ctx, offerings = self.context(state)
        try:
            decision = self.policy.place(ctx, offerings)
        except Exception as exc:
            raise PolicyError(
                f"policy {self.policy.name!r} failed at tick {ctx.now:%Y-%m-%d %H:%M}: {exc}"
            ) from exc
        choice = decision.choice
        if choice is None:
            return IDLE
        z = self._index.get(choice.offering.pool)
        if z is None:
            raise PolicyError(
                f"policy {self.policy.name!r} chose a pool not offered: {choice.offering.pool}"
            )
        return z if choice.market is Market.SPOT else state.world.n + z
