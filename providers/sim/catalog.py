"""The instance types, regions and zones of the three simulated providers.

Instance type names and their GPU, memory and fabric figures follow the real
clouds. Every price here is a plausible made-up figure in USD per node-hour,
not a quote: real adapters read live prices.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from spotd.domain import Fabric, Interconnect, Pool

SIM_AWS = "sim-aws"
SIM_GCP = "sim-gcp"
SIM_AZURE = "sim-azure"
PROVIDERS = (SIM_AWS, SIM_GCP, SIM_AZURE)

NOTICE_SECONDS = {SIM_AWS: 120, SIM_GCP: 30, SIM_AZURE: 30}
"""Preemption notice per provider: AWS two minutes, GCP and Azure about 30 s."""

_SPOT_SHARE_RANGE = (0.30, 0.45)
"""Spot price as a share of on-demand; each (zone, type) gets its own share."""


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One machine shape: its GPUs, fabric and on-demand list price."""

    name: str
    gpu: str
    gpus_per_node: int
    gpu_memory_gb: int
    interconnect: Interconnect
    on_demand_price: float
    regions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """An instance type in one zone, with its base prices."""

    pool: Pool
    instance_type: InstanceType
    on_demand_price: float
    base_spot_price: float
    notice_seconds: int


def _eth(gbps: float) -> Interconnect:
    return Interconnect(Fabric.ETHERNET, gbps)


_ZONES: dict[str, dict[str, tuple[str, ...]]] = {
    # The AWS zones are those of the shared V100 traces, so traces map onto them.
    SIM_AWS: {
        "us-east-1": ("us-east-1a", "us-east-1c", "us-east-1d", "us-east-1f"),
        "us-east-2": ("us-east-2a", "us-east-2b"),
        "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c"),
    },
    SIM_GCP: {
        "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c"),
        "us-east4": ("us-east4-a", "us-east4-b", "us-east4-c"),
        "europe-west4": ("europe-west4-a", "europe-west4-b", "europe-west4-c"),
    },
    SIM_AZURE: {
        "eastus": ("eastus-1", "eastus-2", "eastus-3"),
        "westus3": ("westus3-1", "westus3-2", "westus3-3"),
        "westeurope": ("westeurope-1", "westeurope-2", "westeurope-3"),
    },
}

_REGION_PRICE_FACTOR = {
    "us-east-1": 1.0, "us-east-2": 1.0, "us-west-2": 1.0,
    "us-central1": 1.0, "us-east4": 1.04, "europe-west4": 1.1,
    "eastus": 1.0, "westus3": 1.02, "westeurope": 1.12,
}  # fmt: skip

_TYPES: dict[str, tuple[InstanceType, ...]] = {
    SIM_AWS: (
        InstanceType("p5.48xlarge", "H100", 8, 80, Interconnect(Fabric.EFA, 400), 98.32,
                     ("us-east-1", "us-east-2", "us-west-2")),
        InstanceType("p4d.24xlarge", "A100", 8, 40, Interconnect(Fabric.EFA, 50), 32.77,
                     ("us-east-1", "us-west-2")),
        InstanceType("g6e.xlarge", "L40S", 1, 48, _eth(20), 1.86,
                     ("us-east-1", "us-east-2", "us-west-2")),
        InstanceType("p3.2xlarge", "V100", 1, 16, _eth(10), 3.06,
                     ("us-east-1", "us-east-2", "us-west-2")),
        InstanceType("g5.xlarge", "A10G", 1, 24, _eth(10), 1.01,
                     ("us-east-1", "us-east-2", "us-west-2")),
    ),
    SIM_GCP: (
        InstanceType("a3-highgpu-8g", "H100", 8, 80, Interconnect(Fabric.TCPX, 200), 88.25,
                     ("us-central1", "us-east4", "europe-west4")),
        # TCPXO (A3 Mega) has no Fabric member of its own: the TCPX family.
        InstanceType("a3-megagpu-8g", "H100", 8, 80, Interconnect(Fabric.TCPX, 200), 92.10,
                     ("us-central1", "us-east4")),
        InstanceType("a2-highgpu-1g", "A100", 1, 40, _eth(24), 3.67,
                     ("us-central1", "us-east4", "europe-west4")),
        InstanceType("a2-ultragpu-8g", "A100", 8, 80, _eth(12.5), 40.55,
                     ("us-central1", "europe-west4")),
        InstanceType("g2-standard-4", "L4", 1, 24, _eth(10), 0.71,
                     ("us-central1", "us-east4", "europe-west4")),
    ),
    SIM_AZURE: (
        InstanceType("Standard_ND96isr_H100_v5", "H100", 8, 80,
                     Interconnect(Fabric.INFINIBAND, 400), 98.32, ("eastus", "westeurope")),
        InstanceType("Standard_ND96asr_v4", "A100", 8, 40,
                     Interconnect(Fabric.INFINIBAND, 200), 27.20,
                     ("eastus", "westus3", "westeurope")),
        InstanceType("Standard_NC24ads_A100_v4", "A100", 1, 80, _eth(20), 3.67,
                     ("eastus", "westus3", "westeurope")),
        InstanceType("Standard_NC40ads_H100_v5", "H100 NVL", 1, 94, _eth(40), 6.98,
                     ("eastus", "westus3")),
    ),
}  # fmt: skip


def _spot_share(zone: str, type_name: str) -> float:
    # A stable hash (not hash(), which is salted per process) so every
    # process prices a pool the same.
    digest = hashlib.sha256(f"{zone}/{type_name}".encode()).digest()
    low, high = _SPOT_SHARE_RANGE
    return low + (high - low) * (digest[0] / 255)


def _entries(provider: str) -> tuple[CatalogEntry, ...]:
    entries = []
    for itype in _TYPES[provider]:
        for region in itype.regions:
            on_demand = round(itype.on_demand_price * _REGION_PRICE_FACTOR[region], 4)
            for zone in _ZONES[provider][region]:
                entries.append(
                    CatalogEntry(
                        pool=Pool(provider, region, zone, itype.name),
                        instance_type=itype,
                        on_demand_price=on_demand,
                        base_spot_price=round(on_demand * _spot_share(zone, itype.name), 4),
                        notice_seconds=NOTICE_SECONDS[provider],
                    )
                )
    return tuple(entries)


CATALOG: dict[str, tuple[CatalogEntry, ...]] = {p: _entries(p) for p in PROVIDERS}
"""Every pool of every simulated provider."""

_BY_POOL: dict[Pool, CatalogEntry] = {e.pool: e for es in CATALOG.values() for e in es}


def entries(provider: str) -> tuple[CatalogEntry, ...]:
    """The pools of ``provider`` (one of :data:`PROVIDERS`)."""
    try:
        return CATALOG[provider]
    except KeyError:
        raise ValueError(
            f"unknown simulated provider {provider!r} (known: {', '.join(PROVIDERS)})"
        ) from None


def entry(pool: Pool) -> CatalogEntry | None:
    """The catalog entry of ``pool``, None when no simulated provider has it."""
    return _BY_POOL.get(pool)


def all_pools() -> tuple[Pool, ...]:
    """Every pool of the three simulated providers."""
    return tuple(_BY_POOL)
