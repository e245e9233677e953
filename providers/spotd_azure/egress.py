"""Can a subnet's VMs get out? spotd's Azure VMs never have a public address.

Explicit outbound connectivity for a VM without a public IP is a NAT gateway on
its subnet (Microsoft's recommended way), or a route table sending 0.0.0.0/0 to
a firewall appliance. Without either, a subnet whose ``defaultOutboundAccess``
is not false still gets Azure's implicit default outbound access, which
Microsoft is retiring ("Default outbound access in Azure", read 2026-12-04):
new virtual networks get private subnets, where a VM reaches nothing outside
but, through a ``Microsoft.Storage`` service endpoint, Azure Storage. The
subnet and its route table are read with plain ARM GETs through the compute
client's pipeline (spotd needs no network SDK).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.core.rest import HttpRequest
from azure.mgmt.compute import ComputeManagementClient

from spotd.core.egress import checkpoint_scheme, no_way_out, way_out
from spotd.core.errors import ProviderError
from spotd.core.values import CheckOutcome

from .errors import map_azure_errors

NETWORK_API = "2024-05-01"
"""Version of the network API the subnet and route table are read with."""
ANYWHERE = "0.0.0.0/0"
STORAGE_SCHEMES = frozenset({"az", "abfs", "abfss", "adl"})
FIX = ("Attach a NAT gateway to the subnet (with a Microsoft.Storage service endpoint, "
       "checkpoints on Azure Storage need no NAT)")  # fmt: skip


def _name(resource_id: str) -> str:
    return resource_id.rstrip("/").rsplit("/", 1)[-1]


def _get(compute: ComputeManagementClient, resource_id: str, what: str) -> dict[str, Any]:
    url = f"{resource_id.rstrip('/')}?api-version={NETWORK_API}"
    with map_azure_errors(what):
        response = compute.send_request(HttpRequest("GET", url))
        response.raise_for_status()
        body = response.json()
    return dict(body.get("properties") or {}) if isinstance(body, dict) else {}


def subnet_egress(
    compute: ComputeManagementClient, subnet_id: str, env: Mapping[str, str]
) -> CheckOutcome:
    """The egress outcome of the subnet ``subnet_id``; ``env`` is the request's."""
    where = f"subnet {_name(subnet_id)}"
    props = _get(compute, subnet_id, f"read {where}")
    nat = (props.get("natGateway") or {}).get("id")
    if nat:
        return way_out(where, f"NAT gateway {_name(str(nat))}")
    appliance = _appliance(compute, str((props.get("routeTable") or {}).get("id") or ""))
    if appliance:
        return way_out(where, appliance)
    if props.get("defaultOutboundAccess") is not False:
        return way_out(where, "Azure's implicit default outbound access, which Microsoft is "
                              "retiring: attach a NAT gateway")  # fmt: skip
    store = None
    endpoints = {str(e.get("service", "")) for e in props.get("serviceEndpoints") or []}
    if "Microsoft.Storage" in endpoints and checkpoint_scheme(env) in (None, *STORAGE_SCHEMES):
        store = "the subnet's Microsoft.Storage service endpoint"
    return no_way_out(where, fix=FIX, env=env, store_path=store)


def _appliance(compute: ComputeManagementClient, table_id: str) -> str | None:
    """Where the table sends 0.0.0.0/0, when that is a virtual appliance; else None."""
    if not table_id:
        return None
    try:
        props = _get(compute, table_id, f"read route table {_name(table_id)}")
    except ProviderError:
        return None  # unreadable: the other ways out are still looked at
    for route in props.get("routes") or []:
        inner = route.get("properties") or route
        if inner.get("addressPrefix") == ANYWHERE and inner.get("nextHopType") == \
                "VirtualAppliance":  # fmt: skip
            return (f"appliance {inner.get('nextHopIpAddress', '?')} (route table "
                    f"{_name(table_id)}; its own way out is not checked)")  # fmt: skip
    return None
