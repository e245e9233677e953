"""What each known GPU instance type of the three clouds has: GPUs and scale-out fabric.

The policy weighs a job's model size against the bandwidth per GPU of the
fabric between nodes, so this table matters as much as prices do. Adapters
take GPU model and count from the cloud's API where it gives them and the
fabric from here; a type not listed gets a conservative Ethernet figure and a
logged warning, so it is never mistaken for a fast fabric.

Sources (figures per node, divided by the GPUs of the node):
- AWS: "Amazon EC2 accelerated computing instance specifications" (network
  bandwidth and EFA columns) for P3, P4d/P4de, P5/P5e/P5en, P6-B200, P6-B300
  (6,400 Gbps EFAv4 per node, 800 per GPU), G5, G6, G6e.
- GCP: "GPU machine types" and "A3 / A4 machine series" pages (A3 High:
  GPUDirect-TCPX 1,000 Gbps; A3 Mega: GPUDirect-TCPXO 1,800 Gbps; A3 Ultra and
  A4: 3,200 Gbps GPU RDMA over RoCE). A2 figures from public secondary sources.
- Azure: "ND A100 v4", "ND H100 v5", "ND H200 v5", "NC A100 v4",
  "NCads H100 v5" size pages (HDR 200 Gb/s or NDR 400 Gb/s InfiniBand per GPU;
  NC sizes have no InfiniBand).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from spotd.domain import Fabric, Interconnect

log = logging.getLogger(__name__)

UNKNOWN_NODE_GBPS = 10.0
"""Scale-out bandwidth assumed per node for a type not in the table."""


@dataclass(frozen=True, slots=True)
class TypeFacts:
    """GPU and network facts of one instance type."""

    gpu: str
    gpus_per_node: int
    gpu_memory_gb: int
    interconnect: Interconnect


def _t(gpu: str, n: int, mem: int, fabric: Fabric, node_gbps: float) -> TypeFacts:
    return TypeFacts(gpu, n, mem, Interconnect(fabric, node_gbps / n))


E, EFA, IB, ROCE = Fabric.ETHERNET, Fabric.EFA, Fabric.INFINIBAND, Fabric.ROCE

CATALOG: dict[str, dict[str, TypeFacts]] = {
    "aws": {
        "p3.2xlarge": _t("V100", 1, 16, E, 10),
        "p3.8xlarge": _t("V100", 4, 16, E, 10),
        "p3.16xlarge": _t("V100", 8, 16, E, 25),
        "p3dn.24xlarge": _t("V100", 8, 32, EFA, 100),
        "p4d.24xlarge": _t("A100", 8, 40, EFA, 400),
        "p4de.24xlarge": _t("A100", 8, 80, EFA, 400),
        "p5.48xlarge": _t("H100", 8, 80, EFA, 3200),
        "p5e.48xlarge": _t("H200", 8, 141, EFA, 3200),
        "p5en.48xlarge": _t("H200", 8, 141, EFA, 3200),
        "p6-b200.48xlarge": _t("B200", 8, 180, EFA, 3200),
        "p6-b300.48xlarge": _t("B300", 8, 288, EFA, 6400),
        "g5.xlarge": _t("A10G", 1, 24, E, 10),
        "g5.2xlarge": _t("A10G", 1, 24, E, 10),
        "g5.4xlarge": _t("A10G", 1, 24, E, 25),
        "g5.12xlarge": _t("A10G", 4, 24, E, 40),
        "g5.48xlarge": _t("A10G", 8, 24, EFA, 100),
        "g6.xlarge": _t("L4", 1, 24, E, 10),
        "g6.4xlarge": _t("L4", 1, 24, E, 25),
        "g6.48xlarge": _t("L4", 8, 24, EFA, 100),
        "g6e.xlarge": _t("L40S", 1, 48, E, 20),
        "g6e.48xlarge": _t("L40S", 8, 48, EFA, 400),
    },
    "gcp": {
        "a2-highgpu-1g": _t("A100", 1, 40, E, 24),
        "a2-highgpu-8g": _t("A100", 8, 40, E, 100),
        "a2-ultragpu-1g": _t("A100", 1, 80, E, 24),
        "a2-ultragpu-8g": _t("A100", 8, 80, E, 100),
        "a3-highgpu-8g": _t("H100", 8, 80, Fabric.TCPX, 1000),
        "a3-megagpu-8g": _t("H100", 8, 80, Fabric.TCPXO, 1800),
        "a3-ultragpu-8g": _t("H200", 8, 141, ROCE, 3200),
        "a4-highgpu-8g": _t("B200", 8, 180, ROCE, 3200),
        "g2-standard-4": _t("L4", 1, 24, E, 10),
        "g2-standard-96": _t("L4", 8, 24, E, 100),
    },
    "azure": {
        "Standard_ND96asr_v4": _t("A100", 8, 40, IB, 1600),
        "Standard_ND96amsr_A100_v4": _t("A100", 8, 80, IB, 1600),
        "Standard_ND96isr_H100_v5": _t("H100", 8, 80, IB, 3200),
        "Standard_ND96isr_H200_v5": _t("H200", 8, 141, IB, 3200),
        "Standard_NC24ads_A100_v4": _t("A100", 1, 80, E, 20),
        "Standard_NC48ads_A100_v4": _t("A100", 2, 80, E, 40),
        "Standard_NC96ads_A100_v4": _t("A100", 4, 80, E, 80),
        "Standard_NC40ads_H100_v5": _t("H100-NVL", 1, 94, E, 40),
        "Standard_NC80adis_H100_v5": _t("H100-NVL", 2, 94, E, 80),
    },
}
"""Provider kind ("aws", "gcp", "azure") -> instance type -> facts."""

_warned: set[tuple[str, str]] = set()


def _kind(provider: str) -> str:
    # The simulated providers mirror the clouds: "sim-aws" uses the "aws" table.
    return provider.removeprefix("sim-")


def facts(provider: str, instance_type: str) -> TypeFacts | None:
    """The table's facts for a type, or None when it is not listed."""
    return CATALOG.get(_kind(provider), {}).get(instance_type)


def interconnect(provider: str, instance_type: str, gpus_per_node: int) -> Interconnect:
    """The scale-out fabric of a type; a conservative Ethernet default when unknown."""
    known = facts(provider, instance_type)
    if known is not None:
        return known.interconnect
    key = (_kind(provider), instance_type)
    if key not in _warned:
        _warned.add(key)
        log.warning(
            "no interconnect facts for %s %s: assuming Ethernet at %g Gbps per node",
            key[0], instance_type, UNKNOWN_NODE_GBPS,
        )
    return Interconnect(Fabric.ETHERNET, UNKNOWN_NODE_GBPS / max(1, gpus_per_node))
