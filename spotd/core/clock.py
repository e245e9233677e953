"""Wall-clock time, for the daemon on real clouds."""

from __future__ import annotations

from datetime import UTC, datetime


class WallClock:
    """The real clock: aware UTC, one real second per second."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def seconds_to_real(self, seconds: float) -> float:
        return seconds
