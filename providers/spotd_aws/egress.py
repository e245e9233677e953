"""Can a subnet's nodes without a public address get out? Its route table and endpoints.

A node gets no public IPv4 address when ``public_address = false``, when it has
several interfaces (every EFA gang node: EC2 gives one only to a lone
interface), or when its subnet does not map one on launch. It then needs the
subnet's route table to send 0.0.0.0/0 to a NAT gateway (or to an appliance or
transit gateway that gets out) to reach the daemon and the package index; an S3
gateway or interface endpoint in the VPC still serves checkpoints on S3 without
one. Read-only calls: ``DescribeRouteTables``, ``DescribeVpcEndpoints``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotd.core.egress import checkpoint_scheme, no_way_out, public_nodes, way_out
from spotd.core.values import CheckOutcome

from .clients import Client
from .errors import map_aws_errors
from .network import ZoneNetwork

ANYWHERE = "0.0.0.0/0"
S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})
_APPLIANCES = (("TransitGatewayId", "transit gateway"), ("NetworkInterfaceId", "interface"),
               ("InstanceId", "instance"))  # fmt: skip
FIX = ("Give the subnet's route table a 0.0.0.0/0 route to a NAT gateway (and an S3 gateway "
       "endpoint for checkpoints), or launch nodes without EFA into a public subnet with "
       "providers.aws.public_address = true")  # fmt: skip


def public_reason(net: ZoneNetwork, *, wanted: bool, interfaces: int) -> str | None:
    """Why the nodes get a public address; None when they get none."""
    if not wanted or interfaces > 1 or not net.maps_public_ip:
        return None
    return f"subnet {net.subnet_id} maps one on launch"


def subnet_egress(
    ec2: Client, region: str, net: ZoneNetwork, env: Mapping[str, str], public: str | None
) -> CheckOutcome:
    """The egress outcome of ``net`` for nodes with a public address (``public``, the
    reason) or without one (None); ``env`` is the request's, for its checkpoint URI."""
    where = f"subnet {net.subnet_id}"
    if public is not None:
        return public_nodes(where, public)
    table = route_table(ec2, net)
    routes = [r for r in (table or {}).get("Routes", [])
              if r.get("DestinationCidrBlock") == ANYWHERE
              and r.get("State", "active") == "active"]  # fmt: skip
    for route in routes:
        if route.get("NatGatewayId"):
            return way_out(where, f"NAT gateway {route['NatGatewayId']}")
    for route in routes:
        for key, what in _APPLIANCES:
            if route.get(key):
                return way_out(where, f"{what} {route[key]} (its own way out is not checked)")
    store = None
    if checkpoint_scheme(env) in (None, *S3_SCHEMES):
        store = s3_endpoint(ec2, region, net.vpc_id, (table or {}).get("RouteTableId"))
    return no_way_out(where, fix=FIX, env=env, store_path=store)


def route_table(ec2: Client, net: ZoneNetwork) -> dict[str, Any] | None:
    """The subnet's route table: its own association, else the VPC's main table."""
    with map_aws_errors("DescribeRouteTables"):
        tables = ec2.describe_route_tables(
            Filters=[{"Name": "association.subnet-id", "Values": [net.subnet_id]}]
        )["RouteTables"]
        if not tables:
            tables = ec2.describe_route_tables(
                Filters=[
                    {"Name": "vpc-id", "Values": [net.vpc_id]},
                    {"Name": "association.main", "Values": ["true"]},
                ]
            )["RouteTables"]
    return dict(tables[0]) if tables else None  # fmt: skip


def s3_endpoint(ec2: Client, region: str, vpc_id: str, table_id: str | None) -> str | None:
    """The VPC's S3 endpoint that serves the subnet ("S3 gateway endpoint vpce-..."), None
    when there is none: a gateway endpoint must be on the subnet's route table."""
    service = f"com.amazonaws.{region}.s3"
    with map_aws_errors("DescribeVpcEndpoints"):
        endpoints = ec2.describe_vpc_endpoints(Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "service-name", "Values": [service]}])["VpcEndpoints"]  # fmt: skip
    for endpoint in endpoints:
        if endpoint.get("State", "available").lower() != "available":
            continue
        kind = str(endpoint.get("VpcEndpointType", "Gateway"))
        if kind == "Gateway" and table_id not in (endpoint.get("RouteTableIds") or []):
            continue
        return f"S3 {kind.lower()} endpoint {endpoint['VpcEndpointId']}"
    return None
