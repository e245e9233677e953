"""Deadline control: when to ride spot, when to wait, when to pay for on-demand.

The Uniform Progress rules ("Can't Be Late", NSDI 2024) keep progress on a
straight line to the deadline. This planner does better by looking ahead: it
solves, by backward induction, the Markov decision problem of a job that
needs ``work`` hours within ``time`` hours, where spot availability follows a
two-state Markov chain whose rates are estimated from the pools' history.
Every step it may idle (free), run on-demand (price ``od``), or run on spot
(price ``spot``) when spot is there; each new start pays a changeover of
``d`` hours without progress; a running spot node is preempted at the pool's
rate, after which spot elsewhere is available with the observed probability.
Missing the deadline costs infinity, so the plan always keeps on-demand in
reach: the safety net is part of the optimum, not bolted on.

With many pools, "spot is there" means "some allowed pool has spot": zones
are treated as independent two-state chains, so the chain of "any pool up"
leaves "all down" at the sum of the pools' recovery rates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray

INFEASIBLE = math.inf
MAX_STEPS = 1200
"""Cap on planning steps; longer horizons use coarser steps."""


class Action(IntEnum):
    """What the job should be doing in a step."""

    IDLE = 0
    ON_DEMAND = 1
    SPOT = 2


@dataclass(frozen=True, slots=True)
class PoolRates:
    """One spot pool's history: share of time available and preemptions per running hour."""

    availability: float
    preemptions_per_hour: float


@dataclass(frozen=True, slots=True)
class SpotModel:
    """The aggregate spot market the plan assumes (rates per hour, prices per hour)."""

    spot_price: float
    od_price: float
    run_preempt_rate: float
    """Preemptions per hour of a running spot node."""
    up_after_preempt: float
    """Probability that another pool has spot right after a preemption."""
    up_to_down: float
    """Rate at which "some pool has spot" ends, when not running."""
    down_to_up: float
    """Rate at which "no pool has spot" ends."""


def aggregate(pools: Sequence[PoolRates], spot_price: float, od_price: float) -> SpotModel:
    """The "any pool up" chain of independent pools (see module docstring)."""
    floor = 1e-3
    avail = [min(1 - floor, max(floor, p.availability)) for p in pools] or [floor]
    down = [max(floor, p.preemptions_per_hour) for p in pools] or [1.0]
    up = [d * a / (1 - a) for d, a in zip(down, avail, strict=True)]
    all_down = math.prod(1 - a for a in avail)
    any_up = 1 - all_down
    recovery = sum(up)
    loss = recovery * all_down / any_up
    run_rate = sum(d * a for d, a in zip(down, avail, strict=True)) / sum(avail)
    # After a preemption the pool that went is down; the others keep their odds.
    others_down = all_down / max(floor, 1 - max(avail))
    return SpotModel(
        spot_price=spot_price,
        od_price=od_price,
        run_preempt_rate=run_rate,
        up_after_preempt=max(0.0, min(1.0, 1 - others_down)) if len(avail) > 1 else 0.0,
        up_to_down=loss,
        down_to_up=recovery,
    )


@dataclass(frozen=True)
class Plan:
    """The solved policy: an action per (step, progress step, mode, spot up)."""

    step_hours: float
    work_steps: int
    changeover_steps: int
    actions: NDArray[np.int8]
    """Shape (steps, work_steps + 1, modes, 2)."""
    feasible: NDArray[np.bool_]
    """Whether finishing in time is still possible from (step, progress, mode, up)."""

    @property
    def steps(self) -> int:
        return int(self.actions.shape[0])

    def action(
        self, elapsed_hours: float, done_hours: float, running: Action, spot_up: bool
    ) -> Action:
        """The planned action now; ON_DEMAND past the horizon or when nothing else can finish."""
        t = int(elapsed_hours / self.step_hours)
        if t >= self.steps:
            return Action.ON_DEMAND
        # Floor progress and treat a running job as just started: both err early.
        p = min(self.work_steps, int(done_hours / self.step_hours + 1e-9))
        m = int(running)
        s = int(spot_up)
        if not self.feasible[t, p, m, s]:
            return Action.ON_DEMAND
        return Action(int(self.actions[t, p, m, s]))


def plan(
    model: SpotModel,
    work_hours: float,
    time_hours: float,
    changeover_hours: float,
    lost_hours: float = 0.0,
) -> Plan:
    """Solve the plan for a job needing ``work_hours`` within ``time_hours``.

    ``lost_hours`` is the progress a preemption throws away on average (half a
    checkpoint interval): the plan counts it, so it does not ride spot into a
    corner where one late preemption makes the deadline unreachable.
    """
    step = max(changeover_hours / 2 if changeover_hours > 0 else 0.1, time_hours / MAX_STEPS)
    steps = max(1, int(time_hours / step))
    work = max(0, math.ceil(work_hours / step - 1e-9))
    change = math.ceil(changeover_hours / step - 1e-9)
    lost = math.ceil(lost_hours / step - 1e-9)
    return _solve(model, steps, work, change, step, lost)


