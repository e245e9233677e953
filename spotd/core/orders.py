"""The daemon's word to a node: stop, as if the market took the node back.

A running job may be asked to give way: a pending job of its team with a
higher priority needs its place under the team's ``max_running_jobs``, or the
team's monthly budget would be spent before the running jobs could stop. The
job then gets the same notice a spot preemption gives, through the same path
on the node (the notice file ``spotd.train`` reads, the checkpoint signal, the
notice report), so it checkpoints and leaves exactly as it does for the market.

The agent asks for its orders (``POST /v1/agent/orders``, an
:class:`OrdersAsk`) with its heartbeats; the daemon answers :class:`Orders`.
The notice lasts as long as the job's provider gives on a preemption.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from spotd.core.agent_wire import AgentReport
from spotd.core.intents import IntentKind

__all__ = [
    "ORDERS_PATH",
    "STOP_INTENTS",
    "STOP_WHY",
    "AgentOrders",
    "Orders",
    "OrdersAsk",
    "StopOrder",
    "StopReason",
]

ORDERS_PATH = "/v1/agent/orders"


class StopReason(StrEnum):
    """Why the daemon stops a running job that nothing else would stop."""

    PRIORITY = "priority"
    """A pending job of its team with a higher priority takes its place."""
    TEAM_BUDGET = "team-budget"
    """Its team's monthly budget would be spent before its jobs could stop."""


STOP_INTENTS: dict[IntentKind, StopReason] = {
    IntentKind.YIELD_PRIORITY: StopReason.PRIORITY,
    IntentKind.YIELD_BUDGET: StopReason.TEAM_BUDGET,
}
"""The intents that stop a running job, and the reason each gives."""


STOP_WHY: dict[StopReason, str] = {
    StopReason.PRIORITY: "a job of its team with a higher priority takes its place",
    StopReason.TEAM_BUDGET: "its team's monthly budget would be spent before it could stop",
}
"""Each reason as events, status and the node's notice say it."""


class OrdersAsk(AgentReport):
    """A node asks whether the daemon wants its job stopped."""


class StopOrder(BaseModel):
    """Stop the job as on a preemption notice, ``notice_seconds`` (real) from now."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    reason: StopReason
    detail: str
    notice_seconds: float


class Orders(BaseModel):
    """What the daemon wants of a node now: nothing, or a stop."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    stop: StopOrder | None = None


class AgentOrders(Protocol):
    """Where the agent route for orders asks (thread-safe: called from worker threads)."""

    def orders(self, ask: OrdersAsk) -> Orders:
        """The orders for the node of ``ask``'s job, attempt and instance."""
        ...
