"""Which GPU types each zone offers, and what GPUs they carry, from the EC2 API.

Both change rarely (new zones, new types), so the adapter caches them for
hours; only prices and capacity are read on every poll.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from spotd.core.kinds import InstanceShape
from spotd.market.catalog import interconnect

from .clients import Client
from .errors import map_aws_errors
from .figures import NAME

log = logging.getLogger(__name__)

MIB_PER_GB = 1024


def zones_offering(ec2: Client, instance_types: Iterable[str]) -> dict[str, set[str]]:
    """Instance type -> the availability zones (names) of the client's region offering it."""
    wanted = sorted(set(instance_types))
    found: dict[str, set[str]] = {}
    if not wanted:
        return found
    with map_aws_errors("DescribeInstanceTypeOfferings"):
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": wanted}],
        )
        for page in pages:
            for row in page.get("InstanceTypeOfferings", []):
                found.setdefault(str(row["InstanceType"]), set()).add(str(row["Location"]))
    return found


def gpu_types(ec2: Client, instance_types: Iterable[str]) -> dict[str, InstanceShape]:
    """The shapes of the given types, by type; types without GPUs are left out with a warning.

    Pass only types the region offers: AWS rejects the whole call for one it does not know.
    """
    wanted = sorted(set(instance_types))
    found: dict[str, InstanceShape] = {}
    if not wanted:
        return found
    with map_aws_errors("DescribeInstanceTypes"):
        pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted)
        rows = [row for page in pages for row in page.get("InstanceTypes", [])]
    for row in rows:
        gpu = parse_gpu_info(row)
        if gpu is None:
            log.warning("aws: %s has no GPUs; left out of the offerings", row.get("InstanceType"))
        else:
            found[str(row["InstanceType"])] = gpu
    return found


def parse_gpu_info(row: Mapping[str, Any]) -> InstanceShape | None:
    """The shape of one ``InstanceTypes`` row (its GPUs from the row, its fabric from
    the kind's table), None when it has no GPU."""
    gpus = (row.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus:
        return None
    # GPU instances carry one model; several entries would mean a mixed node.
    first = gpus[0]
    count = sum(int(g.get("Count", 0)) for g in gpus)
    mib = int((first.get("MemoryInfo") or {}).get("SizeInMiB", 0))
    gpus_per_node = max(1, count)
    return InstanceShape(
        gpu=str(first.get("Name") or "unknown"),
        gpus_per_node=gpus_per_node,
        gpu_memory_gb=round(mib / MIB_PER_GB),
        interconnect=interconnect(NAME, str(row["InstanceType"]), gpus_per_node),
    )


def zone_ids(ec2: Client) -> dict[str, str]:
    """Zone id (``use1-az4``) -> zone name (``us-east-1a``) in the client's region.

    Placement scores name zones by id, which is the same physical zone in
    every account, while launches and prices use the account's zone names.
    """
    with map_aws_errors("DescribeAvailabilityZones"):
        zones = ec2.describe_availability_zones().get("AvailabilityZones", [])
    return {str(z["ZoneId"]): str(z["ZoneName"]) for z in zones if "ZoneId" in z}
