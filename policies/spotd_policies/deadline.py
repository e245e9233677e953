"""Deadline control: when to ride spot, when to wait, when to pay for on-demand.

The Uniform Progress rules ("Can't Be Late", NSDI 2024) keep progress on a
straight line to the deadline. This planner does better by looking ahead: it
solves, by backward induction, the Markov decision problem of a job that
needs ``work`` hours within ``time`` hours. Every step it may idle (free),
run on-demand (price ``od``) or run on spot (price ``spot``) when spot is
there; each new start pays a changeover of ``d`` hours without progress; a
spot node is lost when its spell of capacity ends, and with it the work
since the last checkpoint. Missing the deadline costs more than anything
else (10^30), so the plan always keeps on-demand in reach: the safety net is
part of the optimum.

Spot availability is semi-Markov (:class:`SpotModel`): the chance that a
spell of capacity, or of its absence, ends in the next step depends on how
long it has lasted so far. Measured spells are heavy-tailed, so a spell that
has just begun is the likeliest to end soon and one that has lasted hours
is likely to last hours more; the hazards may also follow the time of day.
With several pools, "down" is the spell in which no pool has spot, "up" the
spell of the pool the job runs on or would start on, told apart by whether
another pool has spot too; when that pool's spell ends, the market moves to
another pool or to down with the probabilities estimated from history
(:mod:`spotd_policies.capacity_model`).

The table is indexed by *lag*, the steps so far without progress (time
minus progress): rows outside ``0 .. time - work`` can never finish, so only
the slack is stored and solved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray

MAX_STEPS = 1200
"""Cap on planning steps; longer horizons use coarser steps."""
MAX_CELLS = 80_000
"""Cap on steps x slack rows, which bounds a plan's memory (a few MB) and solve time."""
FINE_STEP_HOURS = 0.1
"""Preferred step: fine enough for changeovers of a few minutes."""
AGE_HOURS = 1.0
"""Spell ages the plan tells apart; older spells share the tail's hazard."""
IN_HAND_STEPS = 1e-3
"""Least work a preemption is taken to lose, in steps, even where the notice's checkpoint
saves it all. A sliver of a step costs nothing where slack is left, but it bars riding
spot on the last lag row from which a preemption still leaves time for the changeover
(that row's share of a miss is priced at 10^30): the plan keeps a step in hand there
against time and progress rounded to steps. On scenario 1 of the benchmarks a plan
counting no loss at all cost 0.627 of on-demand, one counting 10^-6 h 0.619."""
_BARRED = -1
"""Action table entry where nothing can finish in time any more."""
_LOST = np.float32(1e30)
"""Value of a state that cannot finish in time: finite, so that mixing it with
a zero probability stays exact (inf * 0 is nan), and far above any real cost."""


class Action(IntEnum):
    """What the job should be doing in a step."""

    IDLE = 0
    ON_DEMAND = 1
    SPOT = 2


