"""What every provider checks before a drill (:class:`~spotd.core.contracts.Driller`)."""

from __future__ import annotations

from collections.abc import Sequence

from spotd.core.errors import InvalidRequestError, NotFoundError
from spotd.core.values import AttemptRecord, EventCause, EventRecord, Instance, Market

__all__ = ["drill_target", "drilled"]


def drill_target(provider: str, instance_id: str, found: Sequence[Instance]) -> Instance:
    """The instance a drill of ``instance_id`` preempts, from what ``provider``'s describe
    of it ``found``: :class:`NotFoundError` when the provider does not have it or it has
    ended, :class:`InvalidRequestError` for an on-demand one (only spot is preempted)."""
    instance = next((i for i in found if i.id == instance_id), None)
    if instance is None or instance.ended:
        raise NotFoundError(f"{provider}: no running instance {instance_id} to drill",
                            provider=provider, code="InstanceNotFound")  # fmt: skip
    if instance.market is not Market.SPOT:
        raise InvalidRequestError(f"{provider}: {instance_id} is an on-demand instance: only "
                                  "a spot instance can be preempted", provider=provider,
                                  code="NotSpot")  # fmt: skip
    return instance


def drilled(attempt: AttemptRecord, events: Sequence[EventRecord]) -> bool:
    """Whether a drill was sent to a node of ``attempt`` while it ran, by its job's
    ``events``: then its notice and its preemption were the drill's, not the market's."""
    return any(
        e.cause is EventCause.DRILL and e.at >= attempt.started_at
        and e.facts.node in attempt.instance_ids
        for e in events
    )  # fmt: skip
