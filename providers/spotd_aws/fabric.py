"""EFA network interfaces of a gang node, laid out from ``describe_instance_types``.

The layout follows AWS's "EFA configuration for P5 and P5e instances" (EC2
User Guide, "Maximize network bandwidth on instances with multiple network
cards"): the primary interface is network card 0, device index 0, an EFA with
ENA (``efa``) so it carries the node's IP address (an EFA-only interface may
not be primary); every further EFA-capable card gets one interface at device
index 1, EFA-only (``efa-only``: no IP address used) where the card offers
that type. How many: the type's ``EfaInfo.MaximumEfaInterfaces``, at most one
per EFA-capable card. No hand table: p4d gets 4, p5 32, p5en 16, g5.48xlarge 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .clients import Client
from .errors import map_aws_errors

EFA = "efa"
EFA_ONLY = "efa-only"
EFA_TYPES = frozenset({EFA, EFA_ONLY})
"""``InterfaceType`` values that are EFA devices."""


@dataclass(frozen=True)
class EfaCard:
    """One network card that can carry an EFA device."""

    index: int
    efa_only: bool
    """Whether the card offers EFA-only interfaces (it lists ``efa-only``)."""


@dataclass(frozen=True)
class NetworkFacts:
    """What one instance type's ``NetworkInfo`` (and vCPUs) say about a gang launch."""

    instance_type: str
    vcpus: int
    max_efa_interfaces: int = 0
    """0 when the type has no EFA."""
    efa_cards: tuple[EfaCard, ...] = field(default_factory=tuple)

    @property
    def efa_interfaces(self) -> int:
        """How many EFA interfaces a node of this type gets from spotd."""
        return min(self.max_efa_interfaces, len(self.efa_cards))


def parse_network_info(row: Mapping[str, Any]) -> NetworkFacts:
    """The facts of one ``InstanceTypes`` row of ``describe_instance_types``."""
    info = row.get("NetworkInfo") or {}
    vcpus = int((row.get("VCpuInfo") or {}).get("DefaultVCpus", 0))
    itype = str(row.get("InstanceType", ""))
    if not info.get("EfaSupported"):
        return NetworkFacts(itype, vcpus)
    maximum = int((info.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0))
    cards = []
    for card in info.get("NetworkCards") or []:
        # A card without InterfaceTypes (older API answers) is taken as EFA-capable:
        # the type as a whole says it supports EFA.
        types = set(card.get("InterfaceTypes") or [EFA])
        if types & EFA_TYPES:
            cards.append(EfaCard(int(card.get("NetworkCardIndex", 0)), EFA_ONLY in types))
    if not cards:
        # No card list at all: MaximumNetworkCards cards, numbered from 0.
        count = max(1, int(info.get("MaximumNetworkCards", 1)))
        cards = [EfaCard(i, False) for i in range(count)]
    cards.sort(key=lambda c: c.index)
    return NetworkFacts(itype, vcpus, maximum, tuple(cards))


def network_facts(ec2: Client, instance_type: str) -> NetworkFacts:
    """The network facts of one type, asked of the client's region."""
    with map_aws_errors("DescribeInstanceTypes"):
        rows = ec2.describe_instance_types(InstanceTypes=[instance_type]).get("InstanceTypes", [])
    if not rows:
        return NetworkFacts(instance_type, 0)
    return parse_network_info(rows[0])


def efa_interfaces(
    facts: NetworkFacts, subnet_id: str, security_group_ids: Sequence[str]
) -> list[dict[str, Any]]:
    """``run_instances`` ``NetworkInterfaces`` for one node: [] for a type without EFA.

    Every interface gets the subnet and the groups: EC2 refuses a request with
    both ``NetworkInterfaces`` and an instance-level subnet or groups.
    """
    wanted = facts.efa_interfaces
    if wanted < 1:
        return []
    cards = facts.efa_cards[:wanted]
    # The primary interface must be card 0, device 0; if card 0 carries no EFA, a
    # plain ENA interface takes that place and every EFA goes to device index 1.
    plain_primary = cards[0].index != 0
    interfaces = []
    if plain_primary:
        interfaces.append(_interface(0, 0, "interface", subnet_id, security_group_ids))
    for position, card in enumerate(cards):
        primary = position == 0 and not plain_primary
        kind = EFA if primary or not card.efa_only else EFA_ONLY
        device = 0 if primary else 1
        interfaces.append(_interface(card.index, device, kind, subnet_id, security_group_ids))
    return interfaces


def _interface(
    card: int, device: int, kind: str, subnet_id: str, groups: Sequence[str]
) -> dict[str, Any]:
    return {
        "NetworkCardIndex": card, "DeviceIndex": device, "InterfaceType": kind,
        "SubnetId": subnet_id, "Groups": list(groups), "DeleteOnTermination": True,
    }  # fmt: skip