@dataclass(frozen=True, slots=True)
class SpellLaw:
    """How long spells last: observed lengths (hours) with a geometric prior.

    The hazard at age ``a`` is the Kaplan-Meier estimate from the observed
    spells (those still going on count as at risk, not as ended), pulled
    toward the prior by ``prior_weight`` pseudo-spells of mean ``prior_hours``.
    """

    prior_hours: float
    prior_weight: float = 2.0
    hours: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    ended: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))

    def hazards(self, step_hours: float, ages: int) -> NDArray[np.float64]:
        """P(the spell ends within the next step | it has lasted a steps), a = 0 .. ages-1.

        The last entry is the tail's constant hazard for all older spells.
        """
        q = min(1.0, step_hours / max(self.prior_hours, step_hours))
        steps = np.maximum(1, np.ceil(self.hours / step_hours - 1e-9)).astype(np.int64)
        ended = self.ended
        a = np.arange(ages - 1)
        at_risk = np.bincount(np.minimum(steps, ages), minlength=ages + 1)[::-1].cumsum()[::-1]
        ends = np.bincount(np.minimum(steps[ended], ages + 1), minlength=ages + 2)
        prior = self.prior_weight * (1 - q) ** a
        risk = at_risk[1:ages] + prior
        head = np.divide(ends[1:ages] + prior * q, risk, out=np.full(ages - 1, q), where=risk > 0)
        # Older spells: events over exposure beyond the cap, with the prior's share.
        old = steps >= ages
        exposure = float((steps[old] - ages + 1).sum())
        tail_prior = self.prior_weight * (1 - q) ** (ages - 1)
        tail = q
        if exposure + tail_prior > 0:
            tail = (float(ended[old].sum()) + tail_prior * q) / (exposure + tail_prior)
        out = np.concatenate((head, [tail]))
        return np.clip(out, 1e-4, 1 - 1e-4)

    @property
    def mean_hours(self) -> float:
        """Mean spell length, prior included (spells still going count as exposure)."""
        ended = float(self.ended.sum()) + self.prior_weight
        return (float(self.hours.sum()) + self.prior_weight * self.prior_hours) / ended


@dataclass(frozen=True, slots=True)
class SpotModel:
    """The spot market a plan assumes: prices per hour and the laws of its spells."""

    spot_price: float
    od_price: float
    down: SpellLaw
    """Spells in which no allowed pool has spot."""
    up: SpellLaw
    """Spells of capacity of one pool (the one the job runs on or would start on)."""
    up_after_loss: float = 0.0
    """Probability that another pool still has spot when the job's pool loses it,
    given that another had it just before."""
    age_after_loss_hours: float = 0.0
    """How long that other pool's spell has typically lasted by then."""
    up_after_loss_alone: float = 0.0
    """Probability that another pool has spot when the job's pool loses it, given
    that none had it just before (one comes back at that very moment)."""
    others_rise_per_hour: float = 0.0
    """Rate at which another pool gets spot while the job's pool is the only one up."""
    others_fall_per_hour: float = 0.0
    """Rate at which the other pools all lose spot while the job's pool keeps it."""
    spot_speed: float = 1.0
    """Progress an hour on spot makes, per hour on on-demand (< 1 on a slower fabric)."""
    diurnal: NDArray[np.float64] | None = None
    """Hazard multipliers by UTC hour, shape (2, 24): row 0 down spells, row 1 up spells."""

    @property
    def pools(self) -> int:
        """Kinds of "up" the plan tells apart: alone, or with another pool up too."""
        return 2 if self.others_rise_per_hour > 0 or self.others_fall_per_hour > 0 else 1

    @property
    def run_preempt_rate(self) -> float:
        """Mean preemptions per hour of a running spot node."""
        return 1 / max(self.up.mean_hours, 1e-6)

    def summary(self) -> tuple[float, ...]:
        """The figures a plan is re-solved for when one of them drifts."""
        return (
            self.spot_price,
            self.od_price,
            self.up.mean_hours,
            self.down.mean_hours,
            self.up_after_loss,
            self.spot_speed,
        )


def memoryless(
    spot_price: float, od_price: float, up_hours: float, down_hours: float
) -> SpotModel:
    """A model with exponential spells of the given means (no history to go on)."""
    return SpotModel(spot_price, od_price, SpellLaw(down_hours), SpellLaw(up_hours))


