"""EFA network interfaces of a gang node: spotd's table per instance type, AWS's rule.

The rule is the EC2 User Guide's "Maximize network bandwidth on Amazon EC2
instances with multiple network cards" (read 2026-12-04): the primary interface
(network card 0, device index 0) is a plain ENA interface (``interface``: it
carries the node's IP address; an EFA-only interface may not be primary); when
card 0 carries an EFA, it gets an ``efa-only`` interface at device index 1;
every further EFA card gets an ``efa-only`` interface at device index 0. So a
p5.48xlarge asks for 33 interfaces: one ENA and 32 EFA devices.

Which cards carry an EFA is :data:`EFA_LAYOUTS`, checked against each type's
``describe_instance_types`` answer (``NetworkCards``, ``EfaInfo``) when it was
written; ``spotd check-cloud`` compares it with the live answer again. A type
missing from the table gets the same rule applied to the API's answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .clients import Client
from .errors import map_aws_errors

ENA = "interface"
"""``InterfaceType`` of a plain ENA interface (EC2's name for it)."""
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
class EfaLayout:
    """Which network cards of a type carry an EFA (one each)."""

    network_cards: int
    cards: tuple[EfaCard, ...]

    @property
    def efa_interfaces(self) -> int:
        """How many EFA devices a node of the type gets."""
        return len(self.cards)


def _layout(network_cards: int, efa_cards: range) -> EfaLayout:
    # Every EFA card of the types below lists efa-only among its InterfaceTypes.
    return EfaLayout(network_cards, tuple(EfaCard(i, True) for i in efa_cards))


EFA_LAYOUTS: dict[str, EfaLayout] = {
    "p3dn.24xlarge": _layout(1, range(1)),
    "p4d.24xlarge": _layout(4, range(4)),
    "p4de.24xlarge": _layout(4, range(4)),
    "p5.48xlarge": _layout(32, range(32)),
    "p5e.48xlarge": _layout(32, range(32)),
    "p5en.48xlarge": _layout(16, range(16)),
    "p6-b200.48xlarge": _layout(8, range(8)),
    # Card 0 of a p6-b300 is ENA only: its 16 EFAs sit on cards 1-16.
    "p6-b300.48xlarge": _layout(17, range(1, 17)),
    "g5.48xlarge": _layout(1, range(1)),
    "g6.48xlarge": _layout(1, range(1)),
    "g6e.48xlarge": _layout(4, range(4)),
}
"""Instance type -> its network cards and the cards that carry an EFA."""


@dataclass(frozen=True)
class NetworkFacts:
    """What one instance type's ``NetworkInfo`` (and vCPUs) say about a gang launch."""

    instance_type: str
    vcpus: int
    max_efa_interfaces: int = 0
    """0 when the type has no EFA."""
    efa_cards: tuple[EfaCard, ...] = field(default_factory=tuple)
    network_cards: int = 1

    @property
    def efa_interfaces(self) -> int:
        """How many EFA interfaces the API's answer allows a node of this type."""
        return min(self.max_efa_interfaces, len(self.efa_cards))

    def layout(self) -> EfaLayout | None:
        """The type's EFA layout: the table's, else the API's; None without EFA."""
        known = EFA_LAYOUTS.get(self.instance_type)
        if known is not None:
            return known
        if self.efa_interfaces < 1:
            return None
        return EfaLayout(self.network_cards, self.efa_cards[: self.efa_interfaces])


def parse_network_info(row: Mapping[str, Any]) -> NetworkFacts:
    """The facts of one ``InstanceTypes`` row of ``describe_instance_types``."""
    info = row.get("NetworkInfo") or {}
    vcpus = int((row.get("VCpuInfo") or {}).get("DefaultVCpus", 0))
    itype = str(row.get("InstanceType", ""))
    count = max(1, int(info.get("MaximumNetworkCards", 1)))
    if not info.get("EfaSupported"):
        return NetworkFacts(itype, vcpus, network_cards=count)
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
        cards = [EfaCard(i, False) for i in range(count)]
    cards.sort(key=lambda c: c.index)
    return NetworkFacts(itype, vcpus, maximum, tuple(cards), count)


def network_facts(ec2: Client, instance_type: str) -> NetworkFacts:
    """The network facts of one type, asked of the client's region."""
    with map_aws_errors("DescribeInstanceTypes"):
        rows = ec2.describe_instance_types(InstanceTypes=[instance_type]).get("InstanceTypes", [])
    if not rows:
        return NetworkFacts(instance_type, 0)
    return parse_network_info(rows[0])


def table_drift(facts: NetworkFacts) -> str | None:
    """How the table's row for the type differs from EC2's answer; None when it agrees
    (or the type is not in the table)."""
    known = EFA_LAYOUTS.get(facts.instance_type)
    if known is None:
        return None
    capable = {c.index: c for c in facts.efa_cards} if facts.max_efa_interfaces else {}
    problems = []
    if known.network_cards != facts.network_cards:
        problems.append(f"{facts.network_cards} network cards, the table {known.network_cards}")
    if known.efa_interfaces != facts.max_efa_interfaces:
        problems.append(f"at most {facts.max_efa_interfaces} EFAs, the table "
                        f"{known.efa_interfaces}")  # fmt: skip
    wrong = [c.index for c in known.cards if c.index not in capable
             or (c.efa_only and not capable[c.index].efa_only)]  # fmt: skip
    if wrong:
        problems.append(f"card(s) {', '.join(map(str, wrong))} take no EFA-only interface")
    return "; ".join(problems) or None


def efa_interfaces(
    facts: NetworkFacts, subnet_id: str, security_group_ids: Sequence[str]
) -> list[dict[str, Any]]:
    """``run_instances`` ``NetworkInterfaces`` for one node: [] for a type without EFA.

    Every interface gets the subnet and the groups: EC2 refuses a request with
    both ``NetworkInterfaces`` and an instance-level subnet or groups.
    """
    layout = facts.layout()
    if layout is None or not layout.cards:
        return []
    interfaces = [_interface(0, 0, ENA, subnet_id, security_group_ids)]
    for card in layout.cards:
        # Card 0's device index 0 is the ENA primary: its EFA takes device index 1.
        device = 1 if card.index == 0 else 0
        kind = EFA_ONLY if card.efa_only else EFA
        interfaces.append(_interface(card.index, device, kind, subnet_id, security_group_ids))
    return interfaces


def primary_interface(
    subnet_id: str, security_group_ids: Sequence[str], *, public: bool
) -> dict[str, Any]:
    """The one interface of a node without EFA, saying whether it gets a public address
    (which EC2 takes only on a lone primary interface, never with several)."""
    nic: dict[str, Any] = {
        "DeviceIndex": 0, "SubnetId": subnet_id, "DeleteOnTermination": True,
        "AssociatePublicIpAddress": public,
    }  # fmt: skip
    if security_group_ids:
        nic["Groups"] = list(security_group_ids)  # none: the VPC's default group
    return nic


def _interface(
    card: int, device: int, kind: str, subnet_id: str, groups: Sequence[str]
) -> dict[str, Any]:
    return {
        "NetworkCardIndex": card, "DeviceIndex": device, "InterfaceType": kind,
        "SubnetId": subnet_id, "Groups": list(groups), "DeleteOnTermination": True,
    }  # fmt: skip
