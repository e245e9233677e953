"""How long a checkpoint takes, and whether one still fits before the kill.

The estimate is the longest of the last few measured saves (a slow outlier is
exactly what the deadline must survive), or the caller's guess before the first
one, times a factor plus a fixed margin. Without either, it is unknown, and an
emergency save is attempted: a save that does not finish leaves only a torn folder
that is never resumed, while a skipped one loses the work for certain.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["SaveBudget"]


@dataclass
class SaveBudget:
    """Measured save durations and the estimate derived from them."""

    first_estimate: float | None = None
    """Seconds a save is assumed to take before one has been measured."""
    factor: float = 1.5
    """Multiplier on the measured (or guessed) duration."""
    margin_seconds: float = 2.0
    """Seconds added on top, for the marker write and process exit."""
    history: int = 5
    """How many recent saves the estimate looks at."""
    _durations: deque[float] = field(default_factory=deque, repr=False)

    def record(self, seconds: float) -> None:
        """Remember that one save took ``seconds``."""
        self._durations.append(max(0.0, seconds))
        while len(self._durations) > max(1, self.history):
            self._durations.popleft()

    @property
    def measured(self) -> tuple[float, ...]:
        """The remembered durations, oldest first."""
        return tuple(self._durations)

    def estimate(self) -> float | None:
        """Seconds to allow for the next save, margin included; None if unknown."""
        base = max(self._durations) if self._durations else self.first_estimate
        if base is None:
            return None
        return base * self.factor + self.margin_seconds

    @staticmethod
    def fits(estimate: float | None, seconds_left: float | None) -> bool:
        """Whether a save of ``estimate`` seconds fits in ``seconds_left``.

        An unknown deadline always fits; an unknown estimate fits any deadline not
        yet passed.
        """
        if seconds_left is None:
            return True
        return seconds_left >= (estimate or 0.0)
