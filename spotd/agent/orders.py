"""The daemon's orders as one more notice source beside the provider's.

:class:`OrdersWatcher` wraps the provider's notice watcher. Every
``every`` seconds it also asks the daemon for its orders
(:mod:`spotd.core.orders`); a stop order becomes a ``preemption`` notice with
the deadline the order gives, so the agent acts on it as on the market's own
(the notice file, the checkpoint signal, the notice report) and the job cannot
tell the two apart. The provider's notice comes first when both are there: the
market's deadline is the one that cannot move.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from spotd.core.agent_wire import ProviderNotice
from spotd.core.clock import WALL
from spotd.core.contracts import AddressSource, Clock, NoticeWatcher
from spotd.core.errors import SpotdError
from spotd.core.orders import Orders, OrdersAsk

log = logging.getLogger(__name__)

AskOrders = Callable[[OrdersAsk], Orders]
"""One ask of the daemon (raises ReportFailed or ReportRejected, which are SpotdErrors)."""
Speaker = Callable[[], dict[str, object] | None]
"""The fields the ask starts with (who speaks), None before the agent knows its node."""


class OrdersWatcher:
    """The provider's watcher, with the daemon's stop orders as preemption notices."""

    def __init__(
        self,
        inner: NoticeWatcher,
        ask: AskOrders,
        *,
        every: float,
        speaker: Speaker | None = None,
        clock: Clock = WALL,
    ) -> None:
        self._inner = inner
        self._ask = ask
        self._every = every
        self.speaker: Speaker | None = speaker
        """Set once the agent knows its instance id; no ask goes out before."""
        self._clock = clock
        self._next_ask = clock.monotonic()
        self._stop: ProviderNotice | None = None

    @property
    def poll_interval(self) -> float:
        """The provider watcher's: orders are asked at most every ``every`` seconds."""
        return self._inner.poll_interval

    def check(self) -> ProviderNotice | None:
        """The provider's preemption notice, else a stop order's, else a rebalance."""
        found = self._inner.check()
        if found is not None and found.kind == "preemption":
            return found
        if self._stop is None and self._clock.monotonic() >= self._next_ask:
            speaker = self.speaker() if self.speaker is not None else None
            if speaker is not None:
                self._next_ask = self._clock.monotonic() + self._every
                self._stop = self._asked(speaker)
        return self._stop or found

    def _asked(self, speaker: dict[str, object]) -> ProviderNotice | None:
        try:
            orders = self._ask(OrdersAsk.model_validate(speaker))
        except SpotdError as exc:
            # An old daemon (404) or one that is down: no orders is the answer.
            log.debug("no orders from the daemon: %s", exc)
            return None
        stop = orders.stop
        if stop is None:
            return None
        deadline = self._clock.now() + timedelta(seconds=stop.notice_seconds)
        log.warning("the daemon stops the job (%s): %s", stop.reason, stop.detail)
        return ProviderNotice("preemption", deadline, f"spotd stops the job: {stop.detail}")

    def instance_id(self) -> str | None:
        """The provider watcher's."""
        return self._inner.instance_id()

    def private_address(self) -> str | None:
        """The provider watcher's, where it knows one."""
        if isinstance(self._inner, AddressSource):
            return self._inner.private_address()
        return None

    def job_ended(self) -> None:
        """Passed on to the provider watcher."""
        self._inner.job_ended()

    def close(self) -> None:
        """Passed on to the provider watcher."""
        self._inner.close()
