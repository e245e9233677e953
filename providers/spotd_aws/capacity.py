"""Spot capacity signal: EC2 spot placement scores (1-10) per availability zone.

AWS documents that a score asked for one or two instance types "will always
be low", and spotd asks per type (a pool is one type). The scores are thus a
comparison between zones and types, not a probability; capacity is score/10.
"""

from __future__ import annotations

from collections.abc import Sequence

from .clients import Client
from .errors import map_aws_errors

MAX_SCORE = 10


def placement_scores(
    ec2: Client, instance_type: str, regions: Sequence[str], nodes: int = 1
) -> dict[tuple[str, str], float]:
    """(region, zone id) -> capacity in [0.1, 1.0] of ``nodes`` nodes of ``instance_type``.

    One call covers every region: AWS answers for all ``RegionNames`` from
    any regional endpoint. Raises :class:`~spotd.core.errors.ProviderError`.
    """
    with map_aws_errors("GetSpotPlacementScores"):
        pages = ec2.get_paginator("get_spot_placement_scores").paginate(
            InstanceTypes=[instance_type],
            TargetCapacity=nodes,
            TargetCapacityUnitType="units",
            SingleAvailabilityZone=True,
            RegionNames=list(regions),
        )
        rows = [row for page in pages for row in page.get("SpotPlacementScores", [])]
    scores: dict[tuple[str, str], float] = {}
    for row in rows:
        zone_id = row.get("AvailabilityZoneId")
        if zone_id and "Score" in row:
            score = min(MAX_SCORE, max(1, int(row["Score"])))
            scores[(str(row.get("Region", "")), str(zone_id))] = score / MAX_SCORE
    return scores
