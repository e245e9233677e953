"""The scale-out network between a gang's nodes: its fabric and its bandwidth per GPU.

Below every other value module: the job spec names fabrics too (``[fabric_env]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Fabric(StrEnum):
    """The scale-out network between nodes (inside a node, NVLink always)."""

    INFINIBAND = "infiniband"
    EFA = "efa"
    ROCE = "roce"
    TCPX = "tcpx"
    TCPXO = "tcpxo"
    ETHERNET = "ethernet"


@dataclass(frozen=True, slots=True)
class Interconnect:
    """Scale-out fabric of an instance type and its bandwidth per GPU."""

    fabric: Fabric
    gbps_per_gpu: float
