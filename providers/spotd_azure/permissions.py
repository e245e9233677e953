"""The RBAC actions the adapter and ``check-cloud`` use, and how a permission list grants them.

``docs/providers-azure.md`` prints these as a custom role definition; a test
keeps the two the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase

GROUP_ACTIONS: tuple[str, ...] = (
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/virtualMachines/delete",
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachineScaleSets/write",
    "Microsoft.Compute/virtualMachineScaleSets/delete",
    "Microsoft.Compute/virtualMachineScaleSets/delete/action",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read",
    "Microsoft.Compute/disks/delete",
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Network/networkInterfaces/delete",
    "Microsoft.Network/networkInterfaces/join/action",
)
"""Actions on spotd's resource group: its VMs, scale sets, and the NICs and disks they own."""

SUBNET_ACTIONS: tuple[str, ...] = (
    "Microsoft.Network/virtualNetworks/subnets/join/action",
    "Microsoft.Network/virtualNetworks/subnets/read",
)
"""Actions on each configured subnet (a NIC joins it, ``check-cloud`` reads its way out;
spotd never changes it)."""

NETWORK_READS: tuple[str, ...] = ("Microsoft.Network/routeTables/read",)
"""Reads of the subnets' route tables, wherever they are (``check-cloud``'s egress check)."""

SUBSCRIPTION_READS: tuple[str, ...] = (
    "Microsoft.Compute/skus/read",
    "Microsoft.Compute/locations/usages/read",
    "Microsoft.Compute/locations/operations/read",
    "Microsoft.Compute/locations/publishers/artifacttypes/offers/skus/versions/read",
    "Microsoft.Authorization/permissions/read",
)
"""Reads at subscription scope: SKUs, quotas, operation status, images, own permissions."""

ALL_ACTIONS: tuple[str, ...] = GROUP_ACTIONS + SUBNET_ACTIONS + NETWORK_READS + SUBSCRIPTION_READS

Permission = Mapping[str, Sequence[str]]
"""One entry of ``Microsoft.Authorization/permissions``: ``actions`` and ``notActions``."""


def _matches(pattern: str, action: str) -> bool:
    # Role actions are case-insensitive and use * as the only wildcard.
    return fnmatchcase(action.lower(), pattern.lower().replace("[", "[[]"))


def allows(permissions: Iterable[Permission], action: str) -> bool:
    """Whether some entry grants ``action`` (in its ``actions`` and not its ``notActions``)."""
    for entry in permissions:
        granted = any(_matches(p, action) for p in entry.get("actions", ()))
        denied = any(_matches(p, action) for p in entry.get("notActions", ()))
        if granted and not denied:
            return True
    return False


def missing(permissions: Iterable[Permission], actions: Iterable[str]) -> list[str]:
    """The actions among ``actions`` that ``permissions`` do not grant."""
    entries = list(permissions)
    return [a for a in actions if not allows(entries, a)]
