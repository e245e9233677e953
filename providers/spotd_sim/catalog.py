"""The instance types, regions and zones of the three simulated providers.

Instance type names follow the real clouds, and their GPU, memory and fabric
figures come from the instance-type table of the kind each mirrors (found
through :mod:`spotd.registry`), the table the cloud adapters use.
Every price here is a plausible made-up figure in USD per node-hour,
not a quote: real adapters read live prices.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from spotd.core.kinds import InstanceShape
from spotd.core.values import Pool
from spotd.registry import load_kind

SIM_AWS = "sim-aws"
SIM_GCP = "sim-gcp"
SIM_AZURE = "sim-azure"
PROVIDERS = (SIM_AWS, SIM_GCP, SIM_AZURE)

MIRRORS = {SIM_AWS: "aws", SIM_GCP: "gcp", SIM_AZURE: "azure"}
"""Provider -> the kind whose billing, egress, notice and instance types it reproduces."""

NOTICE_SECONDS = {p: load_kind(MIRRORS[p]).notice_seconds for p in PROVIDERS}
"""Preemption notice per provider: AWS two minutes, GCP and Azure about 30 s."""

_SPOT_SHARE_RANGE = (0.30, 0.45)
"""Spot price as a share of on-demand; each (zone, type) gets its own share."""


@dataclass(frozen=True, slots=True)
class _Listing:
    """One instance type the simulator sells: its shape (the mirrored cloud's),
    its on-demand list price and the regions it is sold in."""

    name: str
    shape: InstanceShape
    on_demand_price: float
    regions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """An instance type in one zone, with its base prices."""

    pool: Pool
    shape: InstanceShape
    on_demand_price: float
    base_spot_price: float
    notice_seconds: int


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

def _type(provider: str, name: str, on_demand: float, regions: tuple[str, ...]) -> _Listing:
    """An instance type with the GPU and fabric facts of the cloud it mirrors."""
    known = load_kind(MIRRORS[provider]).instance_types.get(name)
    if known is None:
        raise KeyError(f"{name} is not in the {MIRRORS[provider]} kind's instance types")
    return _Listing(name, known, on_demand, regions)


_US_AWS = ("us-east-1", "us-east-2", "us-west-2")
_GCP_ALL = ("us-central1", "us-east4", "europe-west4")
_AZ_ALL = ("eastus", "westus3", "westeurope")

# On-demand list prices are plausible made-up figures in USD per node-hour,
# of the order of the clouds' 2026 list prices, not quotes.
_TYPES: dict[str, tuple[_Listing, ...]] = {
    SIM_AWS: (
        _type(SIM_AWS, "p5.48xlarge", 98.32, _US_AWS),
        _type(SIM_AWS, "p6-b300.48xlarge", 142.40, ("us-east-1", "us-west-2")),
        _type(SIM_AWS, "p4d.24xlarge", 32.77, ("us-east-1", "us-west-2")),
        _type(SIM_AWS, "g6e.xlarge", 1.86, _US_AWS),
        _type(SIM_AWS, "p3.2xlarge", 3.06, _US_AWS),
        _type(SIM_AWS, "g5.xlarge", 1.01, _US_AWS),
    ),
    SIM_GCP: (
        _type(SIM_GCP, "a3-highgpu-8g", 88.25, _GCP_ALL),
        _type(SIM_GCP, "a3-megagpu-8g", 92.10, ("us-central1", "us-east4")),
        _type(SIM_GCP, "a2-highgpu-1g", 3.67, _GCP_ALL),
        _type(SIM_GCP, "a2-ultragpu-8g", 40.55, ("us-central1", "europe-west4")),
        _type(SIM_GCP, "g2-standard-4", 0.71, _GCP_ALL),
    ),
    SIM_AZURE: (
        _type(SIM_AZURE, "Standard_ND96isr_H100_v5", 98.32, ("eastus", "westeurope")),
        _type(SIM_AZURE, "Standard_ND96asr_v4", 27.20, _AZ_ALL),
        _type(SIM_AZURE, "Standard_NC24ads_A100_v4", 3.67, _AZ_ALL),
        _type(SIM_AZURE, "Standard_NC40ads_H100_v5", 6.98, ("eastus", "westus3")),
    ),
}


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
                        shape=itype.shape,
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
