"""Cluster placement groups: one per multi-node attempt, named after job and attempt.

A cluster placement group packs a gang's nodes close together in one zone
(low latency, full EFA bandwidth). It costs nothing, but spotd still deletes
it when the attempt ends and reaps it when orphaned, like its instances.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from spotd.core.errors import NotFoundError, ProviderError
from spotd.core.values import PlacementObject

from .clients import Client
from .errors import map_aws_errors

KIND = "placement-group"
"""``PlacementObject.kind`` of a placement group (also its EC2 resource type)."""
JOB_TAG = "spotd-job"
ATTEMPT_TAG = "spotd-attempt"
MAX_NAME = 255
"""AWS: placement group names are up to 255 ASCII characters."""
DUPLICATE = "InvalidPlacementGroup.Duplicate"
UNKNOWN = "InvalidPlacementGroup.Unknown"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def group_name(tags: Mapping[str, str]) -> str:
    """``spotd-<job>-<attempt>``, made of safe characters and cut to AWS's limit.

    A name that had to be cut ends in a hash of the whole, so two long job ids
    sharing a prefix still get two groups.
    """
    parts = ["spotd", *(tags[k] for k in (JOB_TAG, ATTEMPT_TAG) if tags.get(k))]
    name = _UNSAFE.sub("-", "-".join(parts)).strip("-") or "spotd"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: MAX_NAME - len(digest) - 1]}-{digest}"


def placement_id(region: str, name: str) -> str:
    """The PlacementObject id of a group: names are unique per region only."""
    return f"{region}/{name}"


def ensure_group(ec2: Client, name: str, tags: Mapping[str, str]) -> None:
    """Create the cluster group ``name`` tagged with ``tags``; one that exists is kept."""
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    try:
        with map_aws_errors("CreatePlacementGroup"):
            ec2.create_placement_group(
                GroupName=name, Strategy="cluster",
                TagSpecifications=[{"ResourceType": KIND, "Tags": tag_list}],
            )  # fmt: skip
    except ProviderError as exc:
        # A retried launch (same job and attempt) finds the group of its first try.
        if exc.code != DUPLICATE:
            raise


def list_groups(ec2: Client, region: str, tags: Mapping[str, str]) -> list[PlacementObject]:
    """Groups of the client's region carrying all of ``tags`` and made by spotd."""
    filters = [{"Name": "tag-key", "Values": [JOB_TAG]}]
    filters += [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
    with map_aws_errors("DescribePlacementGroups"):
        groups = ec2.describe_placement_groups(Filters=filters).get("PlacementGroups", [])
    return [_to_placement(region, g) for g in groups if g.get("State") != "deleted"]


def delete_group(ec2: Client, name: str) -> None:
    """Delete one group; one already gone is fine.

    While instances are still in it EC2 answers ``InvalidPlacementGroup.InUse``,
    a :class:`~spotd.core.errors.ProviderUnavailable`: the caller tries later.
    """
    try:
        with map_aws_errors("DeletePlacementGroup"):
            ec2.delete_placement_group(GroupName=name)
    except NotFoundError:
        pass


def split_id(placement: PlacementObject) -> tuple[str, str]:
    """(region, group name) of a placement made by this adapter."""
    region, _, name = placement.id.partition("/")
    return placement.region or region, name


def _to_placement(region: str, raw: Mapping[str, Any]) -> PlacementObject:
    tags = {str(t["Key"]): str(t.get("Value", "")) for t in raw.get("Tags") or []}
    return PlacementObject(
        id=placement_id(region, str(raw["GroupName"])), kind=KIND, region=region, tags=tags
    )


def group_names(placements: Sequence[PlacementObject]) -> dict[str, list[str]]:
    """Region -> group names of the placements this adapter made (others are skipped)."""
    by_region: dict[str, list[str]] = {}
    for placement in placements:
        if placement.kind == KIND:
            region, name = split_id(placement)
            by_region.setdefault(region, []).append(name)
    return by_region