@dataclass(frozen=True)
class Plan:
    """The solved policy: an action per (step, lag, mode, spot state and spell age)."""

    step_hours: float
    work_steps: int
    ages: int
    actions: NDArray[np.int8]
    """Shape (steps, 3 settled modes, slack rows, market states); ``-1`` where the deadline
    is lost. Market states: ``ages`` of down, then of up alone, then (with several
    pools) of up with another pool up too."""

    @property
    def steps(self) -> int:
        return int(self.actions.shape[0])

    def action(
        self,
        elapsed_hours: float,
        done_hours: float,
        running: Action,
        spot_up: bool,
        *,
        age_hours: float = 0.0,
        others_up: bool = False,
    ) -> Action:
        """The planned action now; ON_DEMAND past the horizon or when nothing else can finish.

        ``age_hours`` is how long the present spell has lasted: of the pool's
        capacity when spot is up, of no pool having any when it is down.
        ``others_up``: another pool has spot too (ignored by a one-pool plan).
        """
        t = int(elapsed_hours / self.step_hours + 1e-9)
        if t >= self.steps:
            return Action.ON_DEMAND
        # Floor progress (erring early) and treat a running job as past its changeover:
        # steps a booting node still spends show up as lag once it runs.
        p = min(self.work_steps, int(done_hours / self.step_hours + 1e-9))
        lag = max(0, t - p)
        if lag >= self.actions.shape[2]:
            return Action.ON_DEMAND
        age = min(self.ages - 1, int(age_hours / self.step_hours + 1e-9))
        kind = 0 if not spot_up else 1 + int(others_up and self.actions.shape[3] > 2 * self.ages)
        chosen = int(self.actions[t, int(running), lag, kind * self.ages + age])
        return Action.ON_DEMAND if chosen == _BARRED else Action(chosen)


def plan(
    model: SpotModel,
    work_hours: float,
    time_hours: float,
    changeover_hours: float,
    lost_hours: float = 0.0,
    *,
    start_hour: float = 0.0,
) -> Plan:
    """Solve the plan for a job needing ``work_hours`` within ``time_hours``.

    ``lost_hours`` is the progress a preemption throws away on average (half a
    checkpoint interval): the plan counts it, so it does not ride spot into a
    corner where one late preemption makes the deadline unreachable.
    ``start_hour`` is the UTC hour of day the plan starts at, for the model's
    diurnal hazards.
    """
    step = _step(work_hours, time_hours, changeover_hours)
    steps = max(1, int(time_hours / step + 1e-9))
    work = max(0, math.ceil(work_hours / step - 1e-9))
    ages = max(2, math.ceil(AGE_HOURS / step))
    grid = _Grid(steps, work, math.ceil(changeover_hours / step - 1e-9), ages)
    market = _Market.of(model, step, ages, steps, start_hour)
    lost = max(lost_hours / step, IN_HAND_STEPS)
    return Plan(step, work, ages, _solve(grid, model, market, lost))


def _step(work_hours: float, time_hours: float, changeover_hours: float) -> float:
    fine = FINE_STEP_HOURS
    if changeover_hours > 0:
        fine = changeover_hours / max(1, round(changeover_hours / FINE_STEP_HOURS))
    slack = max(time_hours - work_hours, 0.0)
    return max(fine, time_hours / MAX_STEPS, math.sqrt(time_hours * slack / MAX_CELLS))


