"""GPUs and scale-out fabric of an instance type, looked up in its provider kind's catalog.

The policy weighs a job's model size against the bandwidth per GPU of the
fabric between nodes, so these facts matter as much as prices do. Each
provider kind carries its own table (``ProviderKind.instance_types``, with
its sources, in the provider's package); a simulated provider uses the table
of the kind it mirrors. Adapters take GPU model and count from the cloud's
API where it gives them and the fabric from here; a type not listed gets a
conservative Ethernet figure and a logged warning, so it is never mistaken
for a fast fabric.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from spotd.core.kinds import (
    DEFAULT_BILLING_MINIMUM_SECONDS,
    DEFAULT_BILLING_STEP_SECONDS,
    DEFAULT_EGRESS_USD_PER_GB,
    DEFAULT_INTER_REGION_USD_PER_GB,
    InstanceShape,
)
from spotd.core.network import Fabric, Interconnect
from spotd.registry import find_market_kind, provider_kinds

log = logging.getLogger(__name__)

UNKNOWN_NODE_GBPS = 10.0
"""Scale-out bandwidth assumed per node for a type not in the table."""

_warned: set[tuple[str, str]] = set()


def catalog() -> dict[str, Mapping[str, InstanceShape]]:
    """Provider kind -> instance type -> facts, of every installed kind that has a table."""
    return {k.name: k.instance_types for k in provider_kinds() if k.instance_types}


def facts(provider: str, instance_type: str) -> InstanceShape | None:
    """The table's facts for a type, or None when it is not listed."""
    kind = find_market_kind(provider)
    return None if kind is None else kind.instance_types.get(instance_type)


def interconnect(provider: str, instance_type: str, gpus_per_node: int) -> Interconnect:
    """The scale-out fabric of a type; a conservative Ethernet default when unknown."""
    known = facts(provider, instance_type)
    if known is not None:
        return known.interconnect
    kind = find_market_kind(provider)
    key = (kind.name if kind else provider, instance_type)
    if key not in _warned:
        _warned.add(key)
        log.warning(
            "no interconnect facts for %s %s: assuming Ethernet at %g Gbps per node",
            key[0], instance_type, UNKNOWN_NODE_GBPS,
        )
    return Interconnect(Fabric.ETHERNET, UNKNOWN_NODE_GBPS / max(1, gpus_per_node))


__all__ = ["UNKNOWN_NODE_GBPS", "InstanceShape", "catalog", "facts", "interconnect"]


def transfer_usd_per_gb(source: str, destination: str) -> float:
    """USD per GB to move data from provider ``source`` to ``destination`` in another
    region: the source kind's inter-region price when both are of one market kind
    (a simulator prices like the cloud it mirrors), else its internet egress."""
    src, dst = find_market_kind(source), find_market_kind(destination)
    same = (src.name if src else source) == (dst.name if dst else destination)
    if same:
        return src.inter_region_usd_per_gb if src else DEFAULT_INTER_REGION_USD_PER_GB
    return src.egress_usd_per_gb if src else DEFAULT_EGRESS_USD_PER_GB


def notice_seconds(provider: str) -> int:
    """Seconds between the provider's preemption notice and the hard stop (0: unknown)."""
    kind = find_market_kind(provider)
    return kind.notice_seconds if kind else 0


DEFAULT_BILLING = (DEFAULT_BILLING_STEP_SECONDS, DEFAULT_BILLING_MINIMUM_SECONDS)
"""For a provider no installed kind builds: per second with a minute's minimum, the
common case."""


def billed_seconds(provider: str, seconds: float) -> float:
    """``seconds`` of one node rounded up as ``provider`` bills them (granularity, minimum)."""
    kind = find_market_kind(provider)
    step, minimum = (
        (kind.billing_step_seconds, kind.billing_minimum_seconds) if kind else DEFAULT_BILLING
    )
    # Round before ceil: 60.0000000001 s of float noise is not a second minute.
    steps = math.ceil(round(max(0.0, seconds) / step, 6))
    return float(max(minimum, steps * step))
