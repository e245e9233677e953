"""The deadline planner's spot market, estimated from the pools' capacity history.

From each allowed pool's :class:`~spotd.core.capacity.CapacitySeries`:

- *up* spells: every pool's spells of capacity, pooled (the job rides one
  pool at a time, so what matters is how long one pool's spell lasts);
- *down* spells: the spells in which no allowed pool had capacity;
- what the other pools do meanwhile: how often another one gets capacity
  while the job's pool is alone, how often they all lose it, whether one
  still has it at the moment the job's pool loses its own, and how long its
  spell has lasted by then;
- how the hazards follow the hour of day (capacity is scarcer in business
  hours), shrunk toward flat where the history is thin.

Pools without history fall back on the priors (:mod:`spotd.core.facts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from spotd.core import facts
from spotd.core.capacity import CapacitySeries, Spells, align, spells_of, trailing_run
from spotd_policies.deadline import SpellLaw, SpotModel

__all__ = ["down_age_hours", "longest_outage_hours", "residual_up_hours", "spot_model"]

PRIOR_AVAILABILITY = 0.5
"""Share of time spot is assumed up in a pool with no history."""
PRIOR_SPELLS = 2.0
"""Weight of the prior, in pseudo-spells, against the spells observed."""
DIURNAL_SHRINK_HOURS = 5.0
"""Pseudo-hours at the overall rate added to every hour of day's estimate."""
DIURNAL_KERNEL = np.array([1.0, 2.0, 3.0, 2.0, 1.0])
"""Weights of the neighbouring hours (-2 .. +2) pooled into each hour's estimate:
the daily cycle is smooth, the counts of a few weeks are not."""
DIURNAL_MIN_HOURS = 48.0
"""History needed before the hour of day is taken into account."""


def spot_model(
    series: Sequence[CapacitySeries],
    *,
    spot_price: float,
    od_price: float,
    spot_speed: float = 1.0,
) -> SpotModel:
    """The model the planner solves over, from the allowed spot pools' series.

    Prices are per hour; ``spot_speed`` is the progress of an hour on spot per
    hour on on-demand (see :class:`~spotd_policies.deadline.SpotModel`)."""
    up = _up_law([s.spells() for s in series])
    down_prior = up.prior_hours * (1 - PRIOR_AVAILABILITY) / PRIOR_AVAILABILITY
    aligned = align(series)
    down = SpellLaw(down_prior, PRIOR_SPELLS)
    others = _Others()
    diurnal = None
    if aligned is not None:
        start, step, matrix = aligned
        anyone = spells_of(_any_up(matrix), step)
        down = SpellLaw(
            down_prior, PRIOR_SPELLS, hours=anyone.hours[~anyone.up], ended=anyone.ended[~anyone.up]
        )
        others = _others(matrix, step)
        if matrix.shape[1] * step >= DIURNAL_MIN_HOURS:
            first_hour = start.hour + start.minute / 60
            diurnal = _diurnal(matrix, step, first_hour)
    return SpotModel(
        spot_price,
        od_price,
        down,
        up,
        up_after_loss=others.after_loss,
        age_after_loss_hours=others.age_after_hours,
        up_after_loss_alone=others.after_loss_alone,
        others_rise_per_hour=others.rise_per_hour,
        others_fall_per_hour=others.fall_per_hour,
        spot_speed=spot_speed,
        diurnal=diurnal,
    )


RESIDUAL_STEP_HOURS = 0.1
"""Age resolution when comparing pools by their expected remaining capacity."""
RESIDUAL_AGE_HOURS = 12.0
"""Spell ages told apart when comparing pools; older ones share the tail's hazard."""


def residual_up_hours(series: CapacitySeries) -> float:
    """Expected further hours of capacity in the pool, given how long its present spell has
    lasted (0 when it has none now). Each pool is judged by its own spells: pools differ."""
    if len(series) == 0 or not series.up[-1]:
        return 0.0
    law = _up_law([series.spells()])
    return float(_residuals(law)[_age_index(series.age_hours())])


def _up_law(spells: Sequence[Spells]) -> SpellLaw:
    """The law of the up spells of ``spells`` (of one pool or several, pooled), with the
    prior of a pool without history."""
    hours = [sp.hours[sp.up] for sp in spells]
    ended = [sp.ended[sp.up] for sp in spells]
    return SpellLaw(
        1 / facts.DEFAULT_PREEMPTIONS_PER_HOUR,
        PRIOR_SPELLS,
        hours=np.concatenate(hours) if hours else np.zeros(0),
        ended=np.concatenate(ended) if ended else np.zeros(0, dtype=np.bool_),
    )


def _age_index(age_hours: float) -> int:
    return min(round(RESIDUAL_AGE_HOURS / RESIDUAL_STEP_HOURS) - 1,
               int(age_hours / RESIDUAL_STEP_HOURS + 1e-9))


def _residuals(law: SpellLaw) -> NDArray[np.float64]:
    """Expected further hours of a spell at each age (in residual steps) up to the cap."""
    step = RESIDUAL_STEP_HOURS
    ages = round(RESIDUAL_AGE_HOURS / step)
    hazards = law.hazards(step, ages)
    survive = np.concatenate(([1.0], np.cumprod(1 - hazards)))  # P(lasts past age a)
    # Survival summed from each age to the cap, then the tail's geometric rest.
    tail = survive[ages] / hazards[-1]
    ahead = np.cumsum(survive[:ages][::-1])[::-1] + tail
    out: NDArray[np.float64] = ahead / survive[:ages] * step
    return out


