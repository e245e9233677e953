"""The simulated provider's own meter: what its instances cost, from its state files.

The simulator bills like the cloud it mirrors (``sim-aws`` like AWS: the
billing granularity and minimum of the mirrored kind, see :mod:`spotd.billing.ledger`):
each instance from its launch (the sim time its spec records) to its end
(the sim time its final state records; still running: now), rounded up by
the provider's granularity and minimum, at the price recorded in its spec at
launch. The price of a simulated instance is fixed for its life, though the
market's spot price drifts hourly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

from spotd.core.values import NodeUsage
from spotd.market.catalog import billed_seconds

from .records import InstanceSpec, VmStatus
from .statedir import StateDir


def node_usage(root: Path, instance_ids: Iterable[str]) -> dict[str, NodeUsage]:
    """Launch, end and price of each known instance in the state directory ``root``.

    Unknown ids are left out; ``ended_at`` is None for a node still running.
    """
    paths = StateDir(root)
    found: dict[str, NodeUsage] = {}
    for instance_id in instance_ids:
        if "/" in instance_id:
            continue
        spec = InstanceSpec.load(paths.spec(instance_id))
        if spec is None:
            continue
        found[instance_id] = usage_of(spec, VmStatus.load(paths.state(instance_id)))
    return found


def usage_of(spec: InstanceSpec, status: VmStatus | None) -> NodeUsage:
    """The meter's record of one node: launch, end (None while it runs) and price."""
    ended = status.ended_at if status is not None and status.ended else None
    return NodeUsage(spec.id, spec.launched_at, ended, spec.price)


def charge(provider: str, usage: NodeUsage, now: datetime) -> float:
    """USD the simulated ``provider`` charges for one node, unrounded."""
    end = usage.ended_at or now
    seconds = billed_seconds(provider, max(0.0, (end - usage.launched_at).total_seconds()))
    return (usage.price_per_hour or 0.0) * seconds / 3600.0


def bill(provider: str, root: Path, instance_ids: Sequence[str], now: datetime) -> float:
    """The provider's bill for these instances in USD, rounded to cents."""
    return total(provider, node_usage(root, instance_ids).values(), now)


def total(provider: str, usage: Iterable[NodeUsage], now: datetime) -> float:
    """What ``provider`` charges for these nodes in USD, rounded to cents."""
    return round(sum(charge(provider, u, now) for u in usage), 2)
