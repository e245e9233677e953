"""When a regular checkpoint is due: every N steps, every T seconds, or both."""

from __future__ import annotations

from spotd.core.contracts import Clock

__all__ = ["SaveSchedule"]


class SaveSchedule:
    """This rank's view of whether a regular save is due at a step.

    Due when the step is a multiple of ``every_steps`` or ``interval_seconds`` have
    passed since the last save started, and no save was attempted at that step or a
    later one. Each rank answers for itself; the ranks agree by a MAX reduction.
    """

    def __init__(self, every_steps: int | None, interval_seconds: float | None,
                 clock: Clock) -> None:  # fmt: skip
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {every_steps}")
        self.every_steps = every_steps
        self.interval_seconds = interval_seconds
        self._clock = clock
        self._attempted_step = 0
        self._last_started = clock.monotonic()

    def due(self, step: int) -> bool:
        """Whether a regular save is due at ``step``."""
        if step <= self._attempted_step:
            return False
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        elapsed = self._clock.monotonic() - self._last_started
        return self.interval_seconds is not None and elapsed >= self.interval_seconds

    def started(self, step: int) -> float:
        """A save of ``step`` starts now; return the clock's reading of now."""
        self._attempted_step = step
        self._last_started = now = self._clock.monotonic()
        return now

    def restart(self, step: int) -> None:
        """Training resumes at ``step``: count the interval from now."""
        self._attempted_step = step
        self._last_started = self._clock.monotonic()
