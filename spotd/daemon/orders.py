"""The daemon's answer to a node that asks for its orders (:mod:`spotd.core.orders`).

The orders are what the store holds: a stop intent that the loop stored on the
job (``yield-priority``, ``yield-budget``) stops the node's job while the attempt
it asks for is the job's open one. Any daemon on the database answers alike, so
the node may ask whichever it reaches.
"""

from __future__ import annotations

from spotd.core.contracts import Clock, EngineStore
from spotd.core.orders import STOP_INTENTS, STOP_WHY, Orders, OrdersAsk, StopOrder
from spotd.engine.attempts import open_attempt
from spotd.market.catalog import notice_seconds

__all__ = ["MIN_NOTICE_SECONDS", "DaemonOrders"]

MIN_NOTICE_SECONDS = 30.0
"""The shortest notice a stop order gives (real seconds): a provider whose notice is
unknown (0) still lets the job checkpoint."""



class DaemonOrders:
    """Orders from the store; the notice is the job's provider's, in real seconds."""

    def __init__(self, store: EngineStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    def orders(self, ask: OrdersAsk) -> Orders:
        """A stop while the job has an open stop intent and ``ask`` speaks for its open
        attempt; else nothing."""
        asked = self._store.open_intents([ask.job_id]).get(ask.job_id, [])
        reason = next((STOP_INTENTS[i.kind] for i in asked if i.kind in STOP_INTENTS), None)
        if reason is None:
            return Orders()
        attempt = open_attempt(self._store.attempts(ask.job_id))
        if attempt is None or attempt.seq != ask.attempt:
            return Orders()
        notice = self._clock.seconds_to_real(notice_seconds(attempt.pool.provider))
        return Orders(stop=StopOrder(reason=reason, detail=STOP_WHY[reason],
                                     notice_seconds=max(notice, MIN_NOTICE_SECONDS)))  # fmt: skip
