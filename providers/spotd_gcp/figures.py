"""The GCP kind's fixed figures: its name, notice lead, metadata URL and GPU types.

A leaf of the package: it imports none of its siblings, so the descriptor
(:mod:`spotd_gcp.kind`), the settings, the adapter and the notice watcher all read
these from here without importing one another.
"""

from __future__ import annotations

from spotd.core.kinds import InstanceShape
from spotd.core.kinds import instance_shape as _t
from spotd.core.network import Fabric

NAME = "gcp"

NOTICE_SECONDS = 30
"""GCP gives about 30 s between the preemption signal and the hard power-off
(shared/guides/domain.md)."""

METADATA_URL = "http://metadata.google.internal"
"""The GCE metadata server."""

E, ROCE = Fabric.ETHERNET, Fabric.ROCE

INSTANCE_TYPES: dict[str, InstanceShape] = {
    # "GPU machine types" and "A3 / A4 machine series" pages (A3 High:
    # GPUDirect-TCPX 1,000 Gbps; A3 Mega: GPUDirect-TCPXO 1,800 Gbps; A3 Ultra and
    # A4: 3,200 Gbps GPU RDMA over RoCE). A2 figures from public secondary sources.
    # Figures per node, divided by the GPUs of the node.
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
}
"""GPUs and scale-out fabric of the GCE GPU machine types spotd knows."""
