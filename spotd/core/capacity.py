"""A pool's spot capacity history as a regular series, and the spells it is made of.

Spot capacity comes and goes in spells whose lengths are heavy-tailed: most
last minutes, a few last days. How long the present spell has lasted so far
therefore says a lot about how long it will go on, which a single average
rate cannot say. The policies' availability model
(:mod:`spotd_policies.capacity_model`) reads these series; the daemon builds them
from its price history (:mod:`spotd.market.stats`) and the simulator from the trace
seen so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt

__all__ = ["CapacitySeries", "Spells", "align", "resample"]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

_GRID_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)
"""Series of one step all sit on one grid counted from here, so they line up."""


@dataclass(frozen=True, slots=True)
class Spells:
    """Alternating spells of a series: whether each was up, how long, and whether it ended.

    The first spell is left out where more followed (unless asked for): its start
    is before the series, so its length is unknown. The last one is still going on.
    """

    up: BoolArray
    hours: FloatArray
    ended: BoolArray


@dataclass(frozen=True, slots=True)
class CapacitySeries:
    """Whether a pool had spot capacity, one sample per ``step_hours`` from ``start``.

    The last sample is the present.
    """

    start: datetime
    step_hours: float
    up: BoolArray

    def __len__(self) -> int:
        return int(self.up.shape[0])

    def age_hours(self) -> float:
        """How long ago the present spell (up or down) began, as far as the series sees.

        A spell first seen in the last sample is 0 hours old.
        """
        return max(0, trailing_run(self.up) - 1) * self.step_hours

    def spells(self) -> Spells:
        """The spells of the series, oldest first."""
        return spells_of(self.up, self.step_hours)


def trailing_run(values: BoolArray) -> int:
    """Number of samples at the end of ``values`` equal to the last one."""
    n = int(values.shape[0])
    if n == 0:
        return 0
    changes = np.flatnonzero(values[:-1] != values[-1])
    return n - 1 - int(changes[-1]) if changes.size else n


def spells_of(up: BoolArray, step_hours: float, *, keep_first: bool = False) -> Spells:
    """Spells of a sampled series (see :class:`Spells`); ``keep_first`` keeps the first
    spell too, as long as the series saw it (at least that long)."""
    n = int(up.shape[0])
    if n == 0:
        return Spells(np.zeros(0, dtype=np.bool_), np.zeros(0), np.zeros(0, dtype=np.bool_))
    bounds = np.concatenate(([0], np.flatnonzero(up[1:] != up[:-1]) + 1, [n]))
    lengths = np.diff(bounds).astype(np.float64) * step_hours
    state = up[bounds[:-1]]
    ended = np.ones(lengths.shape[0], dtype=np.bool_)
    ended[-1] = False
    keep = slice(1, None) if lengths.shape[0] > 1 and not keep_first else slice(None)
    return Spells(state[keep], lengths[keep], ended[keep])


def align(series: Sequence[CapacitySeries]) -> tuple[datetime, float, BoolArray] | None:
    """The series' common stretch as one matrix (pool by sample), or None if they do not meet.

    All series must share one step; each is cut to the latest start and the
    earliest end among them.
    """
    if not series:
        return None
    step = series[0].step_hours
    if any(not math.isclose(s.step_hours, step) for s in series):
        return None
    width = timedelta(hours=step)
    start = max(s.start for s in series)
    end = min(s.start + width * len(s) for s in series)
    count = round((end - start) / width)
    if count <= 0:
        return None
    rows = []
    for s in series:
        first = round((start - s.start) / width)
        rows.append(s.up[first : first + count])
    return start, step, np.stack(rows)


def resample(
    samples: Sequence[tuple[datetime, bool]], step: timedelta, now: datetime
) -> CapacitySeries | None:
    """A series on the common grid from polled samples (oldest first), each held until the next.

    None without samples. The grid is shared by every series of the same
    step, so :func:`align` can line pools up.
    """
    if not samples:
        return None
    first = _grid_floor(samples[0][0], step)
    count = int((now - first) / step) + 1
    if count <= 0:
        return None
    at = np.array([(t - first) / step for t, _ in samples])
    value = np.array([v for _, v in samples], dtype=np.bool_)
    # The sample in force at grid point i is the last one taken at or before it.
    which = np.searchsorted(at, np.arange(count), side="right") - 1
    up = value[np.maximum(which, 0)]
    return CapacitySeries(first, step.total_seconds() / 3600, up)


def _grid_floor(moment: datetime, step: timedelta) -> datetime:
    return _GRID_ORIGIN + step * ((moment - _GRID_ORIGIN) // step)
