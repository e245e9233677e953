"""Wall-clock time, for the daemon on real clouds; and one corrected to the database's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

log = logging.getLogger(__name__)


class WallClock:
    """The real clock: aware UTC, one real second per second."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


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

    def seconds_to_real(self, seconds: float) -> float:
        return seconds
