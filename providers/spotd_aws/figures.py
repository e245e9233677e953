"""The AWS kind's fixed figures: its name, notice lead, metadata URL and GPU types.

A leaf of the package: it imports none of its siblings, so the descriptor
(:mod:`spotd_aws.kind`), the settings, the adapter and the notice watcher all read
these from here without importing one another.
"""

from __future__ import annotations

from spotd.core.kinds import InstanceShape
from spotd.core.kinds import instance_shape as _t
from spotd.core.network import Fabric

NAME = "aws"

NOTICE_SECONDS = 120
"""The spot instance-action notice comes two minutes ahead (shared/guides/domain.md)."""

METADATA_URL = "http://169.254.169.254"
"""IMDS, on every EC2 instance."""

E, EFA = Fabric.ETHERNET, Fabric.EFA

INSTANCE_TYPES: dict[str, InstanceShape] = {
    # "Amazon EC2 accelerated computing instance specifications" (network
    # bandwidth and EFA columns) for P3, P4d/P4de, P5/P5e/P5en, P6-B200, P6-B300
    # (6,400 Gbps EFAv4 per node, 800 per GPU), G5, G6, G6e. Figures per node,
    # divided by the GPUs of the node.
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
}
"""GPUs and scale-out fabric of the EC2 GPU types spotd knows."""
