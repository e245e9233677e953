"""The simulated job: one tick at a time on a trace, under any simulator policy.

Time is counted in ticks of the (resampled) trace and progress in integer
units, so the engine, the baselines and the exact DP of
:mod:`spotd.simulate.omniscient` share one discrete model:

- a *mode* is ``IDLE`` (-1), spot on offering ``z`` (``z``) or on-demand on
  offering ``z`` (``n + z``, ``n`` offerings);
- every tick a running mode is paid in full; a new instance first spends
  ``changeover`` ticks without progress (boot, setup, restore), then each
  tick adds ``rate[z]`` progress units;
- spot on ``z`` runs in a tick only where the trace has at least the job's
  nodes; when it drops, the instance is preempted and (full model) the
  progress since the last checkpoint is lost, unless the job's checkpoint on
  the preemption notice fits in that offering's notice (``notice_saves``);
- moving the checkpoint to another provider pays that provider's egress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["IDLE", "Outcome", "RunState", "SimPolicy", "World", "run_policy"]

IDLE = -1
"""The mode of a job that runs nowhere (idle costs nothing)."""

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class World:
    """One job on one timeline, in ticks and progress units.

    ``avail[z, i]``: spot of offering ``z`` can hold the job in tick ``i``.
    Costs are per tick for all nodes. ``ckpt_every`` is the number of
    productive ticks between checkpoints (None: nothing is ever lost, the
    reference model, where the changeover stands for lost progress too).
    ``notice_saves[z]``: a preemption on offering ``z`` loses nothing, the job
    checkpoints in the notice (full model; see :func:`spotd.core.cadence.saves_on_notice`).
    """

    avail: BoolArray
    labels: tuple[str, ...]
    tick_hours: float
    spot_cost: tuple[float, ...]
    od_cost: tuple[float, ...]
    rate: tuple[int, ...]
    provider: tuple[int, ...]
    egress: tuple[float, ...]
    need: int
    window: int
    changeover: int
    ckpt_every: int | None
    notice_saves: tuple[bool, ...]
    home: int
    eligible: tuple[int, ...]
    compute_hours: float
    rows: list[list[bool]] = field(repr=False, compare=False)
    """``avail`` by tick, as Python lists: indexing them per tick is cheap."""

    @property
    def n(self) -> int:
        """Number of offerings."""
        return len(self.labels)

    def price(self, mode: int) -> float:
        """Cost of one tick in ``mode``."""
        if mode == IDLE:
            return 0.0
        return self.spot_cost[mode] if mode < self.n else self.od_cost[mode - self.n]

    def offering(self, mode: int) -> int:
        """The offering a running mode is on."""
        return mode if mode < self.n else mode - self.n

    def od_ticks(self, z: int) -> int:
        """Ticks a whole run on on-demand of offering ``z`` takes, changeover included."""
        return self.changeover + math.ceil(self.need / self.rate[z])

    def best_on_demand(self, among: tuple[int, ...]) -> int:
        """The on-demand mode with the lowest cost per progress unit among offerings.

        Offerings too slow to finish the whole job in time on their own come last.
        """
        z = min(among, key=lambda i: (
            self.od_ticks(i) > self.window, self.od_cost[i] / self.rate[i], i))
        return self.n + z

    def best_spot(self, among: tuple[int, ...], row: list[bool]) -> int | None:
        """The available spot mode with the lowest cost per progress unit, if any."""
        live = [z for z in among if row[z]]
        if not live:
            return None
        return min(live, key=lambda z: (self.spot_cost[z] / self.rate[z], z))


@dataclass(frozen=True, slots=True)
class Outcome:
    """One policy on one start point."""

    start: int
    cost: float
    """What the job cost; a missed job also pays finishing the rest on on-demand after."""
    missed: bool
    finish_tick: int | None
    spot_ticks: int
    od_ticks: int
    preemptions: int
    launches: int
    goodput: float
    modes: tuple[int, ...] = ()
    progress: tuple[int, ...] = ()


@dataclass(slots=True)
class RunState:
    """The job as a policy sees it at the start of a tick (after any preemption)."""

    world: World
    start: int
    t: int = 0
    row: list[bool] = field(default_factory=list)
    progress: int = 0
    mode: int = IDLE
    changeover_left: int = 0
    cost: float = 0.0
    last_provider: int | None = None
    since_units: int = 0
    since_ticks: int = 0
    spot_ticks: int = 0
    od_ticks: int = 0
    productive: int = 0
    lost: int = 0
    preemptions: int = 0
    launches: int = 0

    @property
    def on_spot(self) -> bool:
        """Whether the job runs on spot now."""
        return IDLE < self.mode < self.world.n

    @property
    def on_demand(self) -> bool:
        """Whether the job runs on on-demand now."""
        return self.mode >= self.world.n

    def slack(self, od_mode: int) -> int:
        """Ticks to spare if the rest ran on ``od_mode`` from now, changeover not counted."""
        rate = self.world.rate[self.world.offering(od_mode)]
        return self.world.window - self.t - math.ceil((self.world.need - self.progress) / rate)

    def preempt(self) -> None:
        """The spot instance is gone: lose what was not checkpointed (nothing where the
        checkpoint written on the notice fits in it)."""
        self.preemptions += 1
        if not self.world.notice_saves[self.world.offering(self.mode)]:
            self.progress -= self.since_units
            self.lost += self.since_ticks
        self._leave()

    def _leave(self) -> None:
        # Leaving on purpose checkpoints first, so nothing is lost.
        self.since_units = self.since_ticks = 0
        self.mode = IDLE
        self.changeover_left = 0

    def apply(self, action: int) -> None:
        """Run this tick in mode ``action``: keep, switch (new instance) or idle."""
        w = self.world
        if action == IDLE or (action < w.n and not self.row[action]):
            # A spot launch where there is no capacity fails: the tick is idle.
            if self.mode != IDLE:
                self._leave()
            return
        if action != self.mode:
            if self.mode != IDLE:
                self._leave()
            p = w.provider[w.offering(action)]
            if self.last_provider is not None and self.last_provider != p:
                self.cost += w.egress[self.last_provider]
            self.last_provider = p
            self.mode = action
            self.launches += 1
            self.changeover_left = w.changeover
        self.cost += w.price(action)
        if action < w.n:
            self.spot_ticks += 1
        else:
            self.od_ticks += 1
        if self.changeover_left > 0:
            self.changeover_left -= 1
            return
        rate = w.rate[w.offering(action)]
        self.progress = min(w.need, self.progress + rate)
        self.productive += 1
        if w.ckpt_every is None:
            return  # reference model: the changeover already stands for lost work
        self.since_units += rate
        self.since_ticks += 1
        if self.since_ticks >= w.ckpt_every:
            self.since_units = self.since_ticks = 0


class SimPolicy(Protocol):
    """A policy of the simulator: told the state every tick, answers a mode."""

    name: str

    def reset(self, world: World, start: int) -> None:
        """Forget the previous run; a new job starts at tick ``start``."""
        ...

    def act(self, state: RunState) -> int:
        """The mode to run this tick in (the current one to keep running)."""
        ...


def _outcome(st: RunState, finish: int | None, modes: list[int], prog: list[int]) -> Outcome:
    w = st.world
    cost = st.cost
    missed = finish is None
    if missed:
        # Charge finishing the rest on on-demand after the deadline, so a miss is never cheap.
        od = w.best_on_demand(w.eligible)
        left = math.ceil((w.need - st.progress) / w.rate[w.offering(od)])
        cost += (w.changeover + left) * w.price(od)
    paid = st.spot_ticks + st.od_ticks
    return Outcome(
        start=st.start,
        cost=cost,
        missed=missed,
        finish_tick=finish,
        spot_ticks=st.spot_ticks,
        od_ticks=st.od_ticks,
        preemptions=st.preemptions,
        launches=st.launches,
        goodput=(st.productive - st.lost) / paid if paid else 0.0,
        modes=tuple(modes),
        progress=tuple(prog),
    )


def run_policy(policy: SimPolicy, world: World, start: int, *, record: bool = False) -> Outcome:
    """Replay one job from tick ``start`` until it finishes or its deadline passes."""
    st = RunState(world=world, start=start)
    policy.reset(world, start)
    modes: list[int] = []
    prog: list[int] = []
    finish: int | None = None
    n = world.n
    for t in range(world.window):
        st.t = t
        st.row = world.rows[start + t]
        if IDLE < st.mode < n and not st.row[st.mode]:
            st.preempt()
        st.apply(policy.act(st))
        if record:
            modes.append(st.mode)
            prog.append(st.progress)
        if st.progress >= world.need:
            finish = t + 1
            break
    return _outcome(st, finish, modes, prog)