@dataclass(frozen=True, slots=True)
class _Market:
    """The market's states and how they move in one step.

    A state is (kind, age): kind 0 no pool up, 1 the job's pool up alone, 2
    (several pools only) up with another pool up too. Each step the present
    spell ends with probability ``hazard[t, state]`` and the chain goes to
    ``lose_to[0]`` or, with probability ``lose_split``, ``lose_to[1]``; else it
    grows a step older in ``keep_to[0]`` or, with ``keep_split``, ``keep_to[1]``
    (another pool came or went).
    """

    hazard: NDArray[np.float32]
    keep_to: tuple[NDArray[np.int64], NDArray[np.int64]]
    keep_split: NDArray[np.float32]
    lose_to: tuple[NDArray[np.int64], NDArray[np.int64]]
    lose_split: NDArray[np.float32]
    up: NDArray[np.bool_]

    @property
    def states(self) -> int:
        return int(self.up.shape[0])

    @classmethod
    def of(
        cls, model: SpotModel, step: float, ages: int, steps: int, start_hour: float
    ) -> _Market:
        kinds = 1 + model.pools
        kind = np.repeat(np.arange(kinds), ages)
        age = np.tile(np.arange(ages), kinds)
        older = np.minimum(age + 1, ages - 1)
        other = min(ages - 1, int(model.age_after_loss_hours / step + 1e-9))
        # Another pool comes (alone -> with others) or the others go (the reverse).
        rise = 1 - math.exp(-model.others_rise_per_hour * step)
        fall = 1 - math.exp(-model.others_fall_per_hour * step)
        swapped = np.where(kind == 1, 2, 1) * ages + older
        keep_split = np.where(kind == 1, rise, np.where(kind == 2, fall, 0.0))
        # The spell ends: down -> the first pool back (alone, new); alone -> down, or
        # another pool back at that moment; with others -> one of them, alone.
        lose_a = np.where(kind == 0, ages, 0)
        lose_b = np.where(kind == 2, ages + other, ages)
        lose_split = np.where(
            kind == 1, model.up_after_loss_alone, np.where(kind == 2, model.up_after_loss, 0.0)
        )
        base = np.concatenate(
            [model.down.hazards(step, ages)] + [model.up.hazards(step, ages)] * model.pools
        )
        hazard = np.broadcast_to(base, (steps, base.shape[0]))
        if model.diurnal is not None:
            hour = ((start_hour + (np.arange(steps) + 0.5) * step) % 24).astype(np.int64)
            mult = model.diurnal[np.minimum(kind, 1)][:, hour].T  # (steps, states)
            hazard = np.clip(1 - (1 - base) ** mult, 1e-4, 1 - 1e-4)
        return cls(
            hazard.astype(np.float32),
            (kind * ages + older, swapped if kinds > 2 else kind * ages + older),
            keep_split.astype(np.float32),
            (lose_a, lose_b),
            lose_split.astype(np.float32),
            kind >= 1,
        )

    def expect(
        self, x: NDArray[np.float32], h: NDArray[np.float32], lost: NDArray[np.float32]
    ) -> NDArray[np.float32]:
        """E[value next step] per (row, state): ``x`` where the spell goes on, ``lost``
        (a table of the same shape) where it ends."""
        keep = x[:, self.keep_to[0]]
        if self.keep_split.any():
            keep = keep + self.keep_split * (x[:, self.keep_to[1]] - keep)
        end = lost[:, self.lose_to[0]]
        if self.lose_split.any():
            end = end + self.lose_split * (lost[:, self.lose_to[1]] - end)
        out: NDArray[np.float32] = keep + h * (end - keep)
        return out


@dataclass(frozen=True, slots=True)
class _Grid:
    """The plan's dimensions, and the modes a job can be in.

    Modes: 0 idle, 1 on-demand running, 2 spot running, then ``change`` modes
    of on-demand starting (``change`` .. 1 steps left) and as many of spot.
    """

    steps: int
    work: int
    change: int
    ages: int

    @property
    def modes(self) -> int:
        return 3 + 2 * self.change

    @property
    def rows(self) -> int:
        return self.steps - self.work + 1

    def family(self, mode: int) -> Action:
        if mode == 0:
            return Action.IDLE
        if mode == 1 or 3 <= mode < 3 + self.change:
            return Action.ON_DEMAND
        return Action.SPOT

    def after(self, mode: int, action: Action) -> tuple[int, bool]:
        """(mode next step, progress made this step) when ``action`` is taken in ``mode``."""
        c = self.change
        if self.family(mode) is not action:
            mode = int(action) if c == 0 else 3 + (0 if action is Action.ON_DEMAND else c)
        if mode in (1, 2):
            return mode, True
        base = 3 if mode < 3 + c else 3 + c
        left = c - (mode - base)
        return (int(self.family(mode)) if left == 1 else mode + 1), False


_ORDER = (Action.SPOT, Action.ON_DEMAND, Action.IDLE)
"""Ties go to the first: with slack to burn, the plan makes progress rather than idle."""


