"""Which GPU sizes a subscription can deploy where, from the Resource SKUs API.

``resource_skus.list(filter="location eq '<region>'")`` lists every compute
SKU of a region with its capabilities (``GPUs``, ``LowPriorityCapable``,
``RdmaEnabled``, ...), the zones it is in and its restrictions for this
subscription. A restriction of type ``Location`` takes the size out of the
region, one of type ``Zone`` takes out the zones it names. Any reason code
counts (``NotAvailableForSubscription``, ``QuotaId``): either way a deployment
there would fail.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from azure.mgmt.compute.models import ResourceSku


@dataclass(frozen=True, slots=True)
class SkuPlace:
    """A GPU size as deployable in one region: its zones and capabilities.

    ``zones`` is empty for a region without availability zones.
    """

    size: str
    region: str
    zones: tuple[str, ...]
    gpus: int
    spot_capable: bool
    rdma: bool


def _capabilities(sku: ResourceSku) -> dict[str, str]:
    return {c.name: c.value for c in sku.capabilities or [] if c.name and c.value is not None}


def _int(text: str | None) -> int:
    try:
        return int(float(text or "0"))
    except ValueError:
        return 0


def _zones(sku: ResourceSku, region: str) -> tuple[str, ...] | None:
    """Zones of ``sku`` in ``region`` left after restrictions; None when it is not there."""
    infos = [i for i in sku.location_info or [] if (i.location or "").lower() == region]
    if not infos:
        return None
    zones = {z for i in infos for z in i.zones or []}
    was_zonal = bool(zones)
    for restriction in sku.restrictions or []:
        kind = (restriction.type or "").lower()
        values = [v.lower() for v in restriction.values_property or []]
        info = restriction.restriction_info
        if kind == "location" and region in values:
            return None
        if kind == "zone" and info is not None:
            zones -= set(info.zones or [])
    if was_zonal and not zones:
        return None
    return tuple(sorted(zones))


def places(skus: Iterable[ResourceSku], region: str, sizes: Iterable[str]) -> list[SkuPlace]:
    """The sizes among ``sizes`` that have GPUs and are deployable in ``region``."""
    wanted = {s.lower() for s in sizes}
    region = region.lower()
    found = []
    for sku in skus:
        if (sku.resource_type or "").lower() != "virtualmachines":
            continue
        if (sku.name or "").lower() not in wanted:
            continue
        caps = _capabilities(sku)
        gpus = _int(caps.get("GPUs"))
        zones = _zones(sku, region)
        if gpus < 1 or zones is None:
            continue
        found.append(SkuPlace(
            size=sku.name or "", region=region, zones=zones, gpus=gpus,
            spot_capable=caps.get("LowPriorityCapable", "").lower() == "true",
            rdma=caps.get("RdmaEnabled", "").lower() == "true",
        ))  # fmt: skip
    return found
