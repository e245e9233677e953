"""Wall-clock time, for the daemon on real clouds; one corrected to the database's; and a
manual one that moves only when told, for tests.

Nothing else in spotd, its providers or its policies reads the time: whatever needs
it is handed a :class:`~spotd.core.contracts.Clock` and asks it. A clock answers two
questions:

* ``now()``: the time of day, aware UTC. It is the clock's own: a simulated market's
  runs faster than the wall (:class:`spotd_sim.clock.SimClock`).
* ``monotonic()``: real seconds from an arbitrary start, never going back, for
  what real time bounds: timeouts, retry backoffs, cache ages, how long a save took.
  Only differences of two readings mean anything.

Entry points take ``clock: Clock = WALL`` so that callers need not care; tests hand
a :class:`ManualClock` and :meth:`~ManualClock.advance` it, so nothing waits or
races the wall clock. ``tests/test_clock_discipline.py`` keeps the rule: only this
module and ``spotd_sim/clock.py`` may call ``time.time``, ``time.monotonic``,
``datetime.now`` and the like.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from spotd.core.contracts import Clock

log = logging.getLogger(__name__)


class WallClock:
    """The real clock: aware UTC, one real second per second."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


WALL: Final = WallClock()
"""The wall clock, for entry points' defaults: ``clock: Clock = WALL``."""


class DatabaseClock:
    """The wall clock corrected to a shared reference: the database server's.

    Several daemons on one database stamp attempts, events and the ledger
    with their clocks; if those drift apart, an attempt begun by one daemon
    and ended by another would be billed across two clocks. This clock reads
    the reference now and then (``refresh_seconds``) and keeps the offset, so
    every daemon's "now" is the server's to within a round trip. A failed
    read keeps the last offset.
    """

    def __init__(
        self,
        reference: Callable[[], datetime],
        *,
        refresh_seconds: float = 60.0,
        local: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reference = reference
        self._refresh = refresh_seconds
        self._local = local
        self._monotonic = monotonic
        self._offset = timedelta(0)
        self._read_at: float | None = None

    @property
    def offset(self) -> timedelta:
        """How far the reference is ahead of this machine's clock, at the last read."""
        return self._offset

    def now(self) -> datetime:
        """The reference's time now, timezone-aware UTC."""
        at = self._monotonic()
        if self._read_at is None or at - self._read_at >= self._refresh:
            self._read_at = at
            try:
                before = self._local()
                seen = self._reference()
                after = self._local()
                # The reference was read somewhere between the two local readings.
                self._offset = seen - (before + (after - before) / 2)
            except Exception:  # keep the last offset; the next refresh asks again
                log.warning("could not read the reference clock; keeping its last offset",
                            exc_info=True)  # fmt: skip
        return self._local() + self._offset

    def monotonic(self) -> float:
        """This machine's monotonic seconds: intervals need no reference."""
        return self._monotonic()

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


class ManualClock:
    """A clock that moves only when told: ``advance(seconds)``.

    For tests that drive time themselves: an engine, an in-process simulated
    market (:class:`spotd_sim.inprocess.InProcessSimProvider`), cooldowns and
    deadlines all see the moment the test set, and nothing happens between two
    calls to :meth:`advance`. Its seconds count as real ones (``seconds_to_real``
    is the identity): no real time passes on it at all, and :meth:`monotonic`
    moves with :meth:`now`, from 0 at ``start``.
    """

    def __init__(self, start: datetime) -> None:
        if start.utcoffset() is None:
            raise ValueError("a clock's start must be timezone-aware")
        self._now = start.astimezone(UTC)
        self._elapsed = 0.0

    def now(self) -> datetime:
        """The moment the clock was last set to, timezone-aware UTC."""
        return self._now

    def monotonic(self) -> float:
        """Seconds advanced since the clock was made."""
        return self._elapsed

    def advance(self, seconds: float) -> datetime:
        """Move the clock ``seconds`` on (never back) and return the new now."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds} s")
        self._now += timedelta(seconds=seconds)
        self._elapsed += seconds
        return self._now

    def seconds_to_real(self, seconds: float) -> float:
        return seconds

    def __repr__(self) -> str:
        return f"ManualClock({self._now.isoformat()})"


def speed_of(clock: Clock) -> float:
    """Clock seconds per real second: 1 for the wall's, 60 for a market 60x faster."""
    return 1.0 / clock.seconds_to_real(1.0)


def clock_note(clock: Clock) -> str | None:
    """``simulated clock, 60x real time`` for a clock faster or slower than real time,
    so that no one takes its times for real ones; None for one at real speed.

    Every surface that shows the clock's times says it: ``spotd status``, the
    dashboard's banner, reports and their email, the daemon's first log line.
    """
    speed = speed_of(clock)
    if abs(speed - 1.0) < 1e-9:
        return None
    return f"simulated clock, {speed:g}x real time"