def down_age_hours(series: Sequence[CapacitySeries]) -> float:
    """How long ago the last pool of ``series`` lost capacity (0 when one has it now)."""
    aligned = align(series)
    if aligned is None:
        return 0.0
    _, step, matrix = aligned
    anyone = _any_up(matrix)
    if anyone[-1]:
        return 0.0
    return (trailing_run(anyone) - 1) * step


def longest_outage_hours(series: Sequence[CapacitySeries], window_hours: float) -> float | None:
    """The longest stretch in the last ``window_hours`` in which no pool of ``series`` had
    capacity (the present one included); None when the history is shorter than the window."""
    aligned = align(series)
    if aligned is None:
        return None
    _, step, matrix = aligned
    samples = round(window_hours / step)
    if matrix.shape[1] < samples:
        return None
    # Every spell counts, the first one too (cut by the window, it lasted at least that).
    spells = spells_of(_any_up(matrix[:, -samples:]), step, keep_first=True)
    down = spells.hours[~spells.up]
    return float(down.max()) if down.size else 0.0


@dataclass(frozen=True, slots=True)
class _Others:
    """What the other pools do while one has capacity (see :class:`SpotModel`)."""

    after_loss: float = 0.0
    age_after_hours: float = 0.0
    after_loss_alone: float = 0.0
    rise_per_hour: float = 0.0
    fall_per_hour: float = 0.0


def _others(matrix: NDArray[np.bool_], step: float) -> _Others:
    """Count, over every pool's up samples, how the other pools behaved."""
    pools, samples = matrix.shape
    if pools < 2 or samples < 2:
        return _Others()
    others = (matrix.sum(axis=0)[None, :] - matrix) > 0  # another pool up, per pool and sample
    before, after = others[:, :-1], others[:, 1:]
    kept = matrix[:, :-1] & matrix[:, 1:]
    lost = matrix[:, :-1] & ~matrix[:, 1:]
    # Half an event each way keeps a thin history away from 0 and 1.
    rise = (float((kept & ~before & after).sum()) + 0.5) / (
        float((kept & ~before).sum()) * step + 1.0)
    fall = (float((kept & before & ~after).sum()) + 0.5) / (
        float((kept & before).sum()) * step + 1.0)
    alone = lost & ~before
    with_others = lost & before
    ages = _run_ages(matrix)[:, 1:] * matrix[:, 1:]  # age of each pool's up spell, 0 if down
    pool, at = np.nonzero(with_others & after)
    longest = np.zeros(0)
    if at.size:
        seen = ages[:, at].copy()
        seen[pool, np.arange(at.size)] = 0
        longest = seen.max(axis=0)
    return _Others(
        after_loss=(float((with_others & after).sum()) + 0.5) / (float(with_others.sum()) + 1),
        # The other pool's spell began ``longest`` samples before: it is that many - 1 old.
        age_after_hours=float(np.median(longest) - 1) * step if longest.size else 0.0,
        after_loss_alone=(float((alone & after).sum()) + 0.5) / (float(alone.sum()) + 1),
        rise_per_hour=rise,
        fall_per_hour=fall,
    )


def _run_ages(matrix: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Samples since each pool's present spell began, at every sample (1 at a change)."""
    samples = matrix.shape[1]
    index = np.arange(samples)
    change = np.ones(matrix.shape, dtype=np.bool_)
    change[:, 1:] = matrix[:, 1:] != matrix[:, :-1]
    began = np.maximum.accumulate(np.where(change, index, 0), axis=1)
    ages: NDArray[np.int64] = index - began + 1
    return ages


def _diurnal(matrix: NDArray[np.bool_], step: float, first_hour: float) -> NDArray[np.float64]:
    """Hazard multipliers by hour of day: row 0 for down spells, row 1 for up spells."""
    samples = matrix.shape[1]
    hour = ((first_hour + np.arange(samples - 1) * step) % 24).astype(np.int64)
    anyone = _any_up(matrix)
    out = np.ones((2, 24))
    for row, (series_set, state) in enumerate(((anyone[None, :], False), (matrix, True))):
        now = series_set[:, :-1] == state
        ends = now & (series_set[:, 1:] != state)
        risk = _smooth(_by_hour(hour, now) * step)
        count = _smooth(_by_hour(hour, ends))
        total = risk.sum()
        if total <= 0 or count.sum() == 0:
            continue
        rate = count.sum() / total
        out[row] = (count + DIURNAL_SHRINK_HOURS * rate) / (risk + DIURNAL_SHRINK_HOURS) / rate
    return out


def _any_up(matrix: NDArray[np.bool_]) -> NDArray[np.bool_]:
    anyone: NDArray[np.bool_] = np.any(matrix, axis=0)
    return anyone


def _by_hour(hour: NDArray[np.int64], mask: NDArray[np.bool_]) -> NDArray[np.float64]:
    """How many of the masked samples (pool by sample) fall in each hour of day."""
    return np.bincount(np.broadcast_to(hour, mask.shape)[mask], minlength=24).astype(np.float64)


def _smooth(by_hour: NDArray[np.float64]) -> NDArray[np.float64]:
    """Circular weighted sum over neighbouring hours (weights sum to 1 per hour)."""
    half = len(DIURNAL_KERNEL) // 2
    padded = np.concatenate((by_hour[-half:], by_hour, by_hour[:half]))
    out: NDArray[np.float64] = np.convolve(padded, DIURNAL_KERNEL / DIURNAL_KERNEL.sum(), "valid")
    return out
