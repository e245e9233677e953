"""What a multi-node launch needs besides its instances: placement group, groups, EFA.

``GangPlanner.plan`` works out (and with ``create=True`` makes) the cluster
placement group of the attempt, the gang security group and the nodes' EFA
interfaces; ``launch_params`` then folds the result into ``run_instances``.
A single node needs none of it: it has no peer to reach.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spotd.core.values import LaunchRequest
from spotd.market.ttl import TtlCache

from .clients import AwsClients, Client
from .fabric import NetworkFacts, efa_interfaces, network_facts
from .network import GANG_GROUP, ZoneNetwork, ensure_gang_group, find_group, zone_network
from .placement import ensure_group, group_name
from .settings import AwsSettings

FACTS_TTL_SECONDS = 6 * 3600.0
"""Network facts of a type change only with new hardware: kept for hours."""
OWNER_TAG = "spotd-owner"


@dataclass(frozen=True)
class GangNetwork:
    """The fabric of one gang launch, for ``launch_params``."""

    placement_group: str
    interfaces: tuple[Mapping[str, Any], ...]
    """``NetworkInterfaces`` of each node; empty for a type without EFA."""
    security_group_ids: tuple[str, ...]
    """The nodes' groups (configured or VPC default, plus the gang group if known)."""
    subnet_id: str
    vpc_id: str
    would_create: tuple[str, ...] = ()
    """For a plan made with ``create=False``: what launching would create first."""


class GangPlanner:
    """Plans gang launches for one adapter; caches type facts and group ids."""

    def __init__(
        self, settings: AwsSettings, clients: AwsClients, clock: Callable[[], float]
    ) -> None:
        self._settings = settings
        self._clients = clients
        self._facts: TtlCache[tuple[str, str], NetworkFacts] = TtlCache(FACTS_TTL_SECONDS, clock)
        self._groups: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def facts(self, region: str, instance_type: str) -> NetworkFacts:
        """vCPUs and EFA layout of a type, from ``describe_instance_types`` (cached)."""
        ec2 = self._clients.ec2(region)
        return self._facts.get_or_load(
            (region, instance_type), lambda: network_facts(ec2, instance_type)
        )

    def zone_network(self, region: str, zone: str) -> ZoneNetwork:
        """The subnet the nodes of ``zone`` launch into (configured, else the default one)."""
        ec2 = self._clients.ec2(region)
        return zone_network(ec2, zone, self._settings.subnet_ids.get(zone))

    def private_subnet(self, request: LaunchRequest, gang: GangNetwork | None) -> str | None:
        """The zone's subnet when ``request``'s nodes need a primary interface of their own
        to refuse a public address (``public_address = false``, no EFA); else None."""
        if self._settings.public_address or (gang is not None and gang.interfaces):
            return None
        if gang is not None:
            return gang.subnet_id
        pool = request.offering.pool
        return self.zone_network(pool.region, pool.zone).subnet_id

    def plan(self, request: LaunchRequest, *, create: bool) -> GangNetwork | None:
        """The gang network of ``request``; None for one node that joins no gang.

        A request that joins a running gang (``request.joins``) gets that gang's
        group, subnet, groups and EFA interfaces, as its kept nodes have them.
        With ``create`` the placement group and (if not named in config) the
        gang security group are made, idempotently, before the caller launches.
        Without, nothing is made and ``would_create`` says what would be.
        """
        if request.nodes < 2 and request.joins is None:
            return None
        pool = request.offering.pool
        ec2 = self._clients.ec2(pool.region)
        # Nodes joining a running gang go into its group, named after the launch that made
        # it; a new group would hold them apart from the kept nodes.
        name = group_name(request.tags if request.joins is None else request.joins.tags)
        would = []
        # A joined group is never made here: EC2 refuses one that is gone, and the
        # gang restarts whole.
        if create and request.joins is None:
            ensure_group(ec2, name, request.tags)
        elif request.joins is None:
            would.append(f"cluster placement group {name} in {pool.region}")
        facts = self.facts(pool.region, pool.instance_type)
        net = zone_network(ec2, pool.zone, self._settings.subnet_ids.get(pool.zone))
        groups = list(self._settings.security_group_ids)
        if not groups:
            # Naming any group drops the VPC default one: keep it, as one node gets it.
            default = find_group(ec2, net.vpc_id, "default")
            groups = [default] if default else []
        gang_group = self._gang_group(ec2, pool.region, net.vpc_id, request.tags, create)
        if gang_group is None:
            would.append(f"security group {GANG_GROUP} in {net.vpc_id} "
                         "(all traffic between its members, in and out)")  # fmt: skip
        else:
            groups.append(gang_group)
        return GangNetwork(
            placement_group=name,
            interfaces=tuple(efa_interfaces(facts, net.subnet_id, groups)),
            security_group_ids=tuple(dict.fromkeys(groups)),
            subnet_id=net.subnet_id,
            vpc_id=net.vpc_id,
            would_create=tuple(would),
        )

    def _gang_group(
        self, ec2: Client, region: str, vpc_id: str, tags: Mapping[str, str], create: bool
    ) -> str | None:
        named = self._settings.gang_security_group_ids.get(region)
        if named:
            return named
        key = (region, vpc_id)
        with self._lock:
            known = self._groups.get(key)
        if known is not None:
            return known
        if not create:
            return find_group(ec2, vpc_id, GANG_GROUP)
        owner = {OWNER_TAG: tags[OWNER_TAG]} if tags.get(OWNER_TAG) else {}
        found = ensure_gang_group(ec2, vpc_id, {"Name": GANG_GROUP, **owner})
        with self._lock:
            self._groups[key] = found
        return found
