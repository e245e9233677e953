"""Can VMs without an external address get out of their region? Cloud NAT, or
Private Google Access for Cloud Storage alone.

With ``external_ip = false`` nic0 has no external address. The VM then reaches
the internet (the daemon, the package index) only through Cloud NAT on a Cloud
Router of nic0's network in the VM's region; without it, Private Google Access
on the region's subnets still reaches Google APIs, so checkpoints on Cloud
Storage. The GPU NICs of A3 and A4 never carry such traffic. Read-only calls:
``routers.list`` and ``subnetworks.list`` of the region.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotd.core.egress import checkpoint_scheme, no_way_out, public_nodes, way_out
from spotd.core.values import CheckOutcome

from .clients import GcpClients
from .errors import map_gcp_errors

GCS_SCHEMES = frozenset({"gs", "gcs"})
FIX = ("Add Cloud NAT on a Cloud Router of that network in the region (and Private "
       "Google Access on its subnet for Cloud Storage), or set "
       "providers.gcp.external_ip = true")  # fmt: skip


def _name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def region_egress(
    clients: GcpClients,
    network: str,
    region: str,
    env: Mapping[str, str],
    *,
    external_ip: bool,
    timeout: float,
) -> CheckOutcome:
    """The egress outcome of ``network`` (nic0's) in ``region``; ``env`` is the request's."""
    where = f"network {_name(network)} in {region}"
    if external_ip:
        return public_nodes(where, "external_ip = true")
    nat = cloud_nat(clients, network, region, timeout)
    if nat is not None:
        return way_out(where, nat)
    store = None
    if checkpoint_scheme(env) in (None, *GCS_SCHEMES):
        store = private_google_access(clients, network, region, timeout)
    return no_way_out(where, fix=FIX, env=env, store_path=store)


def cloud_nat(clients: GcpClients, network: str, region: str, timeout: float) -> str | None:
    """The Cloud NAT of ``network`` in ``region`` (``Cloud NAT router/nat``), else None."""
    with map_gcp_errors(f"routers of {region}"):
        routers: list[Any] = list(clients.routers.list(
            project=clients.project, region=region, retry=None, timeout=timeout))  # fmt: skip
    for router in routers:
        if _name(str(router.network)) != _name(network):
            continue
        for nat in router.nats:
            return f"Cloud NAT {router.name}/{nat.name}"
    return None


def private_google_access(
    clients: GcpClients, network: str, region: str, timeout: float
) -> str | None:
    """The subnets of ``network`` in ``region`` when every one has Private Google Access
    (a VM may land in any of them), as a phrase; else None."""
    with map_gcp_errors(f"subnetworks of {region}"):
        subnets = [s for s in clients.subnetworks.list(
            project=clients.project, region=region, retry=None, timeout=timeout)
            if _name(str(s.network)) == _name(network)]  # fmt: skip
    if not subnets or not all(s.private_ip_google_access for s in subnets):
        return None
    return "Private Google Access on " + ", ".join(sorted(str(s.name) for s in subnets))
