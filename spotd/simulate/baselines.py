"""The published baselines, as policies of the simulator (not of the product).

From Wu et al., "Can't Be Late: Optimizing Spot Instance Savings under
Deadlines" (NSDI 2024):

- on-demand only: start on on-demand and stay;
- greedy: ride spot while it lasts, wait when there is none, and switch to
  on-demand for good once the slack would not survive one more changeover
  (the safety net, rule 4 below);
- Uniform Progress, the paper's four rules, with cp(t) the progress,
  ep(t) = t * C / R the uniform line, R(t) time left and C(t) compute left:
  1. take spot whenever it is available and stay on it until preempted;
  2. when no spot is available and cp(t) < ep(t), run on-demand;
  3. once on on-demand, stay until cp(t) >= ep(t + 2d);
  4. safety net: when not on spot and R(t) < C(t) + 2d, on-demand to the end.

"One zone" uses only the scenario's home offering; "any zone" takes spot in
any eligible offering that has it (staying put while it lasts, else the
cheapest per unit of progress) and on-demand where it is cheapest. In the
full model the safety margin also covers the work a preemption can lose and
applies on slow spot offerings too, so the guarantee holds there as well.
"""

from __future__ import annotations

from spotd.simulate.model import IDLE, RunState, World

__all__ = ["Greedy", "OnDemandOnly", "UniformProgress", "baselines_for"]


class OnDemandOnly:
    """Run on on-demand from the start: the reference every cost is normalised by."""

    name = "od-only"

    def reset(self, world: World, start: int) -> None:
        """Pick the cheapest on-demand offering of the job."""
        self._od = world.best_on_demand(world.eligible)

    def act(self, state: RunState) -> int:
        """Always the same on-demand instance."""
        return self._od


class _DeadlineAware:
    """What greedy and Uniform Progress share: the offerings they use and the safety net."""

    def __init__(self, any_zone: bool, label: str) -> None:
        self.any_zone = any_zone
        self.name = f"{label}-{'any' if any_zone else '1z'}"
        self._zones: tuple[int, ...] = ()
        self._od = IDLE
        self._margin = 0
        self._spot_margin = 0
        self._locked = False

    def reset(self, world: World, start: int) -> None:
        """Fix the offerings for this job and the safety margins in ticks."""
        self._zones = world.eligible if self.any_zone else (world.home,)
        self._od = world.best_on_demand(self._zones)
        # A preemption may throw away up to one checkpoint interval of work (none where
        # every zone's notice holds the job's checkpoint); and an idle tick costs a whole
        # tick of slack, so with d = 0 the margin is still one tick.
        saved = all(world.notice_saves[z] for z in self._zones)
        loss = 0 if saved else (world.ckpt_every or 1) - 1
        self._margin = max(2 * world.changeover, world.changeover + 1) + loss
        self._spot_margin = world.changeover + loss
        self._locked = False

    def _spot(self, state: RunState) -> int | None:
        """Spot to take now: the current one while it lasts, else the best available."""
        if state.on_spot:
            return state.mode
        return state.world.best_spot(self._zones, state.row)

    def _safety(self, state: RunState) -> bool:
        """Rule 4 (and its guard on spot): whether it is time for on-demand to the end."""
        if self._locked:
            return True
        margin = self._spot_margin if state.on_spot else self._margin
        if state.on_spot and margin == 0:
            return False  # reference model: riding spot never eats into the slack
        self._locked = state.slack(self._od) < margin
        return self._locked


class Greedy(_DeadlineAware):
    """Ride spot, wait when there is none, then on-demand to the end (the safety net)."""

    def __init__(self, any_zone: bool) -> None:
        super().__init__(any_zone, "greedy")

    def act(self, state: RunState) -> int:
        """Spot while possible; idle while the slack allows; else on-demand."""
        if self._safety(state):
            return self._od
        spot = self._spot(state)
        return IDLE if spot is None else spot


class UniformProgress(_DeadlineAware):
    """The paper's Uniform Progress: keep up with the line t * C / R, spot first."""

    def __init__(self, any_zone: bool) -> None:
        super().__init__(any_zone, "up")

    def act(self, state: RunState) -> int:
        """Apply the four rules in order of precedence (4, 1, 3, 2)."""
        if self._safety(state):
            return self._od
        if state.on_spot:
            return state.mode
        w = state.world
        spot = w.best_spot(self._zones, state.row)
        if state.on_demand:
            ahead = state.progress * w.window >= (state.t + 2 * w.changeover) * w.need
            if not ahead:
                return state.mode
            return IDLE if spot is None else spot
        if spot is not None:
            return spot
        behind = state.progress * w.window < state.t * w.need
        return self._od if behind else IDLE


def baselines_for(world: World) -> list[OnDemandOnly | Greedy | UniformProgress]:
    """Every baseline; the any-zone variants only where there is more than one zone."""
    multi = len(world.eligible) > 1
    out: list[OnDemandOnly | Greedy | UniformProgress] = [OnDemandOnly()]
    for cls in (Greedy, UniformProgress):
        out.append(cls(any_zone=False))
        if multi:
            out.append(cls(any_zone=True))
    return out