def _solve(grid: _Grid, model: SpotModel, market: _Market, lost: float) -> NDArray[np.int8]:
    """Backward induction; the result is laid out (steps, settled modes, rows, states)."""
    rows, modes, states = grid.rows, grid.modes, market.states
    if rows <= 0:
        return np.full((grid.steps, 3, 1, states), _BARRED, dtype=np.int8)
    # Settled modes (idle, running) choose among the actions; a starting node
    # boots to the end (the caller never asks mid-boot, it sees a booting job as
    # running). ``table`` maps each settled mode and action, ``booting`` each
    # starting mode, to one of the distinct outcomes.
    outcomes: list[tuple[Action, int, bool]] = []

    def outcome(mode: int, action: Action) -> int:
        key = (action, 0, False) if action is Action.IDLE else (action, *grid.after(mode, action))
        if key not in outcomes:
            outcomes.append(key)
        return outcomes.index(key)

    table = np.array([[outcome(m, a) for m in range(3)] for a in _ORDER])
    booting = np.array([outcome(m, grid.family(m)) for m in range(3, modes)], dtype=np.int64)
    value = np.zeros((modes, rows, states), dtype=np.float32)
    actions = np.empty((grid.steps, 3, rows, states), dtype=np.int8)
    done_from = np.arange(rows)
    costs = np.empty((len(outcomes), rows, states), dtype=np.float32)
    barred = np.where(market.up, np.float32(0), _LOST)
    slower = np.float32(1 - min(1.0, max(0.0, model.spot_speed)))
    for t in range(grid.steps - 1, -1, -1):
        h = market.hazard[t]
        stalled = _shift(value, 1)
        setback = _setback(value, lost)
        # A step on slower spot makes part of a step's progress: the rest is lag,
        # mixed from the rows one apart as _setback mixes a preemption's loss.
        on_spot = value + slower * (stalled - value) if slower > 0 else value
        for i, (a, nxt, progress) in enumerate(outcomes):
            ahead = (on_spot if a is Action.SPOT else value) if progress else stalled
            if a is Action.SPOT:
                # Losing the pool loses the node (and the work since the checkpoint).
                back = setback if progress else stalled
                go_on = market.expect(ahead[nxt], h, back[0])
                costs[i] = model.spot_price + barred + go_on
            else:
                price = model.od_price if a is Action.ON_DEMAND else 0.0
                costs[i] = price + market.expect(ahead[nxt], h, ahead[nxt])
        spot, od, idle = costs[table[0]], costs[table[1]], costs[table[2]]
        settled = np.minimum(np.minimum(spot, od), idle)
        value = np.concatenate((settled, costs[booting]))
        chosen = np.where(
            spot <= settled, np.int8(Action.SPOT),
            np.where(od <= settled, np.int8(Action.ON_DEMAND), np.int8(Action.IDLE)),
        ).astype(np.int8)
        np.minimum(value, _LOST, out=value)
        chosen[settled >= _LOST / 2] = _BARRED
        actions[t] = chosen
        # Rows whose progress already covers the work are done: nothing more to pay.
        value[:, (t - done_from) >= grid.work] = 0.0
    return actions


def _setback(value: NDArray[np.float32], lost: float) -> NDArray[np.float32]:
    """The table after a preemption that loses ``lost`` steps of progress on average: the
    two whole numbers of steps around it, mixed so the mean is exact (rounding a small
    loss up to a whole step would charge every preemption far more than it loses)."""
    whole = math.floor(lost)
    part = np.float32(lost - whole)
    low = _shift(value, whole) if whole else value
    if part <= 0:
        return low
    out: NDArray[np.float32] = low + part * (_shift(value, whole + 1) - low)
    return out


def _shift(value: NDArray[np.float32], by: int) -> NDArray[np.float32]:
    """The table ``by`` lag rows on: steps without progress; rows past the slack are lost."""
    out = np.full_like(value, _LOST)
    rows = value.shape[1]
    if by < rows:
        out[:, : rows - by] = value[:, by:]
    return out
