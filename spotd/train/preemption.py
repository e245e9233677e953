"""One rank's knowledge that the node is going away, and whether all ranks agreed to stop.

This rank learns it locally, from SIGTERM or the notice file (:mod:`spotd.train.signals`);
the job stops once every rank knows, which a collective decides
(:class:`~spotd.train.agreement.StepAgreement`) or an emergency save declares. Once
agreed it stays agreed, so no later step needs a collective to say so again.
"""

from __future__ import annotations

import os
import signal

from spotd.core.contracts import Clock
from spotd.train.signals import Notice, SignalFlag, read_notice

__all__ = ["Preemption"]


class Preemption:
    """The SIGTERM flag, the notice file and the agreed stop of one rank.

    The signal handler is installed at construction (main thread only) unless
    ``handle_signals`` is False, and put back by :meth:`close`. The notice file is
    read until it first exists; from then on this rank's stop request stands.
    """

    def __init__(
        self, notice_file: str | os.PathLike[str] | None, clock: Clock, *, handle_signals: bool
    ) -> None:
        self._notice_file = notice_file
        self._clock = clock
        self._notice: Notice | None = None
        self._signals = SignalFlag()
        if handle_signals:
            self._signals.install()
        self.agreed = False
        """Whether every rank knows to stop (a reduction said so, or an emergency save began)."""

    @property
    def signal_received(self) -> signal.Signals | None:
        """The signal this rank itself got, if any."""
        return self._signals.received

    def seen_here(self) -> bool:
        """Whether this rank itself got the signal or found the notice file."""
        if self._signals.received is not None:
            return True
        if self._notice is None:
            self._notice = read_notice(self._notice_file)
        return self._notice is not None

    @property
    def requested(self) -> bool:
        """This rank's own view: agreed, or seen here."""
        return self.agreed or self.seen_here()

    def agree(self) -> None:
        """Record that every rank knows to stop."""
        self.agreed = True

    def time_left(self) -> float | None:
        """Seconds until this node's kill per the notice file; None when unknown."""
        notice = read_notice(self._notice_file)
        return None if notice is None else notice.seconds_left(self._clock.now())

    def close(self) -> None:
        """Put the previous signal handler back."""
        self._signals.restore()
