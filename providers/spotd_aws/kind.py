"""The AWS provider kind: its descriptor, with the figures spotd weighs and their sources.

Importing this module needs no SDK: boto3 loads when ``build`` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import BootCarrier, InstanceShape, ProviderKind, Sdk
from spotd.core.kinds import instance_shape as _t
from spotd.core.network import Fabric

from .settings import AwsSettings

if TYPE_CHECKING:
    from spotd.core.contracts import NoticeWatcher, WatcherSettings

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


def build(settings: AwsSettings, context: ProviderContext) -> BuiltProviders:
    """The AWS provider (loads boto3), its nodes booted by the daemon's script."""
    from .adapter import build_aws_provider

    user_data = context.require_boot_script(NAME)
    return BuiltProviders((build_aws_provider(settings, user_data=user_data),))


def notice_watcher(config: WatcherSettings) -> NoticeWatcher:
    """IMDSv2's spot instance-action and rebalance recommendation."""
    from .notice import AwsNoticeWatcher

    return AwsNoticeWatcher(base_url=config.metadata_base, poll_interval=config.poll_interval)


KIND: ProviderKind[AwsSettings] = ProviderKind(
    name=NAME,
    settings=AwsSettings,
    build=build,
    # boto3: the "aws" extra of pyproject.toml, for a missing one's one-line message.
    sdk=Sdk("aws", ("boto3",)),
    # EC2 "per-second billing" for Linux instances, 60 s minimum.
    billing_step_seconds=1,
    billing_minimum_seconds=60,
    # Internet egress list price, first tier (~0.09 USD/GB); between regions
    # 0.01-0.02 USD/GB (shared/guides/domain.md).
    egress_usd_per_gb=0.09,
    inter_region_usd_per_gb=0.02,
    notice_seconds=NOTICE_SECONDS,
    # EC2 user data: 16 KiB, counted before base64.
    boot=BootCarrier("EC2 user data", 16 * 1024),
    metadata_url=METADATA_URL,
    # AWS documents polling the instance action every 5 s.
    agent_poll_seconds=5.0,
    instance_types=INSTANCE_TYPES,
    notice_watcher=notice_watcher,
    # botocore's environment credentials (the key id alone is no secret).
    secret_variables=("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"),
)
"""The descriptor of the ``aws`` kind (entry point ``spotd.providers: aws``)."""
