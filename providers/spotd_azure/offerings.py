"""Offerings of one deployable size: a pool per zone, GPU facts from spotd's table.

The SKU API counts GPUs but does not name their model, so model and memory
come from :mod:`spotd.market.catalog`; a size missing there is offered as GPU
"unknown" on the conservative Ethernet figure.
"""

from __future__ import annotations

import logging

from spotd.core.network import Fabric, Interconnect
from spotd.core.values import Offering, Pool
from spotd.market.catalog import UNKNOWN_NODE_GBPS, facts, interconnect

from .figures import NOTICE_SECONDS
from .prices import PricePair
from .skus import SkuPlace
from .vms import PROVIDER, zone_name

log = logging.getLogger(__name__)

"""Azure's Scheduled Events announce a Spot eviction at least 30 s ahead."""

_warned_no_rdma: set[str] = set()


def offerings_of(place: SkuPlace, pair: PricePair) -> list[Offering]:
    """One offering per zone of ``place`` (one for a zoneless region); none without a price.

    Capacity is None: Azure's spot placement scores need a separate beta SDK
    (azure-mgmt-computerecommender) and eviction rates come from Resource
    Graph; neither is wired in, so the policy gets no capacity hint.
    """
    spot = pair.spot if place.spot_capable else None
    if spot is None and pair.on_demand is None:
        return []  # not sold to Linux pay-as-you-go customers there
    known = facts(PROVIDER, place.size)
    fabric = _fabric(place)
    return [
        Offering(
            pool=Pool(PROVIDER, place.region, zone_name(place.region, zone), place.size),
            gpu=known.gpu if known else "unknown",
            gpus_per_node=place.gpus,
            gpu_memory_gb=known.gpu_memory_gb if known else 0,
            interconnect=fabric,
            spot_price=spot,
            on_demand_price=pair.on_demand,
            capacity=None,
            notice_seconds=NOTICE_SECONDS,
        )
        for zone in (place.zones or (None,))
    ]


def _fabric(place: SkuPlace) -> Interconnect:
    """The table's fabric, unless the SKU says the size has no RDMA network."""
    fabric = interconnect(PROVIDER, place.size, place.gpus)
    if fabric.fabric is Fabric.INFINIBAND and not place.rdma:
        if place.size not in _warned_no_rdma:  # offerings are polled: warn once
            _warned_no_rdma.add(place.size)
            log.warning("azure %s: listed as InfiniBand but the SKU reports no RDMA: "
                        "assuming Ethernet", place.size)  # fmt: skip
        return Interconnect(Fabric.ETHERNET, UNKNOWN_NODE_GBPS / place.gpus)
    return fabric