_PREFERENCE = (Action.SPOT, Action.ON_DEMAND, Action.IDLE)
"""Order actions are tried in: on a tie (huge slack makes waiting and running
cost the same), the plan makes progress rather than idling."""

# Mode layout: 0 idle, 1 on-demand running, 2 spot running,
# 3 .. 3+c-1 on-demand starting (c..1 steps left), 3+c .. 3+2c-1 spot starting.


def _modes(change: int) -> int:
    return 3 + 2 * change


def _start(kind: Action, change: int) -> int:
    """Mode entered when starting ``kind`` (running at once without changeover)."""
    if change == 0:
        return int(kind)
    return 3 + (0 if kind is Action.ON_DEMAND else change)


def _advance(mode: int, change: int) -> tuple[int, bool]:
    """(next mode, made progress this step) for a job that keeps doing what it does."""
    if mode in (1, 2):
        return mode, True
    base = 3 if mode < 3 + change else 3 + change
    left = change - (mode - base)
    kind = 1 if base == 3 else 2
    return (kind if left == 1 else mode + 1), False


def _family(mode: int, change: int) -> Action:
    if mode == 0:
        return Action.IDLE
    if mode == 1 or 3 <= mode < 3 + change:
        return Action.ON_DEMAND
    return Action.SPOT


def _solve(  # noqa: PLR0917 - the plan's dimensions, named once
    model: SpotModel, steps: int, work: int, change: int, step: float, lost: int
) -> Plan:
    modes = _modes(change)
    probs = (
        1 - math.exp(-model.run_preempt_rate * step),
        1 - math.exp(-model.up_to_down * step),
        1 - math.exp(-model.down_to_up * step),
    )
    value = np.full((work + 1, modes, 2), INFEASIBLE)
    value[work] = 0.0
    actions = np.zeros((steps, work + 1, modes, 2), dtype=np.int8)
    feasible = np.zeros((steps, work + 1, modes, 2), dtype=np.bool_)
    rows = np.arange(work + 1)
    forward = np.minimum(rows + 1, work)
    backward = np.clip(rows + 1 - lost, 0, work)
    for t in range(steps - 1, -1, -1):
        # Progress made in a step moves the job one row down the value table;
        # a preemption moves it back by the work lost since the last checkpoint.
        ahead = value[forward]
        setback = value[backward]
        new = np.full_like(value, INFEASIBLE)
        best = np.zeros((work + 1, modes, 2), dtype=np.int8)
        for m in range(modes):
            for s in (0, 1):
                for a in _PREFERENCE:
                    cost = _option(value, (ahead, setback), model, (m, s, a), change, step, probs)
                    if cost is None:
                        continue
                    better = cost < new[:, m, s]
                    new[better, m, s] = cost[better]
                    best[better, m, s] = int(a)
        new[work] = 0.0
        value = new
        actions[t] = best
        feasible[t] = np.isfinite(value)
    return Plan(step, work, change, actions, feasible)


def _option(  # noqa: PLR0917 - a hot inner function; a dataclass per call costs
    value: NDArray[np.float64],
    moved: tuple[NDArray[np.float64], NDArray[np.float64]],
    model: SpotModel,
    choice: tuple[int, int, Action],
    change: int,
    step: float,
    probs: tuple[float, float, float],
) -> NDArray[np.float64] | None:
    """Expected cost-to-go, per progress row, of ``action`` in (mode, spot up); None if barred."""
    mode, up, action = choice
    ahead, setback = moved
    p_run, p_loss, p_gain = probs
    family = _family(mode, change)
    if action is Action.SPOT and not up:
        return None  # no spot to start, and a spot node without spot is a preemption
    if action is Action.IDLE:
        nxt, progress, price = 0, False, 0.0
    else:
        current = mode if family is action else _start(action, change)
        nxt, progress = _advance(current, change)
        price = model.od_price if action is Action.ON_DEMAND else model.spot_price
    base = ahead if progress else value
    if action is Action.SPOT:
        lost = setback if progress else value
        after = _mix(model.up_after_preempt, lost[:, 0, 1], lost[:, 0, 0])
        expected = _mix(1 - p_run, base[:, nxt, 1], after)
    elif up:
        expected = _mix(1 - p_loss, base[:, nxt, 1], base[:, nxt, 0])
    else:
        expected = _mix(p_gain, base[:, nxt, 1], base[:, nxt, 0])
    result: NDArray[np.float64] = price * step + expected
    return result


def _mix(p: float, a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """p*a + (1-p)*b, where an impossible branch (p = 0 or 1) adds nothing, not inf*0."""
    if p <= 0:
        return b
    if p >= 1:
        return a
    mixed: NDArray[np.float64] = p * a + (1 - p) * b
    return mixed
