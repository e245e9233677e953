"""GPU VM prices from the Cloud Billing Catalog.

Compute Engine does not price machine types: the catalog prices resources.
An accelerator-optimized VM (A2, A3, A4, G2) is billed as three SKUs, so

    price per hour = GPU SKU x GPUs + core SKU x vCPUs + RAM SKU x GiB

each for the VM's region and usage type (``OnDemand``; ``Preemptible`` is
what the catalog calls Spot). SKUs are matched by ``category.resource_group``
(``GPU``, ``CPU``, ``RAM``) and an anchored pattern on ``description``:

- core of family F: ``F Instance Core running in <location>``
- RAM of family F: ``F Instance Ram running in <location>``
- GPU: ``<GPU_SKUS name> running in <location>``, e.g. ``Nvidia H100 80GB GPU running in Americas``

each with an optional ``Spot Preemptible`` prefix (and, for GPUs, an optional
``attached to Spot Preemptible VMs`` suffix); the usage type, not the text,
says spot or on-demand.
Commitments, reservations, sole tenancy and other usage types never match.
A price is only given when all three parts are found; otherwise it is None,
never a guess. Unit price = the last tier of ``pricing_info[0]``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from google.cloud import billing_v1

from spotd.core.values import Market

from .machines import MachineType

log = logging.getLogger(__name__)

COMPUTE_SERVICE = "services/6F81-5844-456A"
"""The Compute Engine service in the Cloud Billing Catalog."""

Part = Literal["gpu", "core", "ram"]

USAGE_TYPES: dict[str, Market] = {"OnDemand": Market.ON_DEMAND, "Preemptible": Market.SPOT}
EXPECTED_UNITS: dict[Part, str] = {"gpu": "h", "core": "h", "ram": "GiBy.h"}

def list_skus_request() -> billing_v1.ListSkusRequest:
    """The catalog call for every Compute Engine SKU priced in USD (paged)."""
    return billing_v1.ListSkusRequest(parent=COMPUTE_SERVICE, currency_code="USD")


GPU_SKUS: dict[str, str] = {
    "nvidia-tesla-a100": "Nvidia Tesla A100 GPU",
    "nvidia-a100-80gb": "Nvidia Tesla A100 80GB GPU",
    "nvidia-h100-80gb": "Nvidia H100 80GB GPU",
    "nvidia-h100-mega-80gb": "Nvidia H100 80GB Mega GPU",
    "nvidia-h200-141gb": "Nvidia H200 141GB GPU",
    "nvidia-b200": "Nvidia B200 GPU",
    "nvidia-l4": "Nvidia L4 GPU",
    "nvidia-tesla-t4": "Nvidia Tesla T4 GPU",
    "nvidia-tesla-v100": "Nvidia Tesla V100 GPU",
}
"""GCE accelerator type -> the GPU's name in SKU descriptions."""

_SPOT_PREFIX = r"(?:Spot Preemptible )?"
_SPOT_SUFFIX = r"(?: attached to Spot Preemptible VMs)?"
_LOCATION = r" running in [A-Za-z0-9 ,()/-]+"
# N1 (the family GPUs are attached to) says "N1 Predefined Instance Core" under group N1Standard.
_FAMILY_RE = re.compile(
    rf"^{_SPOT_PREFIX}([A-Z][0-9]) (?:Predefined )?Instance (Core|Ram){_LOCATION}$"
)
_FAMILY_GROUPS = frozenset({"CPU", "RAM", "N1Standard"})
_GPU_RES = {
    accel: re.compile(rf"^{_SPOT_PREFIX}{re.escape(name)}{_SPOT_SUFFIX}{_LOCATION}$")
    for accel, name in GPU_SKUS.items()
}


@dataclass(frozen=True, slots=True)
class SkuKey:
    """What one SKU prices: a part (of a family or GPU type), a market, a region."""

    part: Part
    item: str
    """The machine family (``A2``) for core and RAM, the accelerator type for GPUs."""
    market: Market
    region: str


def unit_price(sku: Any) -> float | None:
    """USD per unit of the SKU's last pricing tier, None when it has none."""
    if not sku.pricing_info:
        return None
    rates = sku.pricing_info[0].pricing_expression.tiered_rates
    if not rates:
        return None
    money = rates[-1].unit_price
    return int(money.units) + int(money.nanos) / 1e9


def _what(group: str, description: str) -> tuple[Part, str] | None:
    if group in _FAMILY_GROUPS:
        match = _FAMILY_RE.match(description)
        if match is None:
            return None
        part: Part = "core" if match.group(2) == "Core" else "ram"
        return part, match.group(1)
    if group == "GPU":
        for accel, pattern in _GPU_RES.items():
            if pattern.match(description):
                return "gpu", accel
    return None


def sku_keys(sku: Any) -> list[SkuKey]:
    """The keys one SKU prices (one per service region), empty when not ours."""
    market = USAGE_TYPES.get(sku.category.usage_type)
    what = _what(sku.category.resource_group, sku.description)
    if market is None or what is None:
        return []
    part, item = what
    unit = sku.pricing_info[0].pricing_expression.usage_unit if sku.pricing_info else ""
    if unit != EXPECTED_UNITS[part]:
        log.warning("gcp: SKU %r is priced per %r, not %r: ignored",
                    sku.description, unit, EXPECTED_UNITS[part])
        return []
    return [SkuKey(part, item, market, region) for region in sku.service_regions]


class PriceBook:
    """Unit prices by :class:`SkuKey`, built from the catalog's SKUs."""

    def __init__(self, skus: Iterable[Any]) -> None:
        self._prices: dict[SkuKey, float] = {}
        for sku in skus:
            price = unit_price(sku)
            if price is None:
                continue
            for key in sku_keys(sku):
                self._prices[key] = price

    def __len__(self) -> int:
        return len(self._prices)

    def get(self, key: SkuKey) -> float | None:
        """The unit price of ``key``, None when the catalog has no such SKU."""
        return self._prices.get(key)

    def vm_price(self, machine: MachineType, region: str, market: Market) -> float | None:
        """USD per hour of one VM of ``machine`` in ``region``; None unless fully priced."""
        gpu = self.get(SkuKey("gpu", machine.accelerator, market, region))
        core = self.get(SkuKey("core", machine.family, market, region))
        ram = self.get(SkuKey("ram", machine.family, market, region))
        if gpu is None or core is None or ram is None:
            return None
        return gpu * machine.gpus + core * machine.vcpus + ram * machine.memory_gib
