"""The Azure kind's fixed figures: its name, notice lead, metadata URL and GPU types.

A leaf of the package: it imports none of its siblings, so the descriptor
(:mod:`spotd_azure.kind`), the settings, the adapter and the notice watcher all read
these from here without importing one another.
"""

from __future__ import annotations

from spotd.core.kinds import InstanceShape
from spotd.core.kinds import instance_shape as _t
from spotd.core.network import Fabric

NAME = "azure"

NOTICE_SECONDS = 30
"""Azure Scheduled Events give at least 30 s (shared/guides/domain.md)."""

METADATA_URL = "http://169.254.169.254"
"""The Azure Instance Metadata Service."""

E, IB = Fabric.ETHERNET, Fabric.INFINIBAND

INSTANCE_TYPES: dict[str, InstanceShape] = {
    # "ND A100 v4", "ND H100 v5", "ND H200 v5", "NC A100 v4", "NCads H100 v5"
    # size pages (HDR 200 Gb/s or NDR 400 Gb/s InfiniBand per GPU; NC sizes have
    # no InfiniBand). Figures per node, divided by the GPUs of the node.
    "Standard_ND96asr_v4": _t("A100", 8, 40, IB, 1600),
    "Standard_ND96amsr_A100_v4": _t("A100", 8, 80, IB, 1600),
    "Standard_ND96isr_H100_v5": _t("H100", 8, 80, IB, 3200),
    "Standard_ND96isr_H200_v5": _t("H200", 8, 141, IB, 3200),
    "Standard_NC24ads_A100_v4": _t("A100", 1, 80, E, 20),
    "Standard_NC48ads_A100_v4": _t("A100", 2, 80, E, 40),
    "Standard_NC96ads_A100_v4": _t("A100", 4, 80, E, 80),
    "Standard_NC40ads_H100_v5": _t("H100-NVL", 1, 94, E, 40),
    "Standard_NC80adis_H100_v5": _t("H100-NVL", 2, 94, E, 80),
}
"""GPUs and scale-out fabric of the Azure GPU sizes spotd knows."""
