"""The omniscient optimum: an exact dynamic program over the whole trace window.

Wu et al. (NSDI 2024) bound every policy by the cost of one that knows the
future. Here that bound is computed exactly for the simulator's discrete
model (:mod:`spotd.simulate.model`): a forward DP over (tick, progress,
mode, changeover ticks left), and, where egress costs something, over the
provider holding the checkpoint while idle. All start points are solved at
once: every array is (start points x progress), so one tick is a few dozen
numpy operations whatever the number of starts.

A policy that knows the future never loses work to a preemption (it leaves,
checkpointing, in the tick before), so in the full model the DP ignores
checkpoint loss; that only makes it a lower bound that is still tight.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from spotd.simulate.model import World

__all__ = ["OMNISCIENT", "omniscient_costs"]

OMNISCIENT = "omniscient"
"""Name of the DP in reports."""

FloatArray = npt.NDArray[np.float64]


def _shift(x: FloatArray, r: int, need: int) -> FloatArray:
    """``x`` moved ``r`` progress units up; everything reaching ``need`` lands on ``need``."""
    out = np.full_like(x, np.inf)
    if r < need:
        out[:, r:need] = x[:, : need - r]
    out[:, need] = x[:, max(0, need - r) : need].min(axis=1)
    return out


def _bases(world: World, agg: list[FloatArray], providers: int) -> list[FloatArray]:
    """Cheapest state to start a new instance from, per target provider (egress included)."""
    if len(agg) == 1:
        return [agg[0]] * providers
    bases = []
    for p in range(providers):
        best = agg[0]  # no checkpoint anywhere yet: nothing to move
        for loc in range(providers):
            extra = 0.0 if loc == p else world.egress[loc]
            best = np.minimum(best, agg[1 + loc] + extra)
        bases.append(best)
    return bases


def omniscient_costs(world: World, starts: Sequence[int]) -> FloatArray:
    """The least cost of finishing by the deadline from each start (inf where impossible)."""
    s_count, need, d = len(starts), world.need, world.changeover
    window = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(world.window)
    avail = world.avail[:, window]  # (offerings, starts, ticks)
    providers = max(world.provider) + 1
    locs = 1 + providers if any(e > 0 for e in world.egress) else 1
    modes = [z for z in world.eligible] + [world.n + z for z in world.eligible]
    c_states = max(d, 1)
    inf = np.full((s_count, need + 1), np.inf)
    idle = [inf.copy() for _ in range(locs)]
    idle[0][:, 0] = 0.0
    run = {m: [inf.copy() for _ in range(c_states)] for m in modes}
    best = np.full(s_count, np.inf)
    for t in range(world.window):
        agg = [x.copy() for x in idle]
        for m in modes:
            loc = 0 if locs == 1 else 1 + world.provider[world.offering(m)]
            for x in run[m]:
                np.minimum(agg[loc], x, out=agg[loc])
        bases = _bases(world, agg, providers)
        new_run: dict[int, list[FloatArray]] = {}
        for m in modes:
            z = world.offering(m)
            price, rate = world.price(m), world.rate[z]
            fresh = bases[world.provider[z]] + price
            cur = run[m]
            # Changeover ticks count down; a productive tick moves progress up by the rate.
            nxt = [_shift(cur[0] + price, rate, need)] + [
                np.full_like(cur[0], np.inf) for _ in range(c_states - 1)
            ]
            for c in range(1, c_states):
                np.minimum(nxt[c - 1], cur[c] + price, out=nxt[c - 1])
            if d == 0:
                nxt[0] = np.minimum(nxt[0], _shift(fresh, rate, need))
            else:
                nxt[d - 1] = np.minimum(nxt[d - 1], fresh)
            if m < world.n:  # spot: nothing runs where the trace has no capacity
                down = ~avail[z, :, t]
                for x in nxt:
                    x[down] = np.inf
            best = np.minimum(best, nxt[0][:, need])
            nxt[0][:, need] = np.inf  # the job is done: it stops paying
            new_run[m] = nxt
        idle, run = agg, new_run
    return best
