"""The subnet and security groups of a gang: where its interfaces go and who they may reach.

EFA's OS bypass needs every EFA interface in a security group that allows
all traffic in from and out to itself (EC2 User Guide, "Prepare an
EFA-enabled security group"). Such a group is named in config
(``gang_security_group_ids``, region -> group) or, when none is named, spotd
makes one per VPC, ``spotd-gang``, with exactly those two rules. spotd never
changes a group it did not make, and never deletes the one it made (it is
free and shared by every gang in the VPC).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotd.core.errors import ProviderError

from .clients import Client
from .errors import PROVIDER, map_aws_errors

GANG_GROUP = "spotd-gang"
"""Name of the security group spotd makes for gangs in a VPC."""
GANG_GROUP_DESCRIPTION = "spotd gangs: all traffic between members (EFA)"
PURPOSE_TAG = "spotd:purpose"
_DUPLICATE_RULE = "InvalidPermission.Duplicate"
_DUPLICATE_GROUP = "InvalidGroup.Duplicate"


@dataclass(frozen=True)
class ZoneNetwork:
    """The subnet a zone's nodes launch into and its VPC."""

    subnet_id: str
    vpc_id: str
    maps_public_ip: bool = True
    """The subnet's ``MapPublicIpOnLaunch``: whether a lone interface gets a public address."""


def zone_network(ec2: Client, zone: str, subnet_id: str | None) -> ZoneNetwork:
    """The configured subnet of ``zone``, else the zone's default subnet.

    Interfaces given to ``run_instances`` each need a subnet, so the default
    one the instance would have got is looked up and named.
    """
    request: dict[str, Any]
    if subnet_id:
        request = {"SubnetIds": [subnet_id]}
    else:
        request = {"Filters": [{"Name": "availability-zone", "Values": [zone]},
                               {"Name": "default-for-az", "Values": ["true"]}]}  # fmt: skip
    with map_aws_errors("DescribeSubnets"):
        subnets = ec2.describe_subnets(**request).get("Subnets", [])
    if not subnets:
        raise ProviderError(
            f"aws: no subnet for zone {zone}: set providers.aws.subnet_ids for it",
            provider=PROVIDER, code="InvalidRequest",
        )  # fmt: skip
    found = subnets[0]
    return ZoneNetwork(str(found["SubnetId"]), str(found["VpcId"]),
                       bool(found.get("MapPublicIpOnLaunch", False)))  # fmt: skip


def find_group(ec2: Client, vpc_id: str, name: str) -> str | None:
    """The id of the security group ``name`` in the VPC, None if there is none."""
    filters = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
    with map_aws_errors("DescribeSecurityGroups"):
        groups = ec2.describe_security_groups(Filters=filters).get("SecurityGroups", [])
    return str(groups[0]["GroupId"]) if groups else None


def ensure_gang_group(ec2: Client, vpc_id: str, tags: Mapping[str, str]) -> str:
    """The id of ``spotd-gang`` in the VPC, made with its self-referencing rules if missing."""
    group_id = find_group(ec2, vpc_id, GANG_GROUP)
    if group_id is None:
        group_id = _create_group(ec2, vpc_id, tags)
    # Also for a group found: a first try may have died between creating and authorizing.
    _allow_self(ec2, group_id)
    return group_id


def _create_group(ec2: Client, vpc_id: str, tags: Mapping[str, str]) -> str:
    tag_list = [{"Key": k, "Value": v} for k, v in {**tags, PURPOSE_TAG: "gang"}.items()]
    try:
        with map_aws_errors("CreateSecurityGroup"):
            reply = ec2.create_security_group(
                GroupName=GANG_GROUP, Description=GANG_GROUP_DESCRIPTION, VpcId=vpc_id,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": tag_list}],
            )  # fmt: skip
        return str(reply["GroupId"])
    except ProviderError as exc:
        # Another launch made it in the meantime.
        found = find_group(ec2, vpc_id, GANG_GROUP) if exc.code == _DUPLICATE_GROUP else None
        if found is None:
            raise
        return found


def _allow_self(ec2: Client, group_id: str) -> None:
    rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}]
    for action, call in (
        ("AuthorizeSecurityGroupIngress", ec2.authorize_security_group_ingress),
        ("AuthorizeSecurityGroupEgress", ec2.authorize_security_group_egress),
    ):
        try:
            with map_aws_errors(action):
                call(GroupId=group_id, IpPermissions=rule)
        except ProviderError as exc:
            if exc.code != _DUPLICATE_RULE:
                raise
