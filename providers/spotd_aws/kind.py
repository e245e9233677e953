"""The AWS provider kind: its descriptor, with the figures spotd weighs and their sources.

Its name, notice lead and GPU types live in the leaf :mod:`spotd_aws.figures`,
which the adapter reads too: nothing the adapter imports imports this module.

Importing this module needs no SDK: boto3 loads when ``build`` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import BootCarrier, ProviderKind, Sdk

from .figures import INSTANCE_TYPES, METADATA_URL, NAME, NOTICE_SECONDS
from .settings import AwsSettings

if TYPE_CHECKING:
    from spotd.core.contracts import NoticeWatcher, WatcherSettings


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
    sdk_loggers=("botocore", "boto3", "s3transfer"),
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
    # A replacement node joins the kept nodes' placement group with their EFA layout.
    replaces_gang_nodes=True,
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
