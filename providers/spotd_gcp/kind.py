"""The GCP provider kind: its descriptor, with the figures spotd weighs and their sources.

Its name, notice lead and GPU types live in the leaf :mod:`spotd_gcp.figures`,
which the adapter reads too: nothing the adapter imports imports this module.

Importing this module needs no SDK: google-cloud-compute loads when ``build`` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import BootCarrier, ProviderKind, Sdk

from .figures import INSTANCE_TYPES, METADATA_URL, NAME, NOTICE_SECONDS
from .settings import GcpSettings

if TYPE_CHECKING:
    from spotd.core.contracts import NoticeWatcher, WatcherSettings


def build(settings: GcpSettings, context: ProviderContext) -> BuiltProviders:
    """The GCP provider (loads the SDK), its nodes booted by the daemon's script."""
    from .adapter import build_gcp_provider

    script = context.require_boot_script(NAME)
    return BuiltProviders((build_gcp_provider(settings, startup_script=script),))


def notice_watcher(config: WatcherSettings) -> NoticeWatcher:
    """The metadata server's ``instance/preempted``, long-polled."""
    from .notice import GcpNoticeWatcher

    return GcpNoticeWatcher(
        base_url=config.metadata_base,
        poll_interval=config.poll_interval,
        long_poll_seconds=config.long_poll_seconds,
    )


KIND: ProviderKind[GcpSettings] = ProviderKind(
    name=NAME,
    sdk_loggers=("google", "googleapiclient", "grpc"),
    settings=GcpSettings,
    build=build,
    # google-cloud-compute and -billing: the "gcp" extra of pyproject.toml.
    sdk=Sdk("gcp", ("google.cloud.compute_v1", "google.cloud.billing_v1")),
    # Compute Engine is "billed in one-second increments, with a 1-minute minimum".
    billing_step_seconds=1,
    billing_minimum_seconds=60,
    # Internet egress list price, first tier (~0.12 USD/GB); between regions
    # 0.01-0.02 USD/GB (shared/guides/domain.md).
    egress_usd_per_gb=0.12,
    inter_region_usd_per_gb=0.02,
    notice_seconds=NOTICE_SECONDS,
    # A replacement VM joins the kept VMs' compact placement policy and GPU NICs.
    replaces_gang_nodes=True,
    # The startup-script metadata value: 256 KiB.
    boot=BootCarrier("GCE startup-script", 256 * 1024),
    metadata_url=METADATA_URL,
    # Only used when the long poll fails.
    agent_poll_seconds=1.0,
    instance_types=INSTANCE_TYPES,
    notice_watcher=notice_watcher,
)
"""The descriptor of the ``gcp`` kind (entry point ``spotd.providers: gcp``)."""
